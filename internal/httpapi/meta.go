package httpapi

import (
	"bytes"
	"context"
	_ "embed"
	"net/http"

	"github.com/swaggest/swgui/v5/static"
	"github.com/vearutop/statigz"

	"github.com/ratelimiter/ratelimiter/api"
	"github.com/ratelimiter/ratelimiter/internal/gen"
)

// GetLiveness answers while the process serves requests.
func (s *server) GetLiveness(context.Context, gen.GetLivenessRequestObject) (gen.GetLivenessResponseObject, error) {
	return gen.GetLiveness200JSONResponse{Status: gen.HealthStatusOk}, nil
}

// GetReadiness answers whether the server takes traffic, and names the
// scopes no token guards: a probe's answer is where an operator looks.
func (s *server) GetReadiness(context.Context, gen.GetReadinessRequestObject) (gen.GetReadinessResponseObject, error) {
	if !s.ready() {
		return nil, &problem{status: http.StatusServiceUnavailable, detail: "The server is not ready."}
	}
	h := gen.Health{Status: gen.HealthStatusOk}
	if open := s.guard.Open().Names(); len(open) > 0 {
		scopes := make([]gen.HealthOpenScopes, len(open))
		for i, n := range open {
			scopes[i] = gen.HealthOpenScopes(n)
		}
		h.OpenScopes = &scopes
	}
	return gen.GetReadiness200JSONResponse(h), nil
}

// GetOpenAPI serves the embedded spec.
func (s *server) GetOpenAPI(context.Context, gen.GetOpenAPIRequestObject) (gen.GetOpenAPIResponseObject, error) {
	return gen.GetOpenAPI200ApplicationYamlResponse{Body: bytes.NewReader(api.Spec), ContentLength: int64(len(api.Spec))}, nil
}

// GetOpenAPIJSON serves the embedded spec as JSON.
func (s *server) GetOpenAPIJSON(context.Context, gen.GetOpenAPIJSONRequestObject) (gen.GetOpenAPIJSONResponseObject, error) {
	return gen.GetOpenAPIJSON200JSONResponse(s.specJSON), nil
}

// docsPage is the Swagger UI page at /docs, pointed at the embedded spec.
//
//go:embed docs.html
var docsPage []byte

// docsHandler serves Swagger UI at /docs, with its assets embedded in the
// binary: the page works without reaching any other host. The page is a
// fixed file rather than swgui's template: html/template in the binary
// keeps every method of every type alive for reflection, which alone made
// the image 10 MB larger. A missing asset is a 404 problem, as every other
// error of the API.
func (s *server) docsHandler() http.Handler {
	files := statigz.FileServer(static.FS, statigz.OnError(func(w http.ResponseWriter, r *http.Request, err error) {
		s.writeProblem(w, r, s.problemFor(r, err))
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/docs":
			http.Redirect(w, r, "/docs/", http.StatusMovedPermanently)
		case "/docs/", "/docs/index.html":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write(docsPage)
		default:
			if r.Method == http.MethodHead {
				// statigz answers HEAD with fewer headers than GET
				// (no Accept-Ranges): serve it the GET, whose body
				// net/http leaves out.
				r = r.Clone(r.Context())
				r.Method = http.MethodGet
			}
			http.StripPrefix("/docs/", http.HandlerFunc(func(w http.ResponseWriter, file *http.Request) {
				if !files.Found(file) { // statigz would answer in text/plain
					s.notFound(w, r)
					return
				}
				files.ServeHTTP(w, file)
			})).ServeHTTP(w, r)
		}
	})
}
