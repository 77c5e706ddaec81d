package httpapi

import (
	"net/http"
	"net/netip"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
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
