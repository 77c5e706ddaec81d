package storetest

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// slack bounds how much time a test may take between two calls that it
// compares: far more than any call takes, far less than the hour-long
// periods.
const slack = time.Minute

// within reports whether d lies in (want-slack, want].
func within(d, want time.Duration) bool { return d <= want && d > want-slack }

// testAllOrNothing: the product's own example. With capacity 9 and nothing
// used, a request for 10 is denied and records nothing; 5 of 9 leaves 4; a
// request for 5 more is denied with a time to retry and leaves 4.
func testAllOrNothing(t *testing.T, s limiter.Store) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			name := "a-" + string(alg)
			put(t, s, name, limiter.Policy{Limit: 9, Period: hour, Algorithm: alg})
			d := acquire(t, s, name, 10)
			if d.Allowed || !d.ExceedsCapacity || d.RetryAfter != 0 || d.Remaining != 9 || d.Permits != 10 || d.Limit != 9 {
				t.Errorf("Acquire 10 of 9: got %+v, want denied, exceeding capacity, 9 remaining", d)
			}
			wantRemaining(t, s, name, 9)
			d = acquire(t, s, name, 5)
			if !d.Allowed || d.Remaining != 4 || d.Permits != 5 || d.RetryAfter != 0 || d.ExceedsCapacity {
				t.Errorf("Acquire 5 of 9: got %+v, want allowed, 4 remaining", d)
			}
			wantRemaining(t, s, name, 4)
			d = acquire(t, s, name, 5)
			if d.Allowed || d.ExceedsCapacity || d.RetryAfter <= 0 || d.Remaining != 4 {
				t.Errorf("Acquire 5 with 4 left: got %+v, want denied with a retry time, 4 remaining", d)
			}
			wantRemaining(t, s, name, 4)
			if d := acquire(t, s, name, 4); !d.Allowed || d.Remaining != 0 {
				t.Errorf("Acquire the last 4: got %+v, want allowed, 0 remaining", d)
			}
			if d := acquire(t, s, name, 1); d.Allowed || d.Remaining != 0 {
				t.Errorf("Acquire 1 of none: got %+v, want denied", d)
			}
		})
	}
}

func testAvailableNeverConsumes(t *testing.T, s limiter.Store) {
	for _, alg := range algorithms {
		name := "v-" + string(alg)
		put(t, s, name, limiter.Policy{Limit: 3, Period: hour, Algorithm: alg})
		for range 20 {
			wantRemaining(t, s, name, 3)
		}
		acquire(t, s, name, 2)
		for range 20 {
			a := available(t, s, name)
			if a.Remaining != 1 || a.Limit != 3 || a.ResetAfter <= 0 || a.ResetAfter > hour {
				t.Fatalf("%s: Available after 2 of 3: got %+v, want 1 of 3 remaining, reset within an hour", alg, a)
			}
		}
		if d := acquire(t, s, name, 1); !d.Allowed || d.Remaining != 0 {
			t.Errorf("%s: Acquire the last one: got %+v, want allowed", alg, d)
		}
	}
}

// testGCRAFields checks every field against GCRA's arithmetic: 10 permits
// per hour is one every 6 minutes.
func testGCRAFields(t *testing.T, s limiter.Store) {
	interval := hour / 10
	put(t, s, "g", limiter.Policy{Limit: 10, Period: hour})
	// From a full bucket the backlog is exactly the cost of the grant.
	d := acquire(t, s, "g", 3)
	want := limiter.Decision{Allowed: true, Permits: 3, Remaining: 7, Limit: 10, ResetAfter: 3 * interval}
	if d != want {
		t.Errorf("Acquire 3 of 10: got %+v, want %+v", d, want)
	}
	d = acquire(t, s, "g", 8)
	if d.Allowed || d.ExceedsCapacity || d.Remaining != 7 || d.Limit != 10 || !within(d.RetryAfter, interval) || !within(d.ResetAfter, 3*interval) {
		t.Errorf("Acquire 8 with 7 left: got %+v, want denied, retry within %s, reset within %s", d, interval, 3*interval)
	}
	a := available(t, s, "g")
	if a.Remaining != 7 || a.Limit != 10 || !within(a.ResetAfter, 3*interval) {
		t.Errorf("Available: got %+v, want 7 of 10, reset within %s", a, 3*interval)
	}

	put(t, s, "burst", limiter.Policy{Limit: 10, Period: hour, Burst: 2})
	want = limiter.Decision{Allowed: true, Permits: 2, Remaining: 0, Limit: 10, ResetAfter: 2 * interval}
	if d := acquire(t, s, "burst", 2); d != want {
		t.Errorf("Acquire a burst of 2: got %+v, want %+v", d, want)
	}
	if d := acquire(t, s, "burst", 1); d.Allowed || d.ExceedsCapacity || !within(d.RetryAfter, interval) || !within(d.ResetAfter, 2*interval) {
		t.Errorf("Acquire 1 after the burst: got %+v, want denied, retry within %s", d, interval)
	}
}

// testSlidingLogFields: a grant counts for exactly one period.
func testSlidingLogFields(t *testing.T, s limiter.Store) {
	put(t, s, "s", limiter.Policy{Limit: 3, Period: hour, Algorithm: limiter.SlidingLog})
	want := limiter.Decision{Allowed: true, Permits: 1, Remaining: 2, Limit: 3, ResetAfter: hour}
	if d := acquire(t, s, "s", 1); d != want {
		t.Errorf("Acquire 1 of 3: got %+v, want %+v", d, want)
	}
	if d := acquire(t, s, "s", 2); !d.Allowed || d.Remaining != 0 || !within(d.ResetAfter, hour) {
		t.Errorf("Acquire 2 more: got %+v, want allowed, 0 remaining, reset within an hour", d)
	}
	// The first grant leaves the window first, but it is one permit only.
	d := acquire(t, s, "s", 2)
	if d.Allowed || d.ExceedsCapacity || d.Remaining != 0 || !within(d.RetryAfter, hour) || !within(d.ResetAfter, hour) {
		t.Errorf("Acquire 2 of none: got %+v, want denied, retry and reset within an hour", d)
	}
	a := available(t, s, "s")
	if a.Remaining != 0 || a.Limit != 3 || !within(a.ResetAfter, hour) {
		t.Errorf("Available: got %+v, want 0 of 3, reset within an hour", a)
	}
}

func testExceedsCapacity(t *testing.T, s limiter.Store) {
	put(t, s, "g", limiter.Policy{Limit: 10, Period: hour, Burst: 4})
	put(t, s, "s", limiter.Policy{Limit: 4, Period: hour, Algorithm: limiter.SlidingLog})
	for _, name := range []string{"g", "s"} {
		for _, n := range []int64{5, limiter.MaxLimit} {
			d := acquire(t, s, name, n)
			if d.Allowed || !d.ExceedsCapacity || d.RetryAfter != 0 || d.Remaining != 4 {
				t.Errorf("%s: Acquire %d of capacity 4: got %+v, want denied, exceeding capacity, no retry time", name, n, d)
			}
		}
		if d := acquire(t, s, name, 4); !d.Allowed {
			t.Errorf("%s: Acquire the whole capacity: got %+v, want allowed", name, d)
		}
		// Exceeding the capacity does not depend on the state.
		if d := acquire(t, s, name, 5); !d.ExceedsCapacity || d.RetryAfter != 0 {
			t.Errorf("%s: Acquire 5 when empty: got %+v, want exceeding capacity", name, d)
		}
		if d := acquire(t, s, name, 1); d.Allowed || d.ExceedsCapacity || d.RetryAfter <= 0 {
			t.Errorf("%s: Acquire 1 when empty: got %+v, want denied with a retry time", name, d)
		}
	}
}

func testIndependent(t *testing.T, s limiter.Store) {
	for _, alg := range algorithms {
		a, b := "a-"+string(alg), "b-"+string(alg)
		put(t, s, a, limiter.Policy{Limit: 2, Period: hour, Algorithm: alg})
		put(t, s, b, limiter.Policy{Limit: 2, Period: hour, Algorithm: alg})
		acquire(t, s, a, 2)
		wantRemaining(t, s, a, 0)
		wantRemaining(t, s, b, 2)
	}
}

// testConcurrentAcquire: many goroutines take one permit each from a limit
// of 100; exactly 100 are granted, and the grants report every remaining
// count from 99 down to 0 once, as if they had run one after another.
func testConcurrentAcquire(t *testing.T, s limiter.Store) {
	const goroutines, each = 20, 10
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			name := "c-" + string(alg)
			// A day-long period: nothing replenishes while the test runs.
			put(t, s, name, limiter.Policy{Limit: 100, Period: 24 * hour, Algorithm: alg})
			var (
				mu        sync.Mutex
				remaining []int64
				denied    int
				errs      []error
			)
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for range each {
						d, err := s.Acquire(ctx(t), name, 1)
						mu.Lock()
						switch {
						case err != nil:
							errs = append(errs, err)
						case d.Allowed:
							remaining = append(remaining, d.Remaining)
						default:
							denied++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(errs) > 0 {
				t.Fatalf("%d errors, the first: %v", len(errs), errs[0])
			}
			if len(remaining) != 100 || denied != goroutines*each-100 {
				t.Fatalf("granted %d and denied %d of %d, want 100 granted", len(remaining), denied, goroutines*each)
			}
			slices.Sort(remaining)
			for i, r := range remaining {
				if r != int64(i) {
					t.Fatalf("remaining counts of the grants: got %v, want each of 0..99 once", remaining)
				}
			}
			wantRemaining(t, s, name, 0)
		})
	}
}

// testReplenishment watches permits come back with a short period: never
// before they should, and within seconds. Every answer is checked against
// the policy's arithmetic at the instants the calls were made between (see
// Elapsed), so the checks hold, and can fail, however slow the machine.
func testReplenishment(t *testing.T, s limiter.Store) {
	const period = 200 * time.Millisecond
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			name := "r-" + string(alg)
			p := limiter.Policy{Limit: 2, Period: period, Algorithm: alg}
			put(t, s, name, p)
			t0 := time.Now()
			d := acquire(t, s, name, 2)
			t1 := time.Now()
			if !d.Allowed || d.ResetAfter != period {
				t.Fatalf("Acquire 2 of 2: got %+v, want allowed, full again after %s", d, period)
			}

			ta := time.Now()
			d = acquire(t, s, name, 2)
			e := Since(t0, t1, ta, time.Now())
			if d.Allowed {
				// Only once the first grant has left the window.
				if e.Max < period {
					t.Fatalf("4 permits granted within %s with 2 per %s", e.Max, period)
				}
				t0, t1 = ta, time.Now()
			} else if lo, hi := e.Until(period); d.RetryAfter < lo || d.RetryAfter > hi || d.RetryAfter <= 0 {
				t.Errorf("Acquire 2 of none: got %+v, want a retry time from %s to %s", d, lo, hi)
			}

			deadline := t0.Add(5 * time.Second)
			for {
				ta := time.Now()
				a := available(t, s, name)
				e := Since(t0, t1, ta, time.Now())
				if lo, hi := e.Remaining(p); a.Remaining < lo || a.Remaining > hi {
					t.Fatalf("Available after %s to %s: got %d remaining, want %d to %d", e.Min, e.Max, a.Remaining, lo, hi)
				}
				if lo, hi := e.Until(period); a.ResetAfter < lo || a.ResetAfter > hi {
					t.Fatalf("Available after %s to %s: got reset after %s, want %s to %s", e.Min, e.Max, a.ResetAfter, lo, hi)
				}
				if a.Remaining == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("permits not back after %s: %+v", time.Since(t0), a)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if d := acquire(t, s, name, 2); !d.Allowed {
				t.Errorf("Acquire 2 when full again: got %+v, want allowed", d)
			}
		})
	}
}
