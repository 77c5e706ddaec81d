package httpapi

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// TestForwardAuthBypassesTheRouter checks that an auth subrequest, which
// serveForwardAuth answers before the router, is decided, measured and
// traced as the forwardAuth operation of its method, whatever the method,
// and that a path the router would not route to it is still not served.
func TestForwardAuthBypassesTheRouter(t *testing.T) {
	exp, tp := withTracing(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := forwardauth.Config{
		Rules:      []forwardauth.Rule{{Limiter: "per-ip", Key: forwardauth.ByClientIP, Permits: 1}},
		DenyStatus: http.StatusTooManyRequests,
		IPv6Prefix: 64,
		ClientIP:   forwardauth.ClientIP{Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}},
	}
	e := newEnv(t, func(o *Options) {
		o.TracerProvider, o.MeterProvider = tp, mp
		o.ForwardAuth = forwardauth.NewService(cfg, o.Limiters, false)
	})
	keyed := true
	e.put("per-ip", client.LimiterSpec{Limit: 3, Period: "1m", Keyed: &keyed})
	def, err := e.limiters.Get(ctx, "per-ip")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Check(map[string]limiter.Definition{"per-ip": def}); err != nil {
		t.Fatal(err)
	}
	exp.Reset()

	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	// Three permits for 203.0.113.7, taken by three methods, the last one
	// unknown to net/http and sent with a body; the fourth request is
	// denied. Another client is not.
	for i, tc := range []struct {
		method, client string
		body           string
		want           int
	}{
		{http.MethodGet, "203.0.113.7", "", http.StatusOK},
		{http.MethodPost, "203.0.113.7", "", http.StatusOK},
		{"PURGE", "203.0.113.7", `{"ignored":true}`, http.StatusOK},
		{http.MethodGet, "203.0.113.7", "", http.StatusTooManyRequests},
		{http.MethodGet, "198.51.100.1", "", http.StatusOK},
	} {
		res, body := e.raw(tc.method, anyMethodPath, "", tc.body,
			"X-Forwarded-For", "192.0.2.99, "+tc.client, "X-Original-Uri", "/page", "traceparent", "00-"+traceID+"-"+spanID+"-01")
		if res.StatusCode != tc.want {
			t.Fatalf("request %d (%s from %s): got %d %s, want %d", i+1, tc.method, tc.client, res.StatusCode, body, tc.want)
		}
		if res.Header.Get(hdrRateLimit) == "" || res.Header.Get(hdrPolicy) == "" {
			t.Errorf("request %d: no RateLimit headers: %v", i+1, res.Header)
		}
		if tc.want == http.StatusTooManyRequests && (res.Header.Get(hdrRetryAfter) == "" || res.Header.Get("Content-Type") != problemJSON) {
			t.Errorf("request %d: a denial without Retry-After or a problem: %v %s", i+1, res.Header, body)
		}
	}
	for ip, want := range map[string]int64{"203.0.113.7": 0, "198.51.100.1": 2} {
		res, err := e.c.GetAvailableWithResponse(ctx, "per-ip", &client.GetAvailableParams{Key: &ip})
		if err != nil || res.JSON200 == nil {
			t.Fatalf("available %s: %v %v", ip, err, res)
		}
		if got := res.JSON200.Remaining; got != want {
			t.Errorf("available to %s: got %d, want %d", ip, got, want)
		}
	}

	// Each request has its server span, named for the operation and a
	// child of the proxy's context, with the decision's span under it.
	server := spanNamed(t, exp, "forwardAuth")
	if got := server.SpanContext.TraceID().String(); got != traceID || server.Parent.SpanID().String() != spanID {
		t.Errorf("forwardAuth span: trace %s parent %s, want %s and %s", got, server.Parent.SpanID(), traceID, spanID)
	}
	if got := attrs(server.Attributes)["http.route"].AsString(); got != anyMethodPath {
		t.Errorf("forwardAuth span http.route: got %q, want %q", got, anyMethodPath)
	}
	decide := spanNamed(t, exp, "limiter.Decide")
	if decide.SpanContext.TraceID().String() != traceID || !decide.Parent.IsValid() || decide.Parent.IsRemote() {
		t.Errorf("limiter.Decide: trace %s parent %v, want a child of a forwardAuth span", decide.SpanContext.TraceID(), decide.Parent)
	}
	spans := 0
	for _, s := range exp.GetSpans() {
		if s.Name == "forwardAuth" {
			spans++
		}
	}
	if spans != 5 {
		t.Errorf("forwardAuth spans: got %d, want 5", spans)
	}

	m := collect(t, reader)
	for _, tc := range []struct {
		method string
		status int
		want   uint64
	}{
		{"GET", 200, 2}, {"GET", 429, 1}, {"POST", 200, 1}, {otherMethod, 200, 1},
	} {
		got := requests(t, m["http.server.request.duration"],
			attribute.String("http.request.method", tc.method),
			attribute.String("http.route", anyMethodPath),
			attribute.String("ratelimiter.operation", "forwardAuth"),
			attribute.Int("http.response.status_code", tc.status))
		if got != tc.want {
			t.Errorf("http.server.request.duration{forwardAuth, %s, %d}: got %d requests, want %d", tc.method, tc.status, got, tc.want)
		}
	}

	// The router matches paths as sent: an escaped one is not the route.
	res, body := e.raw(http.MethodGet, "/v1/forward%2Dauth", "", "")
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("GET /v1/forward%%2Dauth: got %d %s, want 404", res.StatusCode, body)
	}
}

// newForwardEnv starts a server whose forward-auth endpoint decides by
// cfg (the test, at 127.0.0.1, its trusted proxy) over limiters, nil for
// the memory store, answering a decision that fails by failOpen.
func newForwardEnv(t *testing.T, cfg forwardauth.Config, limiters *limiter.Service, failOpen bool) *env {
	t.Helper()
	cfg.IPv6Prefix = 64
	cfg.ClientIP = forwardauth.ClientIP{Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	return newEnv(t, func(o *Options) {
		if limiters != nil {
			o.Limiters = limiters
		}
		o.ForwardAuth = forwardauth.NewService(cfg, o.Limiters, failOpen)
	})
}

// forwardAuth asks e's endpoint about a request, as a proxy does: with
// method, Host host (the server's address when empty) and the headers
// header, names and values in turn.
func (e *env) forwardAuth(method, host string, header ...string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+anyMethodPath, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return res, b
}

// policyNames lists the limiters a RateLimit-Policy value names, in order.
func policyNames(policy string) []string {
	var names []string
	for item := range strings.SplitSeq(policy, ", ") {
		if name, _, ok := strings.Cut(strings.TrimPrefix(item, `"`), `"`); ok {
			names = append(names, name)
		}
	}
	return names
}

// TestForwardAuthHeaderPrecedence checks which header tells the original
// request, by the rules a request is charged under: X-Forwarded-Method
// over X-Original-Method over the request's own method, X-Forwarded-Host
// over Host (its port ignored), X-Forwarded-Uri over X-Original-URI, and
// the path without its query.
func TestForwardAuthHeaderPrecedence(t *testing.T) {
	cfg := forwardauth.Config{DenyStatus: http.StatusTooManyRequests, Rules: []forwardauth.Rule{
		{Limiter: "deletes", Key: forwardauth.ByRoute, Methods: []string{http.MethodDelete}, Permits: 1},
		{Limiter: "api-host", Key: forwardauth.ByRoute, Host: "api.example.com", Permits: 1},
		{Limiter: "admin", Key: forwardauth.ByRoute, PathPrefix: "/admin", Permits: 1},
		{Limiter: "search", Key: forwardauth.ByRoute, PathPrefix: "/search/", Permits: 1},
	}}
	e := newForwardEnv(t, cfg, nil, false)
	group := "edge"
	for _, r := range cfg.Rules {
		e.put(r.Limiter, client.LimiterSpec{Limit: 1000, Period: "1h", Group: &group})
	}

	const host = "www.example.com"
	tests := []struct {
		name, method, host string
		header             []string
		want               []string
	}{
		{"X-Forwarded-Method over X-Original-Method", http.MethodGet, host,
			[]string{"X-Forwarded-Method", "DELETE", "X-Original-Method", "GET", "X-Forwarded-Uri", "/"}, []string{"deletes"}},
		{"X-Forwarded-Method over X-Original-Method, the other way", http.MethodDelete, host,
			[]string{"X-Forwarded-Method", "GET", "X-Original-Method", "DELETE", "X-Forwarded-Uri", "/"}, nil},
		{"X-Original-Method over the request's method", http.MethodGet, host,
			[]string{"X-Original-Method", "DELETE", "X-Forwarded-Uri", "/"}, []string{"deletes"}},
		{"X-Original-Method over the request's method, the other way", http.MethodDelete, host,
			[]string{"X-Original-Method", "GET", "X-Forwarded-Uri", "/"}, nil},
		{"the request's method without either", http.MethodDelete, host,
			[]string{"X-Forwarded-Uri", "/"}, []string{"deletes"}},
		{"X-Forwarded-Host over Host", http.MethodGet, host,
			[]string{"X-Forwarded-Host", "api.example.com", "X-Forwarded-Uri", "/"}, []string{"api-host"}},
		{"X-Forwarded-Host over Host, the other way", http.MethodGet, "api.example.com",
			[]string{"X-Forwarded-Host", host, "X-Forwarded-Uri", "/"}, nil},
		{"Host without X-Forwarded-Host, its port ignored", http.MethodGet, "api.example.com:8443",
			[]string{"X-Forwarded-Uri", "/"}, []string{"api-host"}},
		{"X-Forwarded-Uri over X-Original-URI", http.MethodGet, host,
			[]string{"X-Forwarded-Uri", "/admin/users", "X-Original-URI", "/"}, []string{"admin"}},
		{"X-Forwarded-Uri over X-Original-URI, the other way", http.MethodGet, host,
			[]string{"X-Forwarded-Uri", "/", "X-Original-URI", "/admin/users"}, nil},
		{"X-Original-URI without X-Forwarded-Uri", http.MethodGet, host,
			[]string{"X-Original-URI", "/admin/users"}, []string{"admin"}},
		{"the query is not part of the path", http.MethodGet, host,
			[]string{"X-Forwarded-Uri", "/search?/x"}, nil},
		{"the path as the upstream routes it", http.MethodGet, host,
			[]string{"X-Forwarded-Uri", "/%73earch//x;p/y"}, []string{"search"}},
		{"an undecodable escape leaves the others decoded", http.MethodGet, host,
			[]string{"X-Forwarded-Uri", "/%61dmin/x%zz"}, []string{"admin"}},
		{"the path's case ignored", http.MethodGet, host,
			[]string{"X-Forwarded-Uri", "/ADMIN/users"}, []string{"admin"}},
		{"the method's case ignored", http.MethodGet, host,
			[]string{"X-Forwarded-Method", "delete", "X-Forwarded-Uri", "/"}, []string{"deletes"}},
		{"a query after a matching path", http.MethodGet, host,
			[]string{"X-Forwarded-Uri", "/admin?next=/"}, []string{"admin"}},
		{"everything at once", http.MethodPost, host,
			[]string{"X-Forwarded-Method", "DELETE", "X-Forwarded-Host", "API.example.com", "X-Forwarded-Uri", "/admin"},
			[]string{"deletes", "api-host", "admin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, body := e.forwardAuth(tt.method, tt.host, tt.header...)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("got %d %s, want 200", res.StatusCode, body)
			}
			if got := policyNames(res.Header.Get(hdrPolicy)); !slices.Equal(got, tt.want) {
				t.Errorf("charged %q (RateLimit-Policy %q), want %q", got, res.Header.Get(hdrPolicy), tt.want)
			}
		})
	}
}

// TestForwardAuthDenialsWaitingDoesNotEnd checks that a denial no wait
// ends still has the Retry-After every denial has, 1, the least it can
// say: a request whose path is refused, one no rule matches, with
// unmatched requests denied, and one
// whose rule asks more than its limiter can ever hold, as a limiter
// changed after start-up can.
func TestForwardAuthDenialsWaitingDoesNotEnd(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusForbidden} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			cfg := forwardauth.Config{DenyStatus: status, DenyUnmatched: true, Rules: []forwardauth.Rule{
				{Limiter: "uploads", Key: forwardauth.ByRoute, PathPrefix: "/upload", Permits: 5},
			}}
			e := newForwardEnv(t, cfg, nil, false)
			e.put("uploads", client.LimiterSpec{Limit: 2, Period: "1m"})
			for _, tc := range []struct {
				name, uri, detail string
			}{
				{"no rule matches", "/page", "No forward_auth rule matches"},
				{"a rule asks more than its limiter holds", "/upload", "waiting will not help"},
				{"a path with a dot segment", "/upload/../page", "path is refused"},
				{"a path with an encoded dot segment", "/page/%2e%2e/upload", "path is refused"},
			} {
				res, body := e.forwardAuth(http.MethodGet, "", "X-Forwarded-Uri", tc.uri)
				if res.StatusCode != status {
					t.Fatalf("%s: got %d %s, want %d", tc.name, res.StatusCode, body, status)
				}
				if got := res.Header.Get(hdrRetryAfter); got != "1" {
					t.Errorf("%s: Retry-After: got %q, want 1", tc.name, got)
				}
				if status == http.StatusForbidden {
					if len(body) != 0 {
						t.Errorf("%s: a 403 with a body: %s", tc.name, body)
					}
					continue
				}
				if p := checkProblem(t, res, body, status); !strings.Contains(*p.Detail, tc.detail) {
					t.Errorf("%s: detail %q, want it to say %q", tc.name, *p.Detail, tc.detail)
				}
			}
		})
	}
}

// downDecisions is a limiter store whose backend does not answer
// decisions.
type downDecisions struct{ limiter.Store }

func (downDecisions) Decide(context.Context, []limiter.Item, limiter.Mode, string) (limiter.Verdict, error) {
	return limiter.Verdict{}, errDown
}

// TestForwardAuthFailureMode checks the answers made without a decision,
// whether the backend is down (the limiter service's failure mode) or the
// decision fails otherwise (the forward-auth service's, here a rule's
// limiter deleted): fail-open passes the request with
// Ratelimiter-Degraded: true, fail-closed denies it with the deny status,
// Ratelimiter-Degraded: true and Retry-After: 1; neither has RateLimit
// headers, which would describe limits nobody checked.
func TestForwardAuthFailureMode(t *testing.T) {
	causes := []struct {
		name  string
		store func(*clock) limiter.Store
	}{
		{"backend down", func(c *clock) limiter.Store { return downDecisions{memory.New(c.Limiter(), 0)} }},
		{"limiter missing", func(c *clock) limiter.Store { return memory.New(c.Limiter(), 0) }},
	}
	for _, mode := range []limiter.FailureMode{limiter.FailOpen, limiter.FailClosed} {
		for _, status := range []int{http.StatusTooManyRequests, http.StatusForbidden} {
			for _, cause := range causes {
				t.Run(mode.String()+"/"+http.StatusText(status)+"/"+cause.name, func(t *testing.T) {
					cfg := forwardauth.Config{DenyStatus: status, Rules: []forwardauth.Rule{
						{Limiter: "per-ip", Key: forwardauth.ByClientIP, Permits: 1},
					}}
					limiters := limiter.NewServiceWith(cause.store(newClock()), limiter.ServiceOptions{FailureMode: mode})
					e := newForwardEnv(t, cfg, limiters, mode == limiter.FailOpen)
					if cause.name == "backend down" {
						keyed := true
						e.put("per-ip", client.LimiterSpec{Limit: 5, Period: "1m", Keyed: &keyed})
					}
					res, body := e.forwardAuth(http.MethodGet, "", "X-Forwarded-For", "203.0.113.7", "X-Forwarded-Uri", "/")
					if got := res.Header.Get(hdrDegraded); got != "true" {
						t.Errorf("%s: got %q, want true", hdrDegraded, got)
					}
					for _, h := range []string{hdrRateLimit, hdrPolicy} {
						if v := res.Header.Get(h); v != "" {
							t.Errorf("%s: got %q, want none on an answer made without the limits", h, v)
						}
					}
					switch {
					case mode == limiter.FailOpen:
						if res.StatusCode != http.StatusOK || len(body) != 0 || res.Header.Get(hdrRetryAfter) != "" {
							t.Errorf("got %d, Retry-After %q, body %q; want 200 with neither", res.StatusCode, res.Header.Get(hdrRetryAfter), body)
						}
					case res.StatusCode != status:
						t.Errorf("got %d %s, want %d", res.StatusCode, body, status)
					case res.Header.Get(hdrRetryAfter) != "1":
						t.Errorf("Retry-After: got %q, want 1", res.Header.Get(hdrRetryAfter))
					case status == http.StatusForbidden:
						if len(body) != 0 {
							t.Errorf("a 403 with a body: %s", body)
						}
					default:
						if p := checkProblem(t, res, body, status); !strings.Contains(*p.Detail, "fail-closed") {
							t.Errorf("detail %q, want it to name fail-closed", *p.Detail)
						}
					}
				})
			}
		}
	}
}
