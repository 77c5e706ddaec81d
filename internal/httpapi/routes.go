package httpapi

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// headAsGet routes a HEAD request as a GET, since RFC 9110 requires HEAD
// wherever GET is served, with the same status and headers. Handlers still
// see the method sent, and net/http sends no body in answer to a HEAD
// whatever they write. A path served only for other methods answers HEAD
// with 405, so HEAD never reaches an operation that consumes permits, but
// for the one that does with any method, which is served before the router
// (see serveForwardAuth).
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

// Operation labels of the requests that no operation of the spec serves.
const (
	docsOperation    = "docs"    // /docs and its assets
	metricsOperation = "metrics" // /metrics
	// unknownOperation labels requests that match no route, or a route
	// but not their method. They carry no http.route: the path is the
	// client's to choose, and labels must stay few.
	unknownOperation = "unknown"
	// otherMethod stands for every method but the known ones, as
	// OpenTelemetry's HTTP conventions ask, for the same reason.
	otherMethod = "_OTHER"
)

// knownMethods are the methods measured under their own name.
var knownMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
	http.MethodPatch, http.MethodOptions, http.MethodConnect, http.MethodTrace,
}

// unroutedOperations returns what the server measures requests that no
// operation serves as: by route pattern then method, the pattern "" being
// for requests that match no route.
func unroutedOperations(tel *telemetry, metrics bool) map[string]map[string]*operation {
	ops := make(map[string]map[string]*operation)
	add := func(route, id string, methods ...string) {
		byMethod := make(map[string]*operation, len(methods))
		for _, m := range methods {
			op := &operation{id: id, method: m, route: route}
			tel.prepare(op)
			byMethod[m] = op
		}
		ops[route] = byMethod
	}
	add("/docs", docsOperation, http.MethodGet, http.MethodHead)
	add("/docs/*", docsOperation, http.MethodGet, http.MethodHead)
	if metrics {
		add("/metrics", metricsOperation, http.MethodGet, http.MethodHead)
	}
	add("", unknownOperation, append(knownMethods, otherMethod)...)
	return ops
}

// unrouted returns the operation a request that no operation served is
// measured as.
func (s *server) unrouted(r *http.Request) *operation {
	if rctx := chi.RouteContext(r.Context()); rctx != nil {
		if op := s.unroutedOps[rctx.RoutePattern()][r.Method]; op != nil {
			return op
		}
	}
	if op := s.unroutedOps[""][r.Method]; op != nil {
		return op
	}
	return s.unroutedOps[""][otherMethod]
}
