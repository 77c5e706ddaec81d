package e2e

import (
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestReplenishment exhausts short limits and watches them refill: not
// before the denial said, and well within ten periods.
//
// The lower bounds need no timing luck: a denial answered after the client
// sent it at t0 says the permits fit retry_after_ms later, so no answer can
// report them back before t0 + retry_after_ms - 1ms (the wait is rounded
// up to whole milliseconds).
func TestReplenishment(t *testing.T) {
	t.Parallel()
	api := sharedService(t).api
	slog := client.AlgorithmSlidingLog
	cases := []struct {
		name   string
		spec   client.LimiterSpec
		period time.Duration
	}{
		{"replenish-gcra", client.LimiterSpec{Limit: 2, Period: "1s"}, time.Second},
		{"replenish-sliding", client.LimiterSpec{Limit: 2, Period: "1s", Algorithm: &slog}, time.Second},
		{"replenish-gcra-800ms", client.LimiterSpec{Limit: 4, Period: "800ms"}, 800 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			put(t, api, tc.name, tc.spec)
			limit := tc.spec.Limit

			// Exhaust it: take permits until one is denied.
			var (
				denial client.Decision
				sent   time.Time
			)
			take(t, api, tc.name, limit, true)
			for i := 0; ; i++ {
				if i == 20 {
					t.Fatalf("20 acquisitions granted after the limit was taken: never denied")
				}
				sent = time.Now()
				if denial = acquire(t, api, tc.name, 1); !denial.Allowed {
					break
				}
			}
			if denial.ExceedsCapacity || denial.RetryAfterMs == nil {
				t.Fatalf("denial: got %+v, want a retry time", denial)
			}
			retry := time.Duration(*denial.RetryAfterMs) * time.Millisecond
			reset := time.Duration(denial.ResetAfterMs) * time.Millisecond
			if retry <= 0 || retry > tc.period || reset < retry || reset > tc.period {
				t.Fatalf("denial: got retry after %v, reset after %v; want 0 < retry <= reset <= the period, %v", retry, reset, tc.period)
			}

			// Poll without taking anything until one permit is back, then
			// until all are.
			deadline := sent.Add(10 * tc.period)
			var recovered, full time.Time
			for full.IsZero() {
				if time.Now().After(deadline) {
					t.Fatalf("not full again within 10 periods (%v) of the denial", 10*tc.period)
				}
				remaining := available(t, api, tc.name)
				now := time.Now()
				if remaining >= 1 && recovered.IsZero() {
					recovered = now
				}
				if remaining == limit {
					full = now
				}
				time.Sleep(tc.period / 50)
			}
			if early := sent.Add(retry - time.Millisecond); recovered.Before(early) {
				t.Errorf("a permit was back %v after the denial was sent, want no sooner than its retry_after_ms, %v",
					recovered.Sub(sent), retry)
			}
			if early := sent.Add(reset - time.Millisecond); full.Before(early) {
				t.Errorf("full again %v after the denial was sent, want no sooner than its reset_after_ms, %v",
					full.Sub(sent), reset)
			}
			t.Logf("denied with retry after %v, reset after %v; one permit back after %v, full after %v",
				retry, reset, recovered.Sub(sent).Round(time.Millisecond), full.Sub(sent).Round(time.Millisecond))

			take(t, api, tc.name, limit, true)
		})
	}
}
