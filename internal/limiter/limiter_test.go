package limiter_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func mustNew(t *testing.T, p limiter.Policy) *limiter.Limiter {
	t.Helper()
	l, err := limiter.New(p)
	if err != nil {
		t.Fatalf("New(%+v): %v", p, err)
	}
	return l
}

func acquire(t *testing.T, l *limiter.Limiter, now time.Time, n int64) limiter.Decision {
	t.Helper()
	d, err := l.Acquire(limiter.Nanos(now), n)
	if err != nil {
		t.Fatalf("Acquire(%d): %v", n, err)
	}
	return d
}

var algorithms = []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog}

// The product's own examples: capacity 0/9 used and a request for 10 is
// denied with nothing recorded; 5/9 used leaves 4.
func TestSeedExamples(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			l := mustNew(t, limiter.Policy{Limit: 9, Period: time.Minute, Algorithm: alg})
			d := acquire(t, l, t0, 10)
			if d.Allowed || !d.ExceedsCapacity || d.RetryAfter != 0 {
				t.Errorf("acquire 10 of 9: got %+v, want denied, exceeds capacity, no retry time", d)
			}
			if got := l.Available(limiter.Nanos(t0)).Remaining; got != 9 {
				t.Errorf("after denied 10: available = %d, want 9 (nothing recorded)", got)
			}
			d = acquire(t, l, t0, 5)
			if !d.Allowed || d.Remaining != 4 {
				t.Errorf("acquire 5 of 9: got %+v, want allowed with 4 remaining", d)
			}
			if got := l.Available(limiter.Nanos(t0)).Remaining; got != 4 {
				t.Errorf("5/9 used: available = %d, want 4", got)
			}
			d = acquire(t, l, t0, 5)
			if d.Allowed || d.ExceedsCapacity || d.RetryAfter <= 0 || d.Remaining != 4 {
				t.Errorf("acquire 5 with 4 left: got %+v, want denied with a retry time and 4 remaining", d)
			}
			if got := l.Available(limiter.Nanos(t0)).Remaining; got != 4 {
				t.Errorf("after denied 5: available = %d, want 4", got)
			}
			// Waiting the advertised retry time makes the same request succeed.
			if d2 := acquire(t, l, t0.Add(d.RetryAfter), 5); !d2.Allowed {
				t.Errorf("acquire 5 after RetryAfter %s: got %+v, want allowed", d.RetryAfter, d2)
			}
		})
	}
}

func TestReplenishment(t *testing.T) {
	tests := []struct {
		name      string
		policy    limiter.Policy
		wait      time.Duration
		available int64
	}{
		{"gcra refills one per period/limit", limiter.Policy{Limit: 10, Period: 10 * time.Second}, 3 * time.Second, 3},
		{"gcra refills fully after period", limiter.Policy{Limit: 10, Period: 10 * time.Second}, 10 * time.Second, 10},
		{"gcra just before a permit", limiter.Policy{Limit: 10, Period: 10 * time.Second}, time.Second - 1, 0},
		{"sliding log holds until the window passes", limiter.Policy{Limit: 10, Period: 10 * time.Second, Algorithm: limiter.SlidingLog}, 10*time.Second - 1, 0},
		{"sliding log frees at the window's end", limiter.Policy{Limit: 10, Period: 10 * time.Second, Algorithm: limiter.SlidingLog}, 10 * time.Second, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, tt.policy)
			if d := acquire(t, l, t0, 10); !d.Allowed || d.ResetAfter != 10*time.Second {
				t.Fatalf("acquire 10: got %+v, want allowed, reset after 10s", d)
			}
			if got := l.Available(limiter.Nanos(t0.Add(tt.wait))).Remaining; got != tt.available {
				t.Errorf("available after %s: got %d, want %d", tt.wait, got, tt.available)
			}
		})
	}
}

// GCRA with burst = limit admits a full burst and then the refill: close to
// 2×limit − 1 within one half-open window of length period, as documented.
func TestGCRABurstThenRefillWithinOnePeriod(t *testing.T) {
	l := mustNew(t, limiter.Policy{Limit: 100, Period: time.Minute})
	granted := int64(0)
	for now := t0; now.Before(t0.Add(time.Minute)); now = now.Add(100 * time.Millisecond) {
		for acquire(t, l, now, 1).Allowed {
			granted++
		}
	}
	// Burst + ⌊w·limit/period⌋ with w just under a minute.
	if want := int64(100 + 99); granted != want {
		t.Errorf("granted within one period: got %d, want %d", granted, want)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		policy limiter.Policy
		ok     bool
	}{
		{"defaults", limiter.Policy{Limit: 5, Period: time.Minute}, true},
		{"edges low", limiter.Policy{Limit: 1, Period: time.Millisecond}, true},
		{"edges high", limiter.Policy{Limit: limiter.MaxLimit, Period: limiter.MaxPeriod, Burst: limiter.MaxLimit}, true},
		{"sliding log", limiter.Policy{Limit: 5, Period: time.Minute, Algorithm: limiter.SlidingLog}, true},
		{"zero limit", limiter.Policy{Limit: 0, Period: time.Minute}, false},
		{"negative limit", limiter.Policy{Limit: -1, Period: time.Minute}, false},
		{"limit too large", limiter.Policy{Limit: limiter.MaxLimit + 1, Period: time.Minute}, false},
		{"period too short", limiter.Policy{Limit: 5, Period: time.Millisecond - 1}, false},
		{"period too long", limiter.Policy{Limit: 5, Period: limiter.MaxPeriod + 1}, false},
		{"burst above limit", limiter.Policy{Limit: 5, Period: time.Minute, Burst: 6}, false},
		{"negative burst", limiter.Policy{Limit: 5, Period: time.Minute, Burst: -1}, false},
		{"burst with sliding log", limiter.Policy{Limit: 5, Period: time.Minute, Burst: 5, Algorithm: limiter.SlidingLog}, false},
		{"unknown algorithm", limiter.Policy{Limit: 5, Period: time.Minute, Algorithm: "leaky"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.policy.Validate()
			if tt.ok && err != nil {
				t.Errorf("Validate: got %v, want nil", err)
			}
			if !tt.ok && !errors.Is(err, limiter.ErrInvalidPolicy) {
				t.Errorf("Validate: got %v, want ErrInvalidPolicy", err)
			}
		})
	}
}

func TestInvalidPermitsChangeNothing(t *testing.T) {
	for _, n := range []int64{0, -1, math.MinInt64, limiter.MaxLimit + 1, math.MaxInt64} {
		l := mustNew(t, limiter.Policy{Limit: 9, Period: time.Minute})
		if _, err := l.Acquire(limiter.Nanos(t0), n); !errors.Is(err, limiter.ErrInvalidPermits) {
			t.Errorf("Acquire(%d): got %v, want ErrInvalidPermits", n, err)
		}
		if got := l.Available(limiter.Nanos(t0)).Remaining; got != 9 {
			t.Errorf("after Acquire(%d): available %d, want 9", n, got)
		}
	}
}

// The documented edges: limit up to 1e9, period from 1 ms to a year, permits
// up to the limit, far-future and zero times. Every case must give exact
// answers, not overflow.
func TestArithmeticEdges(t *testing.T) {
	times := []time.Time{time.Time{}, time.Unix(0, 0), t0, time.Unix(0, limiter.MaxNanos), time.Unix(0, math.MaxInt64), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)}
	policies := []limiter.Policy{
		{Limit: limiter.MaxLimit, Period: time.Millisecond},
		{Limit: limiter.MaxLimit, Period: limiter.MaxPeriod},
		{Limit: 1, Period: time.Millisecond},
		{Limit: 1, Period: limiter.MaxPeriod},
		{Limit: 999_999_937, Period: limiter.MaxPeriod - 1}, // a prime limit: fractions everywhere
		{Limit: 7, Period: time.Second, Algorithm: limiter.SlidingLog},
		{Limit: limiter.MaxLimit, Period: limiter.MaxPeriod, Algorithm: limiter.SlidingLog},
	}
	for _, p := range policies {
		for _, now := range times {
			l := mustNew(t, p)
			if got := l.Available(limiter.Nanos(now)).Remaining; got != p.Limit {
				t.Errorf("%+v at %v: fresh available %d, want %d", p, now, got, p.Limit)
			}
			d := acquire(t, l, now, p.Limit)
			if !d.Allowed || d.Remaining != 0 || d.ResetAfter != p.Period {
				t.Errorf("%+v at %v: acquire all: got %+v, want allowed, 0 left, reset after %s", p, now, d, p.Period)
			}
			if d := acquire(t, l, now, 1); d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > p.Period {
				t.Errorf("%+v at %v: acquire one more: got %+v, want denied with retry in (0, period]", p, now, d)
			}
			later := now.Add(p.Period)
			if limiter.Nanos(now) == limiter.MaxNanos || limiter.Nanos(now) == 0 && now.Before(time.Unix(0, 0)) {
				continue // time stands still at the clamped edges
			}
			if got := l.Available(limiter.Nanos(later)).Remaining; got != p.Limit {
				t.Errorf("%+v at %v: available a period later %d, want %d", p, now, got, p.Limit)
			}
		}
	}
}

func TestTimeGoingBackwardsNeverGrantsMore(t *testing.T) {
	for _, alg := range algorithms {
		l := mustNew(t, limiter.Policy{Limit: 10, Period: time.Second, Algorithm: alg})
		acquire(t, l, t0, 10)
		for _, back := range []time.Duration{time.Millisecond, time.Second, time.Hour} {
			if d := acquire(t, l, t0.Add(-back), 1); d.Allowed {
				t.Errorf("%s: acquire %s in the past after exhausting: got allowed", alg, back)
			}
		}
	}
}

func TestParsePeriod(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"100s", 100 * time.Second, true},
		{"1m", time.Minute, true},
		{"1h30m", 90 * time.Minute, true},
		{"1ms", time.Millisecond, true},
		{"8784h", limiter.MaxPeriod, true},
		{"999us", 0, false},
		{"8784h1ns", 0, false},
		{"0s", 0, false},
		{"-1s", 0, false},
		{"1d", 0, false},
		{"", 0, false},
		{"60", 0, false},
		{"1 m", 0, false},
	}
	for _, tt := range tests {
		got, err := limiter.ParsePeriod(tt.in)
		if tt.ok && (err != nil || got != tt.want) {
			t.Errorf("ParsePeriod(%q): got %v, %v, want %v", tt.in, got, err, tt.want)
		}
		if !tt.ok && !errors.Is(err, limiter.ErrInvalidPolicy) {
			t.Errorf("ParsePeriod(%q): got %v, %v, want ErrInvalidPolicy", tt.in, got, err)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, name := range []string{"a", "google-read", "svc.payments_v2", "0abc", string(make([]byte, 0)) + "x"} {
		if err := limiter.CheckName(name); err != nil {
			t.Errorf("CheckName(%q): got %v, want nil", name, err)
		}
	}
	long := make([]byte, limiter.MaxNameLen+1)
	for i := range long {
		long[i] = 'a'
	}
	for _, name := range []string{"", "-a", ".a", "a b", "a/b", "ä", "a\x00", string(long), "a%2F"} {
		if err := limiter.CheckName(name); !errors.Is(err, limiter.ErrInvalidName) {
			t.Errorf("CheckName(%q): got %v, want ErrInvalidName", name, err)
		}
	}
}
