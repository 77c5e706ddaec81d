package tenant

import (
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// TestReplenishmentExact is the shared suite's Replenishment at injected
// instants: after a tenant uses up a limit of 2 per 200ms at once, its
// permits come back exactly when the policy says, and it stays in the
// Lowest answer until its bucket is full.
func TestReplenishmentExact(t *testing.T) {
	const period = 200 * time.Millisecond
	const ip = "203.0.113.99"
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
	for _, tt := range tests {
		t.Run(string(tt.alg)+"/"+tt.after.String(), func(t *testing.T) {
			c := newFakeClock()
			r := newRegistry(t, Config{Policy: limiter.Policy{Limit: 2, Period: period, Algorithm: tt.alg}}, c)
			if d := mustAcquire(t, r, ip, 2); !d.Allowed || d.ResetAfter != period {
				t.Fatalf("Acquire 2 of 2: got %+v, want allowed, full again after %s", d, period)
			}
			c.Advance(tt.after)
			full := tt.after >= period
			es := mustLowest(t, r, 5)
			if full != (len(es) == 0) || !full && (es[0].Remaining != tt.remaining || es[0].ResetAfter != period-tt.after) {
				t.Errorf("Lowest(5) after %s: got %+v, want %s with %d left unless full", tt.after, es, ip, tt.remaining)
			}
			a := mustAvailable(t, r, ip)
			want := Availability{Tenant: ip, Availability: limiter.Availability{Remaining: tt.remaining, Limit: 2, ResetAfter: period - tt.after}}
			if a != want {
				t.Errorf("Available after %s: got %+v, want %+v", tt.after, a, want)
			}
			d := mustAcquire(t, r, ip, 2)
			if d.Allowed != full || !full && d.RetryAfter != period-tt.after {
				t.Errorf("Acquire 2 after %s: got %+v; want allowed %v, else a retry after %s", tt.after, d, full, period-tt.after)
			}
		})
	}
}
