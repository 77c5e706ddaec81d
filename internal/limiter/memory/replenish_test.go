package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// TestReplenishmentExact is the shared suite's Replenishment at injected
// instants: after a limit of 2 per 200ms is used up at once, the permits
// come back exactly when the policy says, not a nanosecond sooner.
func TestReplenishmentExact(t *testing.T) {
	const period = 200 * time.Millisecond
	tests := []struct {
		alg       limiter.Algorithm
		after     time.Duration
		remaining int64
	}{
		{limiter.GCRA, 0, 0},
		{limiter.GCRA, period/2 - 1, 0},
		{limiter.GCRA, period / 2, 1}, // one permit every 100ms
		{limiter.GCRA, period - 1, 1},
		{limiter.GCRA, period, 2},
		{limiter.SlidingLog, 0, 0},
		{limiter.SlidingLog, period - 1, 0}, // the grant is still in the window
		{limiter.SlidingLog, period, 2},
	}
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(string(tt.alg)+"/"+tt.after.String(), func(t *testing.T) {
			s, c := newStore(t)
			put(t, s, "r", limiter.Policy{Limit: 2, Period: period, Algorithm: tt.alg})
			if d, err := s.Acquire(ctx, "r", 2); err != nil || !d.Allowed || d.ResetAfter != period {
				t.Fatalf("Acquire 2 of 2: got %+v, %v; want allowed, full again after %s", d, err, period)
			}
			c.Advance(tt.after)
			a, err := s.Available(ctx, "r")
			want := limiter.Availability{Remaining: tt.remaining, Limit: 2, ResetAfter: period - tt.after}
			if err != nil || a != want {
				t.Errorf("Available after %s: got %+v, %v; want %+v", tt.after, a, err, want)
			}
			d, err := s.Acquire(ctx, "r", 2)
			if err != nil {
				t.Fatal(err)
			}
			if full := tt.after >= period; d.Allowed != full || !full && d.RetryAfter != period-tt.after {
				t.Errorf("Acquire 2 after %s: got %+v; want allowed %v, else a retry after %s", tt.after, d, full, period-tt.after)
			}
		})
	}
}
