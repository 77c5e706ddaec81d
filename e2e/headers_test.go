package e2e

import (
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestRateLimitHeaders checks RateLimit-Policy, RateLimit and Retry-After on
// grants, denials and availability answers against their bodies.
func TestRateLimitHeaders(t *testing.T) {
	t.Parallel()
	api := sharedService(t).api
	slog := client.AlgorithmSlidingLog
	cases := []struct {
		name      string
		spec      client.LimiterSpec
		periodSec int64 // advertised: whole seconds, rounded up
		// slow is true when nothing refills between two requests, so that
		// asking for the whole limit twice is denied the second time.
		slow bool
	}{
		{"headers-1m", client.LimiterSpec{Limit: 9, Period: "1m"}, 60, true},
		{"headers-100s", client.LimiterSpec{Limit: 2000, Period: "100s"}, 100, true},
		{"headers-1h-burst", client.LimiterSpec{Limit: 3600, Period: "1h", Burst: ptr[int64](10)}, 3600, true},
		{"headers-sliding-1m", client.LimiterSpec{Limit: 5, Period: "1m", Algorithm: &slog}, 60, true},
		{"headers-1500ms", client.LimiterSpec{Limit: 3, Period: "1500ms"}, 2, false},
		{"headers-500ms", client.LimiterSpec{Limit: 4, Period: "500ms"}, 1, false},
		{"headers-1ms", client.LimiterSpec{Limit: 1, Period: "1ms"}, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			l := put(t, api, tc.name, tc.spec)
			capacity := l.Limit
			if l.Burst != nil {
				capacity = *l.Burst
			}
			period, err := time.ParseDuration(l.Period)
			if err != nil {
				t.Fatalf("period %q: %v", l.Period, err)
			}

			checkAcquire := func(permits int64) client.Decision {
				t.Helper()
				res, err := api.AcquireWithResponse(ctx, tc.name, client.AcquireRequest{Permits: &permits})
				if err != nil {
					t.Fatal(err)
				}
				if res.JSON200 == nil || res.Headers200 == nil {
					t.Fatalf("acquire %d: got %d %s, want 200", permits, res.StatusCode(), res.Body)
				}
				d := *res.JSON200
				checkRateLimitHeaders(t, res.Headers200.RateLimitPolicy, res.Headers200.RateLimit, res.Headers200.RetryAfter, limitState{
					name: tc.name, limit: tc.spec.Limit, periodSec: tc.periodSec,
					remaining: d.Remaining, resetMs: d.ResetAfterMs, retryMs: d.RetryAfterMs,
				})
				if d.ResetAfterMs > period.Milliseconds() {
					t.Errorf("acquire %d: reset_after_ms: got %d, want at most the period, %d", permits, d.ResetAfterMs, period.Milliseconds())
				}
				return d
			}

			if d := checkAcquire(capacity); !d.Allowed || (tc.slow && d.Remaining != 0) {
				t.Errorf("acquire the whole capacity %d of a full limiter: got %+v, want granted, none remaining", capacity, d)
			}
			d := checkAcquire(capacity)
			switch {
			case tc.slow && (d.Allowed || d.RetryAfterMs == nil):
				t.Errorf("acquire %d of an empty limiter: got %+v, want denied with a retry time", capacity, d)
			case d.RetryAfterMs != nil && *d.RetryAfterMs > period.Milliseconds():
				t.Errorf("acquire %d: retry_after_ms: got %d, want at most the period, %d", capacity, *d.RetryAfterMs, period.Milliseconds())
			}
			if d := checkAcquire(capacity + 1); d.Allowed || !d.ExceedsCapacity {
				t.Errorf("acquire %d, more than the capacity: got %+v, want denied, exceeds capacity", capacity+1, d)
			}

			res, err := api.GetAvailableWithResponse(ctx, tc.name, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.JSON200 == nil || res.Headers200 == nil {
				t.Fatalf("available: got %d %s, want 200", res.StatusCode(), res.Body)
			}
			a := res.JSON200
			checkRateLimitHeaders(t, res.Headers200.RateLimitPolicy, res.Headers200.RateLimit, nil, limitState{
				name: tc.name, limit: tc.spec.Limit, periodSec: tc.periodSec, remaining: a.Remaining, resetMs: a.ResetAfterMs,
			})
			if retry := res.HTTPResponse.Header.Get("Retry-After"); retry != "" {
				t.Errorf("available: Retry-After: got %q, want none", retry)
			}
		})
	}
}
