package rls

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// A rule's limiter deleted while the store holds its most limiters cannot
// be put back: the request is refused with RESOURCE_EXHAUSTED, as a limit
// set by a request without room is, and the refusal charges nothing.
func TestMissingLimiterWithoutRoom(t *testing.T) {
	const most = 4
	l := limiter.NewService(memory.New(nil, most))
	cfg := mustParse(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")
	c := serve(t, l, cfg)
	name := cfg.Limiters()[0].Name
	if err := l.Delete(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	for i := range most {
		if _, err := l.Put(t.Context(), limiter.Definition{Name: fmt.Sprintf("other%d", i), Policy: limiter.Policy{Limit: 1, Period: 1e9}}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "alice")}})
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Fatalf("got %v (%v), want RESOURCE_EXHAUSTED", got, err)
	}
	if msg := status.Convert(err).Message(); msg == "" || containsAny(msg, name, "limiter: ") {
		t.Errorf("got message %q, want one for the client, without the store's text", msg)
	}
}

// containsAny reports whether s holds one of subs.
func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if len(sub) > 0 && strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// withLimitOf is a descriptor of user alice that sets a limit of n a
// year: a hit holds counts for days, on the backend's own clock too.
func withLimitOf(n uint32) *commonv3.RateLimitDescriptor {
	d := desc("user", "alice")
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_YEAR}
	return d
}

// refund gives d's hit back.
func refund(d *commonv3.RateLimitDescriptor) *commonv3.RateLimitDescriptor {
	d.IsNegativeHits = true
	return d
}

// sweep sweeps svc at now and returns what it did.
func sweep(t *testing.T, svc *Service, now time.Time) Swept {
	t.Helper()
	sw, err := svc.Sweep(t.Context(), now)
	if err != nil {
		t.Fatal(err)
	}
	return sw
}

// The limiters of limits set by requests are bounded by MaxOverrides while
// they hold counts; one idle for SweepGrace is deleted, and frees its room.
func TestIdleLimitsSetByRequestsExpire(t *testing.T) {
	backends(t, func(t *testing.T, l *limiter.Service) {
		cfg := mustParse(t, testConfig)
		if err := Apply(t.Context(), l, cfg); err != nil {
			t.Fatal(err)
		}
		svc, err := NewService(l, cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		call := func(d *commonv3.RateLimitDescriptor) error {
			_, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{d}})
			return err
		}
		for n := range uint32(MaxOverrides) {
			if err := call(withLimitOf(100 + n)); err != nil {
				t.Fatalf("a limit of %d: %v", 100+n, err)
			}
		}
		if err := call(withLimitOf(99)); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("one limit more than %d: got %v, want RESOURCE_EXHAUSTED", MaxOverrides, err)
		}
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		if sw := sweep(t, svc, t0); sw.Deleted != 0 || sw.Waiting != 0 {
			t.Fatalf("a sweep while every limit holds counts: got %+v, want nothing deleted or waiting", sw)
		}
		// The first limit's hit given back: its limiter holds no counts.
		if err := call(refund(withLimitOf(100))); err != nil {
			t.Fatal(err)
		}
		if sw := sweep(t, svc, t0.Add(time.Second)); sw.Deleted != 0 || sw.Waiting != 1 {
			t.Fatalf("a sweep as one limit is found idle: got %+v, want 1 waiting, none deleted", sw)
		}
		if sw := sweep(t, svc, t0.Add(time.Second+SweepGrace-1)); sw.Deleted != 0 {
			t.Fatalf("a sweep within %s: got %+v, want none deleted", SweepGrace, sw)
		}
		if err := call(withLimitOf(99)); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("one limit more, before the idle one is deleted: got %v, want RESOURCE_EXHAUSTED", err)
		}
		if sw := sweep(t, svc, t0.Add(time.Second+SweepGrace)); sw.Deleted != 1 {
			t.Fatalf("a sweep %s after: got %+v, want 1 deleted", SweepGrace, sw)
		}
		if err := call(withLimitOf(99)); err != nil {
			t.Fatalf("a new limit once an idle one is deleted: got %v, want an answer", err)
		}
		// The deleted limit, set again, is a new one, and there is no room.
		if err := call(withLimitOf(100)); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("the deleted limit set again: got %v, want RESOURCE_EXHAUSTED", err)
		}
	})
}

// Two services of different configurations on one backend, as during a
// rolling update: neither's sweeps delete a limiter the other decides on
// while it holds counts, and one deleted while idle is put back, full, by
// the other's next decision.
func TestSweepBesideAnotherConfiguration(t *testing.T) {
	backends(t, func(t *testing.T, l *limiter.Service) {
		oldCfg := mustParse(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: route\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
		newCfg := mustParse(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
		oldC, newC := serve(t, l, oldCfg), serve(t, l, newCfg)
		oldSvc, err := NewService(l, oldCfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		newSvc, err := NewService(l, newCfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		wantCodes(t, "old rule", ask(t, oldC, hits(desc("route", "a"), 2)), ok, ok)
		wantCodes(t, "new rule", ask(t, newC, hits(desc("client", "b"), 2)), ok, ok)
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		for range 3 {
			for _, svc := range []*Service{oldSvc, newSvc} {
				if sw := sweep(t, svc, now); sw.Deleted != 0 || sw.Kept != 1 {
					t.Fatalf("a sweep while the other's rule holds counts: got %+v, want it kept", sw)
				}
			}
			now = now.Add(SweepGrace)
		}
		left := func(c rlsv3.RateLimitServiceClient, d *commonv3.RateLimitDescriptor) uint32 {
			t.Helper()
			return ask(t, c, hits(d, 0)).Statuses[0].LimitRemaining
		}
		if got := left(oldC, desc("route", "a")); got != 3 {
			t.Errorf("old rule after the new configuration's sweeps: got %d left, want 3", got)
		}
		if got := left(newC, desc("client", "b")); got != 3 {
			t.Errorf("new rule after the old configuration's sweeps: got %d left, want 3", got)
		}

		// The new rule's key full again: the old configuration deletes its
		// limiter SweepGrace later; the new one's next decision puts it
		// back, and counts from full.
		wantCodes(t, "new rule, refunded", ask(t, newC, refund(hits(desc("client", "b"), 2))), ok, ok)
		sweep(t, oldSvc, now)
		if sw := sweep(t, oldSvc, now.Add(SweepGrace)); sw.Deleted != 1 {
			t.Fatalf("the old configuration's sweep %s after the new rule went idle: got %+v, want 1 deleted", SweepGrace, sw)
		}
		wantCodes(t, "new rule, after its limiter was deleted", ask(t, newC, hits(desc("client", "b"), 1)), ok, ok)
		if got := left(newC, desc("client", "b")); got != 4 {
			t.Errorf("new rule, put back: got %d left, want 4", got)
		}
		// The new configuration never deletes its own rule's limiter, idle
		// or not.
		wantCodes(t, "new rule, refunded again", ask(t, newC, refund(hits(desc("client", "b"), 1))), ok, ok)
		now = now.Add(2 * SweepGrace)
		sweep(t, newSvc, now)
		sweep(t, newSvc, now.Add(SweepGrace))
		if _, err := l.Get(t.Context(), newCfg.Limiters()[1].Name); err != nil {
			t.Errorf("the new rule's limiter after the new configuration's sweeps: %v", err)
		}
	})
}

// Requests that set ever new limits while the bound is full are refused
// without listing the backend each time: at most once a second.
func TestFullBoundListsOnceASecond(t *testing.T) {
	l := &countLists{Limiters: limiter.NewService(memory.New(nil, 0))}
	cfg := mustParse(t, testConfig)
	if err := Apply(t.Context(), l, cfg); err != nil {
		t.Fatal(err)
	}
	svc, err := NewService(l, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	svc.now = func() time.Time { return now }
	call := func(n uint32) error {
		_, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{withLimitOf(n)}})
		return err
	}
	for n := range uint32(MaxOverrides) {
		if err := call(1000 + n); err != nil {
			t.Fatal(err)
		}
	}
	before := l.lists.Load()
	for n := range uint32(50) {
		if err := call(5000 + n); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a limit more than %d: got %v, want RESOURCE_EXHAUSTED", MaxOverrides, err)
		}
	}
	if got := l.lists.Load() - before; got != 1 {
		t.Errorf("50 new limits refused within a second: got %d lists of the backend, want 1", got)
	}
	// A limit the backend holds is answered all the same, as it is once
	// the second has passed.
	if err := call(1000); err != nil {
		t.Errorf("a limit held, while the bound is full: got %v, want an answer", err)
	}
	now = now.Add(time.Second)
	if err := call(6000); status.Code(err) != codes.ResourceExhausted || l.lists.Load()-before != 2 {
		t.Errorf("a second later: got %v after %d lists, want RESOURCE_EXHAUSTED after 2", err, l.lists.Load()-before)
	}
}

// countLists is Limiters that counts its lists.
type countLists struct {
	Limiters
	lists atomic.Int64
}

func (c *countLists) List(ctx context.Context, after string, max int) ([]limiter.Definition, error) {
	c.lists.Add(1)
	return c.Limiters.List(ctx, after, max)
}

// A call its caller cancelled, or whose deadline passed, before anything
// was decided charges nothing.
func TestCallGivenUpOnChargesNothing(t *testing.T) {
	backends(t, func(t *testing.T, l *limiter.Service) {
		cfg := mustParse(t, testConfig)
		if err := Apply(t.Context(), l, cfg); err != nil {
			t.Fatal(err)
		}
		svc, err := NewService(l, cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		cancelled, cancel := context.WithCancel(t.Context())
		cancel()
		expired, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
		defer cancel()
		for _, tc := range []struct {
			name string
			ctx  context.Context
			want codes.Code
		}{
			{"cancelled", cancelled, codes.Canceled},
			{"past its deadline", expired, codes.DeadlineExceeded},
		} {
			_, err := svc.ShouldRateLimit(tc.ctx, &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "zoe"), withLimitOf(7)}})
			if got := status.Code(err); got != tc.want {
				t.Errorf("%s: got %v (%v), want %v", tc.name, got, err, tc.want)
			}
		}
		resp, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{hits(desc("user", "zoe"), 0), hits(withLimitOf(7), 0)}})
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []uint32{3, 7} {
			if got := resp.Statuses[i].LimitRemaining; got != want {
				t.Errorf("descriptor %d after the calls given up on: got %d left, want %d, all", i, got, want)
			}
		}
	})
}

// The hits of limits set by requests count as one rule per domain:
// requests choose the limits, and their limiters come and go, so that a
// rule of their own each would grow the metric's series without end.
func TestOverrideHitsCountAsOneRule(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	c := serveWith(t, limiter.NewService(memory.New(nil, 0)), mustParse(t, testConfig), Options{MeterProvider: mp})
	for n := range uint32(20) {
		ask(t, c, withLimitOf(100+n))
	}
	got := hitsCounted(t, reader)
	want := map[string]int64{"web.override within_limit": 20}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got hits %v, want %v", got, want)
	}
}
