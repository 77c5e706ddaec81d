package tenanttest

import (
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/storetest"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// testAllOrNothing: the product's own example. With capacity 9 and nothing
// used, a request for 10 is denied and records nothing; 5 of 9 leaves 4; a
// request for 5 more is denied with a time to retry and leaves 4.
func testAllOrNothing(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	for _, alg := range algorithms {
		for _, ip := range []string{"203.0.113.7", "2001:db8:1:2::1"} {
			t.Run(string(alg)+"/"+ip, func(t *testing.T) {
				ts := newTenants(t, policy(9, hour, alg))
				d := acquire(t, ts, ip, 10)
				if d.Allowed || !d.ExceedsCapacity || d.RetryAfter != 0 || d.Remaining != 9 || d.Permits != 10 || d.Limit != 9 || d.RegistryFull {
					t.Errorf("Acquire 10 of 9: got %+v, want denied, exceeding capacity, 9 remaining", d)
				}
				wantRemaining(t, ts, ip, 9)
				if es := lowest(t, ts, 5); len(es) != 0 {
					t.Errorf("Lowest after a denial: got %+v, want no tenant", es)
				}
				d = acquire(t, ts, ip, 5)
				if !d.Allowed || d.Remaining != 4 || d.Permits != 5 || d.RetryAfter != 0 || d.ExceedsCapacity {
					t.Errorf("Acquire 5 of 9: got %+v, want allowed, 4 remaining", d)
				}
				wantRemaining(t, ts, ip, 4)
				d = acquire(t, ts, ip, 5)
				if d.Allowed || d.ExceedsCapacity || d.RetryAfter <= 0 || d.Remaining != 4 {
					t.Errorf("Acquire 5 with 4 left: got %+v, want denied with a retry time, 4 remaining", d)
				}
				wantRemaining(t, ts, ip, 4)
				if d := acquire(t, ts, ip, 4); !d.Allowed || d.Remaining != 0 {
					t.Errorf("Acquire the last 4: got %+v, want allowed, 0 remaining", d)
				}
				if d := acquire(t, ts, ip, 1); d.Allowed || d.Remaining != 0 || d.RegistryFull {
					t.Errorf("Acquire 1 of none: got %+v, want denied", d)
				}
			})
		}
	}
}

func testAvailableNeverConsumes(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	for _, alg := range algorithms {
		ts := newTenants(t, policy(3, hour, alg))
		const ip = "192.0.2.44"
		for range 10 {
			if a := available(t, ts, ip); a.Remaining != 3 || a.Limit != 3 || a.ResetAfter != 0 {
				t.Fatalf("%s: Available of an unseen tenant: got %+v, want 3 of 3, nothing to reset", alg, a)
			}
		}
		acquire(t, ts, ip, 2)
		for range 10 {
			a := available(t, ts, ip)
			if a.Remaining != 1 || a.Limit != 3 || a.ResetAfter <= 0 || a.ResetAfter > hour {
				t.Fatalf("%s: Available after 2 of 3: got %+v, want 1 of 3 remaining, reset within an hour", alg, a)
			}
		}
		if d := acquire(t, ts, ip, 1); !d.Allowed || d.Remaining != 0 {
			t.Errorf("%s: Acquire the last one: got %+v, want allowed", alg, d)
		}
	}
}

// testGCRAFields checks every field against GCRA's arithmetic: 10 permits
// per hour is one every 6 minutes.
func testGCRAFields(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	interval := hour / 10
	ts := newTenants(t, policy(10, hour, limiter.GCRA))
	const ip = "198.51.100.20"
	// From a full bucket the backlog is exactly the cost of the grant.
	want := tenant.Decision{Tenant: ip, Decision: limiter.Decision{Allowed: true, Permits: 3, Remaining: 7, Limit: 10, ResetAfter: 3 * interval}}
	if d := acquire(t, ts, ip, 3); d != want {
		t.Errorf("Acquire 3 of 10: got %+v, want %+v", d, want)
	}
	d := acquire(t, ts, ip, 8)
	if d.Allowed || d.ExceedsCapacity || d.Remaining != 7 || d.Limit != 10 || !within(d.RetryAfter, interval) || !within(d.ResetAfter, 3*interval) {
		t.Errorf("Acquire 8 with 7 left: got %+v, want denied, retry within %s, reset within %s", d, interval, 3*interval)
	}
	a := available(t, ts, ip)
	if a.Remaining != 7 || a.Limit != 10 || !within(a.ResetAfter, 3*interval) {
		t.Errorf("Available: got %+v, want 7 of 10, reset within %s", a, 3*interval)
	}

	cfg := policy(10, hour, limiter.GCRA)
	cfg.Policy.Burst = 2
	burst := newTenants(t, cfg)
	want = tenant.Decision{Tenant: ip, Decision: limiter.Decision{Allowed: true, Permits: 2, Remaining: 0, Limit: 10, ResetAfter: 2 * interval}}
	if d := acquire(t, burst, ip, 2); d != want {
		t.Errorf("Acquire a burst of 2: got %+v, want %+v", d, want)
	}
	if d := acquire(t, burst, ip, 1); d.Allowed || d.ExceedsCapacity || !within(d.RetryAfter, interval) || !within(d.ResetAfter, 2*interval) {
		t.Errorf("Acquire 1 after the burst: got %+v, want denied, retry within %s", d, interval)
	}
}

// testSlidingLogFields: a grant counts for exactly one period.
func testSlidingLogFields(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	ts := newTenants(t, policy(3, hour, limiter.SlidingLog))
	const ip = "2001:db8:77::1"
	want := tenant.Decision{Tenant: "2001:db8:77::/64", Decision: limiter.Decision{Allowed: true, Permits: 1, Remaining: 2, Limit: 3, ResetAfter: hour}}
	if d := acquire(t, ts, ip, 1); d != want {
		t.Errorf("Acquire 1 of 3: got %+v, want %+v", d, want)
	}
	if d := acquire(t, ts, ip, 2); !d.Allowed || d.Remaining != 0 || !within(d.ResetAfter, hour) {
		t.Errorf("Acquire 2 more: got %+v, want allowed, 0 remaining, reset within an hour", d)
	}
	// The first grant leaves the window first, but it is one permit only.
	d := acquire(t, ts, ip, 2)
	if d.Allowed || d.ExceedsCapacity || d.Remaining != 0 || !within(d.RetryAfter, hour) || !within(d.ResetAfter, hour) {
		t.Errorf("Acquire 2 of none: got %+v, want denied, retry and reset within an hour", d)
	}
	a := available(t, ts, ip)
	if a.Remaining != 0 || a.Limit != 3 || !within(a.ResetAfter, hour) {
		t.Errorf("Available: got %+v, want 0 of 3, reset within an hour", a)
	}
}

func testExceedsCapacity(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	g := policy(10, hour, limiter.GCRA)
	g.Policy.Burst = 4
	for _, cfg := range []tenant.Config{g, policy(4, hour, limiter.SlidingLog)} {
		ts := newTenants(t, cfg)
		alg := ts.Policy().Algorithm
		const ip = "192.0.2.200"
		for _, n := range []int64{5, limiter.MaxLimit} {
			d := acquire(t, ts, ip, n)
			if d.Allowed || !d.ExceedsCapacity || d.RetryAfter != 0 || d.Remaining != 4 {
				t.Errorf("%s: Acquire %d of capacity 4: got %+v, want denied, exceeding capacity, no retry time", alg, n, d)
			}
		}
		if d := acquire(t, ts, ip, 4); !d.Allowed {
			t.Errorf("%s: Acquire the whole capacity: got %+v, want allowed", alg, d)
		}
		// Exceeding the capacity does not depend on the state.
		if d := acquire(t, ts, ip, 5); !d.ExceedsCapacity || d.RetryAfter != 0 || d.Remaining != 0 {
			t.Errorf("%s: Acquire 5 when empty: got %+v, want exceeding capacity", alg, d)
		}
		if d := acquire(t, ts, ip, 1); d.Allowed || d.ExceedsCapacity || d.RetryAfter <= 0 {
			t.Errorf("%s: Acquire 1 when empty: got %+v, want denied with a retry time", alg, d)
		}
	}
}

// testConcurrentAcquire: many goroutines take one permit each from one
// tenant's limit of 100, while others read; exactly 100 are granted, and
// the grants report every remaining count from 99 down to 0 once, as if
// they had run one after another.
func testConcurrentAcquire(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	const goroutines, each = 20, 10
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			// A day-long period: nothing replenishes while the test runs.
			ts := newTenants(t, policy(100, 24*hour, alg))
			const ip = "2001:db8:c0::1"
			var (
				mu        sync.Mutex
				remaining []int64
				denied    int
				errs      []error
			)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range each {
						// Every host of the /64 is the same tenant.
						d, err := ts.Acquire(ctx(t), "2001:db8:c0::"+strconv.Itoa(1+g*each+i), 1)
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
			for range 2 {
				wg.Go(func() {
					for range each {
						if _, err := ts.Lowest(ctx(t), 10); err != nil {
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
						}
						if _, err := ts.Available(ctx(t), ip); err != nil {
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
						}
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
			wantRemaining(t, ts, ip, 0)
			if es := lowest(t, ts, 10); len(es) != 1 || es[0].Tenant != "2001:db8:c0::/64" || es[0].Remaining != 0 {
				t.Errorf("Lowest(10): got %+v, want 2001:db8:c0::/64 with nothing left", es)
			}
		})
	}
}

// testReplenishment watches permits come back with a short period, never
// before they should and within seconds, and the tenant leave the Lowest
// answer once its bucket is full. Every answer is checked against the
// policy's arithmetic at the instants the calls were made between (see
// storetest.Elapsed), so the checks hold, and can fail, however slow the
// machine.
func testReplenishment(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	const period = 200 * time.Millisecond
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			cfg := policy(2, period, alg)
			p := cfg.Policy
			ts := newTenants(t, cfg)
			const ip = "203.0.113.99"
			t0 := time.Now()
			d := acquire(t, ts, ip, 2)
			t1 := time.Now()
			if !d.Allowed || d.ResetAfter != period {
				t.Fatalf("Acquire 2 of 2: got %+v, want allowed, full again after %s", d, period)
			}

			ta := time.Now()
			es := lowest(t, ts, 5)
			e := storetest.Since(t0, t1, ta, time.Now())
			switch {
			case len(es) == 0:
				// Only once the bucket is full again.
				if e.Max < period {
					t.Errorf("Lowest(5) %s to %s after the grant: got no tenant, want %s", e.Min, e.Max, ip)
				}
			case len(es) != 1 || es[0].Tenant != ip:
				t.Errorf("Lowest(5): got %+v, want %s alone", es, ip)
			default:
				lo, hi := e.Remaining(p)
				rlo, rhi := e.Until(period)
				if es[0].Remaining < lo || es[0].Remaining > hi || es[0].ResetAfter < rlo || es[0].ResetAfter > rhi {
					t.Errorf("Lowest(5) %s to %s after the grant: got %+v, want %d to %d left, reset in %s to %s", e.Min, e.Max, es[0], lo, hi, rlo, rhi)
				}
			}

			ta = time.Now()
			d = acquire(t, ts, ip, 2)
			e = storetest.Since(t0, t1, ta, time.Now())
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
				a := available(t, ts, ip)
				e := storetest.Since(t0, t1, ta, time.Now())
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
			if es := lowest(t, ts, 5); len(es) != 0 {
				t.Errorf("Lowest(5) once the bucket is full again: got %+v, want no tenant", es)
			}
			if d := acquire(t, ts, ip, 2); !d.Allowed {
				t.Errorf("Acquire 2 when full again: got %+v, want allowed", d)
			}
		})
	}
}
