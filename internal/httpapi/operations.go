package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimiter/ratelimiter/internal/auth"
)

// operation is what the server knows of one operation of the spec. It is
// built once by New and read-only afterwards.
type operation struct {
	id      string
	method  string
	route   string     // the spec's path template, which is chi's route pattern too
	example string     // a path the route matches, to check the routing
	scope   auth.Scope // a token must hold one of these scopes, unless one is open; none: open to all
	body    bool       // declares a request body
	once    bool       // declares the Idempotency-Key header
	fast    fastKind
	traced  bool // gets a server span (health probes don't)

	startOpts []trace.SpanStartOption
	durations map[int][]metric.RecordOption // by status code
	attrs     []attribute.KeyValue          // duration attributes but the status
}

// fastKind names the hand-written validator of a hot operation; see
// validateFast. Every other operation is validated by kin-openapi.
type fastKind uint8

const (
	fastNone    fastKind = iota
	fastLimiter          // a limiter name in the path
	fastTenant           // an IP address in the path
	fastBatch            // a BatchAcquireRequest body
	fastDecide           // a DecideRequest body, and an Idempotency-Key where declared
)

// fastOperations are the hot operations. kin-openapi nearly doubles what
// the handler spends on one of them (BenchmarkAcquireHTTP, fast against
// kin), so they are validated by hand instead, and
// TestFastValidationAgreesWithSpec checks that both validations agree.
var fastOperations = map[string]fastKind{
	"acquire":            fastLimiter,
	"getAvailable":       fastLimiter,
	"acquireTenant":      fastTenant,
	"getTenantAvailable": fastTenant,
	"acquireBatch":       fastBatch,
	"decide":             fastDecide,
	"peek":               fastDecide,
	"charge":             fastDecide,
	"refund":             fastDecide,
}

// anyMethodPath is the path of the forwardAuth operation, a GET in the
// spec, which serveForwardAuth serves whatever the method, before the
// router (see ServeHTTP).
const anyMethodPath = "/v1/forward-auth"

// untraced operations get no server span: probes would drown the traces.
var untraced = map[string]bool{"getLiveness": true, "getReadiness": true}

// paramInfo tells how to report a parameter the generated code cannot bind.
type paramInfo struct {
	in   string
	want string // what a valid value looks like
}

// operations indexes the operations of doc by route and method, and by id,
// and describes its parameters.
func operations(doc *openapi3.T, tel *telemetry, set settings) (map[string]map[string]*operation, map[string]*operation, map[string]paramInfo) {
	byRoute := make(map[string]map[string]*operation)
	byID := make(map[string]*operation)
	params := make(map[string]paramInfo)
	describe := func(ps openapi3.Parameters) {
		for _, p := range ps {
			params[p.Value.Name] = paramInfo{in: p.Value.In, want: expectation(p.Value.Schema.Value)}
		}
	}
	for route, item := range doc.Paths.Map() {
		describe(item.Parameters)
		for method, o := range item.Operations() {
			describe(o.Parameters)
			once := false
			for _, p := range o.Parameters {
				once = once || p.Value.In == openapi3.ParameterInHeader && p.Value.Name == hdrIdempotencyKey
			}
			op := &operation{
				id:      o.OperationID,
				method:  method,
				route:   route,
				example: examplePath(route),
				body:    o.RequestBody != nil,
				once:    once,
				traced:  !untraced[o.OperationID],
			}
			op.scope, _ = auth.Required(op.id)
			if !set.kinEverywhere {
				op.fast = fastOperations[o.OperationID]
			}
			tel.prepare(op)
			if byRoute[route] == nil {
				byRoute[route] = make(map[string]*operation)
			}
			byRoute[route][method] = op
			byID[op.id] = op
			if method == http.MethodGet {
				// HEAD is served wherever GET is (see headAsGet), and every
				// method where any is (see anyMethod): the same operation,
				// measured under its own method.
				also := []string{http.MethodHead}
				if route == anyMethodPath {
					also = append(knownMethods, otherMethod)
				}
				for _, m := range also {
					if m == http.MethodGet {
						continue
					}
					alias := *op
					alias.method = m
					tel.prepare(&alias)
					byRoute[route][m] = &alias
				}
			}
		}
	}
	return byRoute, byID, params
}

// expectation describes the values a schema accepts, for error messages.
func expectation(s *openapi3.Schema) string {
	switch {
	case s.Type.Is("integer") && s.Min != nil && s.Max != nil:
		return fmt.Sprintf("must be an integer from %d to %d", int64(*s.Min), int64(*s.Max))
	case s.Type.Is("integer"):
		return "must be an integer"
	default:
		return "is invalid"
	}
}

// examplePath fills the parameters of a route with valid values.
func examplePath(route string) string {
	return strings.NewReplacer("{name}", "x", "{ip}", "192.0.2.1").Replace(route)
}

// operationOf returns the operation chi routed r to, or nil.
func (s *server) operationOf(r *http.Request) *operation {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil {
		return nil
	}
	byMethod := s.ops[rctx.RoutePattern()]
	if op := byMethod[r.Method]; op != nil {
		return op
	}
	return byMethod[otherMethod] // on anyMethodPath only
}

// pathParam returns the unescaped value of a path parameter.
func pathParam(r *http.Request, name string) string {
	v := chi.URLParam(r, name)
	if r.URL.RawPath != "" {
		if u, err := url.PathUnescape(v); err == nil {
			return u
		}
	}
	return v
}
