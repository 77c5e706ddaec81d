package tenanttest

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// RunSpans checks that a tenant.Service over a backend from newTenants
// traces every decision once, whichever the backend: a child span of the
// caller's recording span per Acquire, Available and Lowest, named and
// attributed as the README promises, with an Error status when the call
// fails; and no span at all under a caller's span that is not recording.
// It records spans in memory through the Service's own TracerProvider, so
// it may run in parallel with other tests.
func RunSpans(t *testing.T, newTenants func(t *testing.T, cfg tenant.Config) Tenants) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			t.Parallel()
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			svc := tenant.NewService(newTenants(t, policy(9, hour, alg)), limiter.ServiceOptions{TracerProvider: tp, Timeout: 10 * time.Second})

			// Without a recording span to hang under, nothing is traced.
			if _, err := svc.Acquire(ctx(t), "203.0.113.9", 1); err != nil {
				t.Fatal(err)
			}
			if got := len(rec.Ended()); got != 0 {
				t.Fatalf("got %d spans without a recording parent, want none", got)
			}

			pctx, parent := tp.Tracer("tenanttest").Start(ctx(t), "server")
			_, err := svc.Acquire(pctx, "203.0.113.7", 2)
			if err == nil {
				_, err = svc.Available(pctx, "203.0.113.7")
			}
			if err == nil {
				_, err = svc.Lowest(pctx, 3)
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := svc.Acquire(pctx, "bad", 1); err == nil {
				t.Fatal("Acquire(bad): got no error")
			}
			if _, err := svc.Available(pctx, "bad"); err == nil {
				t.Fatal("Available(bad): got no error")
			}
			if _, err := svc.Lowest(pctx, 0); err == nil {
				t.Fatal("Lowest(0): got no error")
			}
			parent.End()

			type attrs = map[attribute.Key]attribute.Value
			want := []struct {
				name   string
				attrs  attrs
				status codes.Code
			}{
				{"tenant.Acquire", attrs{
					"ratelimiter.tenant":    attribute.StringValue("203.0.113.7"),
					"ratelimiter.permits":   attribute.Int64Value(2),
					"ratelimiter.allowed":   attribute.BoolValue(true),
					"ratelimiter.remaining": attribute.Int64Value(7),
				}, codes.Unset},
				{"tenant.Available", attrs{
					"ratelimiter.tenant":    attribute.StringValue("203.0.113.7"),
					"ratelimiter.remaining": attribute.Int64Value(7),
				}, codes.Unset},
				{"tenant.Lowest", attrs{
					"ratelimiter.k":       attribute.IntValue(3),
					"ratelimiter.tenants": attribute.IntValue(2),
				}, codes.Unset},
				{"tenant.Acquire", attrs{}, codes.Error},
				{"tenant.Available", attrs{}, codes.Error},
				{"tenant.Lowest", attrs{"ratelimiter.k": attribute.IntValue(0), "ratelimiter.tenants": attribute.IntValue(0)}, codes.Error},
			}
			spans := rec.Ended()
			if len(spans) != len(want)+1 || spans[len(spans)-1].Name() != "server" {
				names := make([]string, len(spans))
				for i, s := range spans {
					names[i] = s.Name()
				}
				t.Fatalf("got spans %q, want one per call (%d) and then the server's", names, len(want))
			}
			for i, w := range want {
				s := spans[i]
				if s.Name() != w.name || s.Status().Code != w.status {
					t.Errorf("span %d: got %q with status %v, want %q with status %v", i, s.Name(), s.Status().Code, w.name, w.status)
				}
				if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
					t.Errorf("span %d (%s): got parent %s in trace %s, want the server span %s in trace %s", i, s.Name(),
						s.Parent().SpanID(), s.SpanContext().TraceID(), parent.SpanContext().SpanID(), parent.SpanContext().TraceID())
				}
				got := attrs{}
				for _, kv := range s.Attributes() {
					got[kv.Key] = kv.Value
				}
				if len(got) != len(w.attrs) {
					t.Errorf("span %d (%s): got attributes %v, want %v", i, s.Name(), s.Attributes(), w.attrs)
				}
				for k, v := range w.attrs {
					if got[k] != v {
						t.Errorf("span %d (%s) attribute %s: got %v, want %v", i, s.Name(), k, got[k].Emit(), v.Emit())
					}
				}
			}
		})
	}
}
