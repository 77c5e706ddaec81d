package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// A step of the wall clock (NTP, an operator) an hour either way neither
// refills nor freezes a limiter: after the step the store answers exactly
// what a store whose wall clock never stepped answers, permits coming back
// as monotonic time passes.
func TestWallClockStep(t *testing.T) {
	ctx := context.Background()
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		for _, step := range []time.Duration{time.Hour, -time.Hour} {
			t.Run(string(alg)+"/"+step.String(), func(t *testing.T) {
				// 10 permits per 10 s: GCRA regains one a second, the
				// sliding log all ten when the window has passed.
				p := limiter.Policy{Limit: 10, Period: 10 * time.Second, Algorithm: alg}
				start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
				stepped, steady := clocktest.New(start), clocktest.New(start)
				s, ref := memory.New(stepped.Limiter(), 0), memory.New(steady.Limiter(), 0)
				for _, st := range []*memory.Store{s, ref} {
					put(t, st, "a", p)
					if d, err := st.Acquire(ctx, "a", 10); err != nil || !d.Allowed {
						t.Fatalf("Acquire(10) on a full limiter: got %+v, %v, want allowed", d, err)
					}
				}
				stepped.StepWall(step)
				if a, err := s.Available(ctx, "a"); err != nil || a.Remaining != 0 {
					t.Fatalf("right after the step: got %+v, %v, want 0 remaining", a, err)
				}
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
					got, err := s.Available(ctx, "a")
					if err != nil {
						t.Fatal(err)
					}
					if ra, _ := ref.Available(ctx, "a"); got != ra || got.Remaining != want {
						t.Errorf("%s after taking all: got %+v, want %+v (%d remaining)", l.at, got, ra, want)
					}
				}
				// And acquisitions go on deciding as the unstepped store's.
				for i := range 12 {
					got, err := s.Acquire(ctx, "a", 1)
					if err != nil {
						t.Fatal(err)
					}
					wantD, _ := ref.Acquire(ctx, "a", 1)
					if got != wantD {
						t.Errorf("acquisition %d: got %+v, want %+v", i, got, wantD)
					}
				}
			})
		}
	}
}
