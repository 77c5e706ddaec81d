package tenant_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// downBackend is a Backend whose store is down; it still names tenants, as
// the real backends do without consulting any state.
type downBackend struct{ *tenant.Registry }

var errDown = fmt.Errorf("%w: connection refused", limiter.ErrUnavailable)

func (downBackend) Acquire(context.Context, string, int64) (tenant.Decision, error) {
	return tenant.Decision{}, errDown
}

func (downBackend) Available(context.Context, string) (tenant.Availability, error) {
	return tenant.Availability{}, errDown
}

func (downBackend) Lowest(context.Context, int) ([]tenant.Entry, error) { return nil, errDown }

func TestServiceFailureModes(t *testing.T) {
	reg, err := tenant.New(tenant.Config{Policy: limiter.Policy{Limit: 10, Period: time.Minute}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []limiter.FailureMode{limiter.FailClosed, limiter.FailOpen} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			reported := 0
			svc := tenant.NewService(downBackend{reg}, limiter.ServiceOptions{
				FailureMode: mode, OnUnavailable: func(error) { reported++ },
			})
			d, err := svc.Acquire(context.Background(), "2001:db8::1", 2)
			if err != nil {
				t.Fatalf("Acquire: %v, want a degraded decision", err)
			}
			want := tenant.Decision{Tenant: "2001:db8::/64", Decision: limiter.Degraded(2, mode)}
			if d != want {
				t.Errorf("got %+v, want %+v", d, want)
			}
			if d.Allowed != (mode == limiter.FailOpen) {
				t.Errorf("allowed = %v under mode %v", d.Allowed, mode)
			}
			if reported != 1 {
				t.Errorf("OnUnavailable called %d times, want 1", reported)
			}
			if _, err := svc.Acquire(context.Background(), "not-an-ip", 1); !errors.Is(err, tenant.ErrInvalidIP) {
				t.Errorf("Acquire of a bad IP: got %v, want ErrInvalidIP", err)
			}
			if _, err := svc.Acquire(context.Background(), "192.0.2.1", 0); !errors.Is(err, limiter.ErrInvalidPermits) {
				t.Errorf("Acquire of 0 permits: got %v, want ErrInvalidPermits", err)
			}
			if _, err := svc.Lowest(context.Background(), 10); !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("Lowest: got %v, want ErrUnavailable", err)
			}
		})
	}
}

// A caller that went away is not an outage: its acquisition fails with the
// caller's error, undecided and unreported.
func TestServiceCallerGone(t *testing.T) {
	reg, err := tenant.New(tenant.Config{Policy: limiter.Policy{Limit: 10, Period: time.Minute}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reported := 0
	svc := tenant.NewService(downBackend{reg}, limiter.ServiceOptions{
		FailureMode: limiter.FailOpen, OnUnavailable: func(error) { reported++ },
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d, err := svc.Acquire(ctx, "192.0.2.1", 1)
	if err == nil || d.Degraded || d.Allowed {
		t.Errorf("Acquire after the caller cancelled: got %+v, %v; want an error and no decision", d, err)
	}
	if reported != 0 {
		t.Errorf("OnUnavailable called %d times, want 0", reported)
	}
}

// Over a working backend the Service answers exactly what the backend does.
func TestServicePassesThrough(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	reg, err := tenant.New(tenant.Config{Policy: limiter.Policy{Limit: 10, Period: time.Minute}}, clocktest.New(now).Limiter())
	if err != nil {
		t.Fatal(err)
	}
	svc := tenant.NewService(reg, limiter.ServiceOptions{Timeout: time.Second})
	d, err := svc.Acquire(context.Background(), "192.0.2.1", 4)
	if err != nil || !d.Allowed || d.Degraded || d.Remaining != 6 {
		t.Fatalf("Acquire = %+v, %v; want a grant leaving 6", d, err)
	}
	a, err := svc.Available(context.Background(), "192.0.2.1")
	if err != nil || a.Remaining != 6 {
		t.Fatalf("Available = %+v, %v; want 6", a, err)
	}
	if got := svc.Policy(); got != reg.Policy() {
		t.Errorf("Policy() = %+v, want %+v", got, reg.Policy())
	}
}

// A degraded acquisition's span says so: an Error status (the backend's
// failure) and ratelimiter.degraded, beside the decision made.
func TestServiceDegradedSpan(t *testing.T) {
	reg, err := tenant.New(tenant.Config{Policy: limiter.Policy{Limit: 10, Period: time.Minute}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	svc := tenant.NewService(downBackend{reg}, limiter.ServiceOptions{FailureMode: limiter.FailOpen, TracerProvider: tp})
	ctx, parent := tp.Tracer("test").Start(context.Background(), "server")
	if d, err := svc.Acquire(ctx, "192.0.2.1", 3); err != nil || !d.Degraded {
		t.Fatalf("Acquire: got %+v, %v; want a degraded decision", d, err)
	}
	parent.End()
	spans := rec.Ended()
	if len(spans) != 2 || spans[0].Name() != "tenant.Acquire" {
		t.Fatalf("got %d spans, want tenant.Acquire then the server's", len(spans))
	}
	s := spans[0]
	if s.Status().Code != codes.Error || s.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("span: got status %v under %s, want Error under %s", s.Status().Code, s.Parent().SpanID(), parent.SpanContext().SpanID())
	}
	want := map[attribute.Key]attribute.Value{
		"ratelimiter.degraded": attribute.BoolValue(true),
		"ratelimiter.allowed":  attribute.BoolValue(true),
		"ratelimiter.tenant":   attribute.StringValue("192.0.2.1"),
		"ratelimiter.permits":  attribute.Int64Value(3),
	}
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		got[kv.Key] = kv.Value
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("attribute %s: got %v, want %v", k, got[k].Emit(), v.Emit())
		}
	}
}
