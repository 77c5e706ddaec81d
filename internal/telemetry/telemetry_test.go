package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The tests below change the OpenTelemetry globals and the environment, so
// none of them runs in parallel.

// keptSpans is an in-memory exporter whose spans survive Shutdown, so that a
// test can read what Shutdown flushed.
type keptSpans struct{ *tracetest.InMemoryExporter }

func (keptSpans) Shutdown(context.Context) error { return nil }

func setup(t *testing.T, opts Options) *Telemetry {
	t.Helper()
	if opts.ServiceName == "" {
		opts.ServiceName = "ratelimiter-test"
	}
	tel, err := Setup(t.Context(), opts)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	t.Cleanup(func() {
		if err := tel.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return tel
}

func TestTracingExportsSpans(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	exp := keptSpans{tracetest.NewInMemoryExporter()}
	tel, err := Setup(t.Context(), Options{ServiceName: "ratelimiter", Version: "1.2.3", SpanExporter: exp})
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	if !tel.Tracing {
		t.Errorf("Tracing = false with a span exporter, want true")
	}

	_, span := otel.Tracer("test").Start(t.Context(), "operation")
	if !span.IsRecording() {
		t.Errorf("span is not recording with the default sampler (parentbased_always_on)")
	}
	span.End()
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}

	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("got %d exported spans after Shutdown, want 1", len(spans))
	}
	if got := spans[0].Name; got != "operation" {
		t.Errorf("got span %q, want %q", got, "operation")
	}
	attrs := map[attribute.Key]string{}
	for _, kv := range spans[0].Resource.Attributes() {
		attrs[kv.Key] = kv.Value.Emit()
	}
	for k, want := range map[attribute.Key]string{"service.name": "ratelimiter", "service.version": "1.2.3"} {
		if got := attrs[k]; got != want {
			t.Errorf("resource %s = %q, want %q", k, got, want)
		}
	}
}

func TestTracingOffByDefaultStillPropagates(t *testing.T) {
	for _, value := range []string{"", "none"} {
		t.Run("OTEL_TRACES_EXPORTER="+value, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_EXPORTER", value)
			tel := setup(t, Options{})
			if tel.Tracing {
				t.Errorf("Tracing = true, want false")
			}

			const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
			in := propagation.HeaderCarrier(http.Header{})
			in.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
			ctx := otel.GetTextMapPropagator().Extract(t.Context(), in)
			ctx, span := otel.Tracer("test").Start(ctx, "operation")
			defer span.End()
			if span.IsRecording() {
				t.Errorf("span is recording with tracing off")
			}

			out := propagation.HeaderCarrier(http.Header{})
			otel.GetTextMapPropagator().Inject(ctx, out)
			if got := out.Get("traceparent"); !strings.Contains(got, traceID) {
				t.Errorf("got outgoing traceparent %q, want trace ID %s passed through", got, traceID)
			}
		})
	}
}

func TestSetupErrors(t *testing.T) {
	tests := []struct {
		name     string
		exporter string
		opts     Options
		want     string
	}{
		{name: "unknown exporter", exporter: "zipkin", opts: Options{ServiceName: "x"}, want: "OTEL_TRACES_EXPORTER"},
		{name: "no service name", exporter: "none", opts: Options{}, want: "service name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_EXPORTER", tt.exporter)
			tel, err := Setup(t.Context(), tt.opts)
			if err == nil {
				_ = tel.Shutdown(context.Background())
				t.Fatalf("Setup succeeded, want an error mentioning %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got error %q, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestMetricsScrapedOverHTTP(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	tel := setup(t, Options{})
	srv := httptest.NewServer(tel.Metrics)
	t.Cleanup(srv.Close)

	meter := otel.Meter("test")
	requests, err := meter.Int64Counter("test.requests", metric.WithUnit("{request}"))
	if err != nil {
		t.Fatal(err)
	}
	latency, err := meter.Float64Histogram("test.duration", metric.WithUnit("s"))
	if err != nil {
		t.Fatal(err)
	}
	tenants, entries := int64(7), int64(9)
	if err := tel.ObserveTenants(func() (int64, int64) { return tenants, entries }); err != nil {
		t.Fatalf("ObserveTenants: %v", err)
	}
	var up atomic.Bool
	up.Store(true)
	if err := tel.ObserveBackend("redis", up.Load); err != nil {
		t.Fatalf("ObserveBackend: %v", err)
	}

	requests.Add(t.Context(), 3)
	latency.Record(t.Context(), 0.0003)
	body := scrape(t, srv.URL)
	wantSample(t, body, "test_requests_total", "", "3")
	wantSample(t, body, "ratelimiter_tenants_tracked", "", "7")
	wantSample(t, body, "ratelimiter_tenants_index_entries", "", "9")
	wantSample(t, body, "ratelimiter_backend_up", `backend="redis"`, "1")
	// 300µs falls in the 500µs bucket, not in the 250µs one: sub-millisecond
	// buckets exist.
	wantSample(t, body, `test_duration_seconds_bucket`, `le="0.00025"`, "0")
	wantSample(t, body, `test_duration_seconds_bucket`, `le="0.0005"`, "1")
	if !strings.Contains(body, "go_goroutines") {
		t.Errorf("scrape lacks the Go runtime metrics (go_goroutines)")
	}

	requests.Add(t.Context(), 2)
	tenants = 8
	up.Store(false)
	body = scrape(t, srv.URL)
	wantSample(t, body, "test_requests_total", "", "5")
	wantSample(t, body, "ratelimiter_tenants_tracked", "", "8")
	wantSample(t, body, "ratelimiter_backend_up", `backend="redis"`, "0")
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read /metrics: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: got status %d, want 200", resp.StatusCode)
	}
	return string(body)
}

// wantSample checks that body holds a sample of the metric name, with a
// label text containing label, whose value is want.
func wantSample(t *testing.T, body, name, label, want string) {
	t.Helper()
	for line := range strings.Lines(body) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') || !strings.Contains(rest, label) {
			continue
		}
		fields := strings.Fields(rest)
		if got := fields[len(fields)-1]; got != want {
			t.Errorf("%s %s: got %s, want %s", name, label, got, want)
		}
		return
	}
	t.Errorf("no sample %s %s in the scrape:\n%s", name, label, body)
}

func TestMalformedResourceAttributesAreNotFatal(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "no-equals-sign")
	setup(t, Options{})
}

// TestMaxSeries: an instrument keeps MaxSeries series, or the SDK's 2,000
// when that is more, before it pours the rest into otel_metric_overflow.
func TestMaxSeries(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	for _, tc := range []struct {
		name      string
		maxSeries int
		overflow  bool
	}{
		{"default", 0, true},
		{"below the default", 10, true},
		{"3000", 3000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tel := setup(t, Options{MaxSeries: tc.maxSeries})
			srv := httptest.NewServer(tel.Metrics)
			t.Cleanup(srv.Close)
			c, err := tel.MeterProvider.Meter("test").Int64Counter("test.series")
			if err != nil {
				t.Fatal(err)
			}
			for i := range 2_500 {
				c.Add(t.Context(), 1, metric.WithAttributes(attribute.Int("i", i)))
			}
			if got := strings.Contains(scrape(t, srv.URL), "otel_metric_overflow"); got != tc.overflow {
				t.Errorf("overflow series: got %v, want %v", got, tc.overflow)
			}
		})
	}
}
