// Package httpapi serves the ratelimiter HTTP API described by
// api/openapi.yaml: the strict server generated in internal/gen, implemented
// over the limiter and tenant packages, with request validation against the
// embedded spec, problem+json errors (RFC 9457), the rate-limit headers of
// draft-ietf-httpapi-ratelimit-headers, bearer tokens with scopes (see
// package auth), a server span per request, OpenTelemetry metrics, health
// probes, /metrics and the browsable documentation at /docs.
//
// A request goes through, in order:
//
//  1. observe (chi middleware, every request): measures it, ends its span,
//     logs it, and turns a panic into a 500 problem;
//  2. the generated wrapper, which binds path and query parameters;
//  3. admit (generated-route middleware): bearer token, body size,
//     Content-Type and JSON syntax, then validation against the spec;
//  4. the generated strict handler, which decodes the body, and startSpan
//     (strict middleware), which starts the server span;
//  5. the handlers of this package, which call the domain.
//
// Input that fails 3 never reaches the domain, so it never consumes permits.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/ratelimiter/ratelimiter/api"
	"github.com/ratelimiter/ratelimiter/internal/auth"
	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/ratelimitheader"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// Limiters is the named-limiter service the API serves. It is safe for
// concurrent use; errors wrap the limiter package's sentinel errors.
type Limiters interface {
	Put(ctx context.Context, def limiter.Definition) (created bool, err error)
	Get(ctx context.Context, name string) (limiter.Definition, error)
	List(ctx context.Context, after string, max int) ([]limiter.Definition, error)
	Delete(ctx context.Context, name string) error
	Acquire(ctx context.Context, name string, permits int64) (limiter.Decision, error)
	// AcquireBatch decides acquisitions each on its own, in order; see
	// limiter.Service.AcquireBatch.
	AcquireBatch(ctx context.Context, reqs []limiter.Request, out []limiter.Result) error
	Available(ctx context.Context, name string) (limiter.Availability, error)
	// AcquireKey, AvailableKey and Lowest decide on and list the keys of
	// keyed limiters; see limiter.Service.
	AcquireKey(ctx context.Context, name, key string, permits int64) (limiter.KeyDecision, error)
	AvailableKey(ctx context.Context, name, key string) (limiter.KeyAvailability, error)
	Lowest(ctx context.Context, name string, k int) ([]limiter.KeyEntry, error)
	// Decide decides items together, all or nothing; see
	// limiter.Service.Decide.
	Decide(ctx context.Context, items []limiter.Item, mode limiter.Mode, once string) (limiter.Verdict, error)
	// Reserve and Settle make and settle reservations; see
	// limiter.Service.Reserve and limiter.Service.Settle.
	Reserve(ctx context.Context, items []limiter.Item, ttl time.Duration, once string) (limiter.Verdict, error)
	Settle(ctx context.Context, id string, actual []limiter.Item, once string) (limiter.Verdict, error)
}

// Tenants is the per-IP limiter the API serves. It is safe for concurrent
// use; errors wrap the tenant and limiter packages' sentinel errors.
type Tenants interface {
	Acquire(ctx context.Context, ip string, permits int64) (tenant.Decision, error)
	Available(ctx context.Context, ip string) (tenant.Availability, error)
	Lowest(ctx context.Context, k int) ([]tenant.Entry, error)
	Policy() limiter.Policy
}

var (
	_ Limiters = (*limiter.Service)(nil)
	_ Tenants  = (*tenant.Registry)(nil)
)

// AdminTokenName is the name, in logs, of the token Options.AdminToken
// gives.
const AdminTokenName = "admin-token"

// DefaultMaxBodyBytes is the request body limit when Options.MaxBodyBytes
// is 0.
const DefaultMaxBodyBytes = 64 << 10

// Options configures New. Limiters and Tenants are required; every other
// field has a usable zero value.
type Options struct {
	Limiters Limiters // *limiter.Service satisfies it
	Tenants  Tenants  // *tenant.Registry satisfies it
	// Guard decides who may run which operation (see package auth). Nil:
	// AdminToken, when set, is the one token, with the admin scope; every
	// other scope is open.
	Guard          *auth.Guard
	AdminToken     string               // the admin token when Guard is nil; empty: every scope is open
	MaxBodyBytes   int64                // request body limit; 0 means 64 KiB
	Logger         *slog.Logger         // nil: slog.Default()
	TracerProvider trace.TracerProvider // nil: otel.GetTracerProvider(); a noop.TracerProvider turns tracing off entirely
	MeterProvider  metric.MeterProvider // nil: otel.GetMeterProvider()
	Metrics        http.Handler         // served at GET /metrics when non-nil
	Ready          func() bool          // readiness; false during shutdown; nil: always ready
	// ForwardAuth decides GET /v1/forward-auth (any method); nil answers
	// it 404, as having no rules.
	ForwardAuth *forwardauth.Service
	// MetricsMaxLimiters is how many limiters the decision metrics label
	// by name at once; the decisions of the others are counted under
	// OtherLimiter. A deleted limiter, or one without a decision for an
	// hour, gives its place back. 0 means DefaultMetricsMaxLimiters.
	MetricsMaxLimiters int
}

// New returns the handler of the whole HTTP API. It fails when a required
// option is missing or invalid. The handler is safe for concurrent use.
func New(o Options) (http.Handler, error) {
	return newServer(o, settings{})
}

// settings are knobs for tests only.
type settings struct {
	// kinEverywhere validates every operation with kin-openapi, including
	// the hot ones that the fast validator handles in production. Tests
	// compare both to prove that the fast validator enforces the spec.
	kinEverywhere bool
}

// server implements gen.StrictServerInterface and holds everything a
// request needs.
type server struct {
	limiters Limiters
	tenants  Tenants
	log      *slog.Logger
	ready    func() bool
	maxBody  int64

	guard *auth.Guard // who may run which operation

	router chi.Router
	ops    map[string]map[string]*operation // route pattern -> method -> operation
	byID   map[string]*operation
	params map[string]paramInfo // query and path parameters by name
	// What requests no operation serves are measured as; see unrouted.
	unroutedOps map[string]map[string]*operation
	// forwardAuthHandler serves anyMethodPath ahead of the router.
	forwardAuthHandler http.Handler

	validator func(http.Handler) http.Handler // kin-openapi request validation
	specJSON  map[string]any                  // the spec, for /openapi.json

	tel      *telemetry
	policies policyCache

	tenantPolicy string // RateLimit-Policy of the per-IP limit

	forward *forwardauth.Service // nil without rules

	// Requests answered 503 because the backend was unavailable, the count
	// at the last log record, and the throttle of those records.
	unavailable, unavailableLogged atomic.Int64
	unavailableLog                 rate.Sometimes
}

var _ gen.StrictServerInterface = (*server)(nil)

func newServer(o Options, set settings) (http.Handler, error) {
	if o.Limiters == nil || o.Tenants == nil {
		return nil, errors.New("httpapi: Options.Limiters and Options.Tenants are required")
	}
	if o.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("httpapi: Options.MaxBodyBytes must not be negative, got %d", o.MaxBodyBytes)
	}
	if o.MetricsMaxLimiters < 0 {
		return nil, fmt.Errorf("httpapi: Options.MetricsMaxLimiters must not be negative, got %d", o.MetricsMaxLimiters)
	}
	if o.MetricsMaxLimiters == 0 {
		o.MetricsMaxLimiters = DefaultMetricsMaxLimiters
	}
	s := &server{
		limiters: o.Limiters,
		tenants:  o.Tenants,
		log:      o.Logger,
		ready:    o.Ready,
		maxBody:  o.MaxBodyBytes,
		guard:    o.Guard,
		forward:  o.ForwardAuth,
	}
	s.unavailableLog.Interval = 10 * time.Second
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.ready == nil {
		s.ready = func() bool { return true }
	}
	if s.maxBody == 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	if s.guard == nil {
		var tokens []auth.Token
		if o.AdminToken != "" {
			tokens = append(tokens, auth.NewToken(AdminTokenName, o.AdminToken, auth.Admin))
		}
		s.guard = auth.NewGuard(tokens)
	}

	doc, err := openapi3.NewLoader().LoadFromData(api.Spec)
	if err != nil {
		return nil, fmt.Errorf("httpapi: load the embedded spec: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("httpapi: the embedded spec is invalid: %w", err)
	}
	if s.specJSON, err = specAsJSON(doc); err != nil {
		return nil, err
	}
	tp, mp := o.TracerProvider, o.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if s.tel, err = newTelemetry(tp, mp, o.MetricsMaxLimiters); err != nil {
		return nil, err
	}
	s.ops, s.byID, s.params = operations(doc, s.tel, set)
	s.unroutedOps = unroutedOperations(s.tel, o.Metrics != nil)
	s.validator = newValidator(doc, s)
	s.tenantPolicy = ratelimitheader.Policy(tenantLimiter, o.Tenants.Policy().Period, o.Tenants.Policy().Limit)

	r := chi.NewRouter()
	s.router = r
	r.Use(s.observe, headAsGet)
	r.NotFound(s.notFound)
	r.MethodNotAllowed(s.methodNotAllowed)
	if o.Metrics != nil {
		r.Method(http.MethodGet, "/metrics", o.Metrics)
	}
	docs := s.docsHandler()
	r.Get("/docs", docs.ServeHTTP)
	r.Get("/docs/*", docs.ServeHTTP)

	strict := gen.NewStrictHandlerWithOptions(s, []gen.StrictMiddlewareFunc{s.startSpan}, gen.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  s.requestError,
		ResponseErrorHandlerFunc: s.responseError,
	})
	gen.HandlerWithOptions(strict, gen.ChiServerOptions{
		BaseRouter:       r,
		Middlewares:      []gen.MiddlewareFunc{s.admit},
		ErrorHandlerFunc: s.paramError,
	})
	for _, byMethod := range s.ops {
		for _, op := range byMethod {
			m := routeMethod(op.method)
			if op.route == anyMethodPath {
				m = http.MethodGet // the spec's; ServeHTTP serves every method
			}
			if !r.Match(chi.NewRouteContext(), m, op.example) {
				return nil, fmt.Errorf("httpapi: operation %s (%s %s) is not routed", op.id, op.method, op.route)
			}
		}
	}
	s.forwardAuthHandler = s.observe(http.HandlerFunc(s.serveForwardAuth))
	return s, nil
}

// ServeHTTP serves a proxy's auth subrequest with serveForwardAuth, and
// every other request through the router. A path that chi would route by
// its escaped form (RawPath) is left to the router, which matches no
// route to it, as it would have done.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == anyMethodPath && r.URL.RawPath == "" {
		s.forwardAuthHandler.ServeHTTP(w, r)
		return
	}
	s.router.ServeHTTP(w, r)
}

// specAsJSON converts the spec to the generic JSON value /openapi.json
// serves.
func specAsJSON(doc *openapi3.T) (map[string]any, error) {
	b, err := doc.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("httpapi: convert the spec to JSON: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("httpapi: convert the spec to JSON: %w", err)
	}
	return m, nil
}
