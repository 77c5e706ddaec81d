package httpapi

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ratelimiter/ratelimiter/client"
)

// withTracing records every span, the server's and the domain's, and
// extracts W3C trace context. The domain traces through the global
// provider, so it is set for the length of the test.
func withTracing(t *testing.T) (*tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prevProp := otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		otel.SetTextMapPropagator(prevProp)
		otel.SetTracerProvider(noop.NewTracerProvider())
		_ = tp.Shutdown(context.Background())
	})
	return exp, tp
}

// spanNamed waits for the span, which the server ends once its answer is
// written, and returns it.
func spanNamed(t *testing.T, exp *tracetest.InMemoryExporter, name string) tracetest.SpanStub {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, s := range exp.GetSpans() {
			if s.Name == name {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no span %q among %d", name, len(exp.GetSpans()))
		}
		time.Sleep(time.Millisecond)
	}
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTracing(t *testing.T) {
	exp, tp := withTracing(t)
	e := newEnv(t, func(o *Options) { o.TracerProvider = tp })
	e.put("traced", client.LimiterSpec{Limit: 9, Period: "1m"})
	exp.Reset()

	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	withParent := func(_ context.Context, req *http.Request) error {
		req.Header.Set("traceparent", "00-"+traceID+"-"+spanID+"-01")
		return nil
	}
	res, err := e.c.AcquireWithResponse(ctx, "traced", client.AcquireRequest{Permits: ptr[int64](2)}, withParent)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode() != http.StatusOK {
		t.Fatalf("acquire: got %d %s", res.StatusCode(), res.Body)
	}

	server := spanNamed(t, exp, "acquire")
	if got := server.SpanKind; got != trace.SpanKindServer {
		t.Errorf("kind: got %v, want server", got)
	}
	if got := server.SpanContext.TraceID().String(); got != traceID {
		t.Errorf("trace ID: got %s, want the caller's %s", got, traceID)
	}
	if got := server.Parent.SpanID().String(); got != spanID || !server.Parent.IsRemote() {
		t.Errorf("parent: got %s (remote %v), want the caller's %s", got, server.Parent.IsRemote(), spanID)
	}
	a := attrs(server.Attributes)
	for k, want := range map[attribute.Key]attribute.Value{
		"http.request.method":       attribute.StringValue("POST"),
		"http.route":                attribute.StringValue("/v1/limiters/{name}/acquire"),
		"http.response.status_code": attribute.IntValue(200),
	} {
		if got := a[k]; got != want {
			t.Errorf("server span %s: got %v, want %v", k, got.Emit(), want.Emit())
		}
	}

	child := spanNamed(t, exp, "limiter.Acquire")
	if child.Parent.SpanID() != server.SpanContext.SpanID() || child.SpanContext.TraceID() != server.SpanContext.TraceID() {
		t.Errorf("limiter.Acquire: parent %s, want the server span %s", child.Parent.SpanID(), server.SpanContext.SpanID())
	}
	ca := attrs(child.Attributes)
	if got := ca["ratelimiter.limiter"].AsString(); got != "traced" {
		t.Errorf("limiter.Acquire ratelimiter.limiter: got %q, want traced", got)
	}
	if got := ca["ratelimiter.permits"].AsInt64(); got != 2 {
		t.Errorf("limiter.Acquire ratelimiter.permits: got %d, want 2", got)
	}
	if got := ca["ratelimiter.allowed"]; !got.AsBool() {
		t.Errorf("limiter.Acquire ratelimiter.allowed: got %v, want true", got.Emit())
	}

	// An error answer: the span says which.
	exp.Reset()
	if _, err := e.c.GetLimiterWithResponse(ctx, "missing"); err != nil {
		t.Fatal(err)
	}
	if got := attrs(spanNamed(t, exp, "getLimiter").Attributes)["http.response.status_code"].AsInt64(); got != 404 {
		t.Errorf("getLimiter of a missing limiter: status attribute %d, want 404", got)
	}

	// Without a caller's context the server span is a root.
	exp.Reset()
	if _, err := e.c.GetAvailableWithResponse(ctx, "traced", nil); err != nil {
		t.Fatal(err)
	}
	if root := spanNamed(t, exp, "getAvailable"); root.Parent.IsValid() {
		t.Errorf("getAvailable without traceparent: parent %v, want none", root.Parent)
	}

	// Probes are not traced.
	exp.Reset()
	if _, err := e.c.GetLivenessWithResponse(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.GetTenantPolicyWithResponse(ctx); err != nil {
		t.Fatal(err)
	}
	spanNamed(t, exp, "getTenantPolicy") // the liveness span, if any, ended before it
	for _, s := range exp.GetSpans() {
		if s.Name == "getLiveness" {
			t.Error("getLiveness was traced")
		}
	}
}

// collect reads every metric once.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// sum is the value of a counter at the given attributes.
func sum(t *testing.T, data metricdata.Aggregation, kv ...attribute.KeyValue) int64 {
	t.Helper()
	s, ok := data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("got %T, want an int64 sum", data)
	}
	want := attribute.NewSet(kv...)
	for _, dp := range s.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Value
		}
	}
	return 0
}

// requests is the number of requests the duration histogram counted at
// the given attributes.
func requests(t *testing.T, data metricdata.Aggregation, kv ...attribute.KeyValue) uint64 {
	t.Helper()
	h, ok := data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("got %T, want a float64 histogram", data)
	}
	want := attribute.NewSet(kv...)
	for _, dp := range h.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Count
		}
	}
	return 0
}

func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEnv(t, func(o *Options) { o.MeterProvider = mp })
	e.put("seed", client.LimiterSpec{Limit: 9, Period: "1m"})

	for _, permits := range []int64{5, 5, 10, 4} { // allowed, denied, denied (capacity), allowed
		if _, err := e.c.AcquireWithResponse(ctx, "seed", client.AcquireRequest{Permits: &permits}); err != nil {
			t.Fatal(err)
		}
	}
	e.raw(http.MethodPost, "/v1/limiters/seed/acquire", "application/json", `{"permits":0}`)
	e.raw(http.MethodPost, "/v1/limiters/missing/acquire", "", "")

	m := collect(t, reader)
	seed := attribute.String("limiter", "seed")
	for _, tc := range []struct {
		metric string
		result string
		want   int64
	}{
		{"ratelimiter.decisions", "allowed", 2},
		{"ratelimiter.decisions", "denied", 2},
		{"ratelimiter.permits", "granted", 9},
		{"ratelimiter.permits", "denied", 15},
	} {
		if got := sum(t, m[tc.metric], seed, attribute.String("result", tc.result)); got != tc.want {
			t.Errorf("%s{limiter=seed,result=%s}: got %d, want %d", tc.metric, tc.result, got, tc.want)
		}
	}
	if got := sum(t, m["ratelimiter.decisions"], attribute.String("limiter", "missing"), attribute.String("result", "denied")); got != 0 {
		t.Errorf("decisions of an unknown limiter: got %d, want 0", got)
	}

	route := []attribute.KeyValue{
		attribute.String("http.request.method", "POST"),
		attribute.String("http.route", "/v1/limiters/{name}/acquire"),
		attribute.String("ratelimiter.operation", "acquire"),
	}
	for status, want := range map[int]uint64{200: 4, 400: 1, 404: 1} {
		if got := requests(t, m["http.server.request.duration"], append(route, attribute.Int("http.response.status_code", status))...); got != want {
			t.Errorf("http.server.request.duration{acquire, %d}: got %d requests, want %d", status, got, want)
		}
	}
}

func TestTenantMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEnv(t, func(o *Options) { o.MeterProvider = mp })
	for _, permits := range []int64{60, 60} { // allowed, denied
		if _, err := e.c.AcquireTenantWithResponse(ctx, "203.0.113.7", client.AcquireRequest{Permits: &permits}); err != nil {
			t.Fatal(err)
		}
	}
	m := collect(t, reader)
	tenant := attribute.String("limiter", TenantLimiter)
	for _, tc := range []struct {
		metric, result string
		want           int64
	}{
		{"ratelimiter.decisions", "allowed", 1},
		{"ratelimiter.decisions", "denied", 1},
		{"ratelimiter.permits", "granted", 60},
		{"ratelimiter.permits", "denied", 60},
	} {
		if got := sum(t, m[tc.metric], tenant, attribute.String("result", tc.result)); got != tc.want {
			t.Errorf("%s{limiter=%s,result=%s}: got %d, want %d", tc.metric, TenantLimiter, tc.result, got, tc.want)
		}
	}
}

// TestTenantMetricsApartFromALimiterNamedTenant: the per-IP decisions
// and those of a limiter named tenant are counted in series of their own,
// and deleting the limiter drops its series only.
func TestTenantMetricsApartFromALimiterNamedTenant(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEnv(t, func(o *Options) { o.MeterProvider = mp })
	e.put("tenant", client.LimiterSpec{Limit: 9, Period: "1m"})
	for _, permits := range []int64{2, 3} {
		if res, err := e.c.AcquireWithResponse(ctx, "tenant", client.AcquireRequest{Permits: &permits}); err != nil || res.JSON200 == nil {
			t.Fatalf("acquire of the limiter tenant: %v", err)
		}
	}
	permits := int64(7)
	if res, err := e.c.AcquireTenantWithResponse(ctx, "203.0.113.7", client.AcquireRequest{Permits: &permits}); err != nil || res.JSON200 == nil {
		t.Fatalf("acquire of a tenant: %v", err)
	}

	allowed, granted := attribute.String("result", "allowed"), attribute.String("result", "granted")
	check := func(m map[string]metricdata.Aggregation, label string, decisions, permits int64) {
		t.Helper()
		if got := sum(t, m["ratelimiter.decisions"], attribute.String("limiter", label), allowed); got != decisions {
			t.Errorf("decisions{limiter=%s}: got %d, want %d", label, got, decisions)
		}
		if got := sum(t, m["ratelimiter.permits"], attribute.String("limiter", label), granted); got != permits {
			t.Errorf("permits{limiter=%s}: got %d, want %d", label, got, permits)
		}
	}
	m := collect(t, reader)
	check(m, "tenant", 2, 5)
	check(m, TenantLimiter, 1, 7)

	if res, _ := e.raw(http.MethodDelete, "/v1/limiters/tenant", "", ""); res.StatusCode != http.StatusNoContent {
		t.Fatalf("delete tenant: status %d", res.StatusCode)
	}
	m = collect(t, reader)
	if names, _ := labels(t, m["ratelimiter.decisions"]); !slices.Equal(names, []string{TenantLimiter}) {
		t.Errorf("limiter labels after deleting the limiter tenant: got %q, want %q", names, []string{TenantLimiter})
	}
	check(m, TenantLimiter, 1, 7)
}
