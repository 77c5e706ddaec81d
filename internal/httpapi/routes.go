package httpapi

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// headAsGet routes a HEAD request as a GET, since RFC 9110 requires HEAD
// wherever GET is served, with the same status and headers. Handlers still
// see the method sent, and net/http sends no body in answer to a HEAD
// whatever they write. A path served only for other methods answers HEAD
// with 405, so HEAD never reaches an operation that consumes permits.
func headAsGet(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			if rctx := chi.RouteContext(r.Context()); rctx != nil {
				rctx.RouteMethod = http.MethodGet
			}
		}
		next.ServeHTTP(w, r)
	})
}

// routeMethod is the method the router matches for method m: see
// headAsGet.
func routeMethod(m string) string {
	if m == http.MethodHead {
		return http.MethodGet
	}
	return m
}
