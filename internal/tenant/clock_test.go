package tenant_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// A step of the wall clock (NTP, an operator) an hour either way neither
// refills nor freezes a tenant: after the step the registry answers
// exactly what a registry whose wall clock never stepped answers, permits
// coming back as monotonic time passes.
func TestWallClockStep(t *testing.T) {
	ctx := context.Background()
	const ip = "192.0.2.1"
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		for _, step := range []time.Duration{time.Hour, -time.Hour} {
			t.Run(string(alg)+"/"+step.String(), func(t *testing.T) {
				// 10 permits per 10 s: GCRA regains one a second, the
				// sliding log all ten when the window has passed.
				cfg := tenant.Config{Policy: limiter.Policy{Limit: 10, Period: 10 * time.Second, Algorithm: alg}}
				start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
				stepped, steady := clocktest.New(start), clocktest.New(start)
				r := newRegistry(t, cfg, stepped.Limiter())
				ref := newRegistry(t, cfg, steady.Limiter())
				for _, reg := range []*tenant.Registry{r, ref} {
					if d, err := reg.Acquire(ctx, ip, 10); err != nil || !d.Allowed {
						t.Fatalf("Acquire(10) by a new tenant: got %+v, %v, want allowed", d, err)
					}
				}
				stepped.StepWall(step)
				// Remaining permits when each instant after the
				// acquisition is reached on the monotonic clock.
				looks := []struct {
					at         time.Duration
					gcra, slog int64
				}{{0, 0, 0}, {time.Second, 1, 0}, {5 * time.Second, 5, 0}, {10 * time.Second, 10, 10}, {time.Minute, 10, 10}}
				var passed time.Duration
				for _, l := range looks {
					stepped.Advance(l.at - passed)
					steady.Advance(l.at - passed)
					passed = l.at
					want := l.gcra
					if alg == limiter.SlidingLog {
						want = l.slog
					}
					got, err := r.Available(ctx, ip)
					if err != nil {
						t.Fatal(err)
					}
					if ra, _ := ref.Available(ctx, ip); got != ra || got.Remaining != want {
						t.Errorf("%s after taking all: got %+v, want %+v (%d remaining)", l.at, got, ra, want)
					}
				}
				// Acquisitions and Lowest go on answering as the unstepped
				// registry's.
				for i := range 12 {
					got, err := r.Acquire(ctx, ip, 1)
					if err != nil {
						t.Fatal(err)
					}
					if want, _ := ref.Acquire(ctx, ip, 1); got != want {
						t.Errorf("acquisition %d: got %+v, want %+v", i, got, want)
					}
				}
				got, err := r.Lowest(ctx, 10)
				if err != nil {
					t.Fatal(err)
				}
				if want, _ := ref.Lowest(ctx, 10); !slices.Equal(got, want) {
					t.Errorf("Lowest(10): got %+v, want %+v", got, want)
				}
			})
		}
	}
}

func newRegistry(t *testing.T, cfg tenant.Config, clock *limiter.Clock) *tenant.Registry {
	t.Helper()
	r, err := tenant.New(cfg, clock)
	if err != nil {
		t.Fatalf("tenant.New(%+v): %v", cfg, err)
	}
	return r
}
