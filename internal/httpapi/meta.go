package httpapi

import (
	"bytes"
	"context"
	"net/http"

	"github.com/swaggest/swgui"
	"github.com/swaggest/swgui/v5emb"

	"github.com/ratelimiter/ratelimiter/api"
	"github.com/ratelimiter/ratelimiter/internal/gen"
)

// GetLiveness answers while the process serves requests.
func (s *server) GetLiveness(context.Context, gen.GetLivenessRequestObject) (gen.GetLivenessResponseObject, error) {
	return gen.GetLiveness200JSONResponse{Status: gen.HealthStatusOk}, nil
}

// GetReadiness answers whether the server takes traffic.
func (s *server) GetReadiness(context.Context, gen.GetReadinessRequestObject) (gen.GetReadinessResponseObject, error) {
	if !s.ready() {
		return nil, &problem{status: http.StatusServiceUnavailable, detail: "The server is not ready."}
	}
	return gen.GetReadiness200JSONResponse{Status: gen.HealthStatusOk}, nil
}

// GetOpenAPI serves the embedded spec.
func (s *server) GetOpenAPI(context.Context, gen.GetOpenAPIRequestObject) (gen.GetOpenAPIResponseObject, error) {
	return gen.GetOpenAPI200ApplicationYamlResponse{Body: bytes.NewReader(api.Spec), ContentLength: int64(len(api.Spec))}, nil
}

// GetOpenAPIJSON serves the embedded spec as JSON.
func (s *server) GetOpenAPIJSON(context.Context, gen.GetOpenAPIJSONRequestObject) (gen.GetOpenAPIJSONResponseObject, error) {
	return gen.GetOpenAPIJSON200JSONResponse(s.specJSON), nil
}

// docsHandler serves Swagger UI at /docs, with its assets embedded in the
// binary: the page works without reaching any other host.
func docsHandler() http.Handler {
	return v5emb.NewHandlerWithConfig(swgui.Config{
		Title:       "ratelimiter API",
		SwaggerJSON: "/openapi.yaml",
		BasePath:    "/docs/",
		SettingsUI: map[string]string{
			// Show the schemas too, and let people try the API from the page.
			"defaultModelsExpandDepth": "1",
			"tryItOutEnabled":          "true",
		},
	})
}
