// Package tenanttest is the behavioural suite every per-IP tenant backend
// must pass, whatever keeps its state: naming and grouping of addresses,
// decisions (all or nothing, Available without consuming, both algorithms,
// capacity), invalid input, the lowest-remaining query, concurrency and
// replenishment.
//
// A shared backend reads the time from its server, so the suite never
// injects a clock. It uses long periods (an hour) wherever nothing may
// replenish during a test, and short ones (a few hundred milliseconds) only
// to see permits come back, checking each answer against the instants
// measured around its call (see storetest.Elapsed), so that the checks
// neither flake nor pass vacuously on a slow machine. Where two tenants tie, the one that acquired later also
// has the smaller key, so the expected order holds even if the clock did
// not move between the two acquisitions.
package tenanttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// Tenants is what the suite drives: the methods tenant.Registry has.
type Tenants interface {
	Acquire(ctx context.Context, ip string, permits int64) (tenant.Decision, error)
	Available(ctx context.Context, ip string) (tenant.Availability, error)
	Lowest(ctx context.Context, k int) ([]tenant.Entry, error)
	Policy() limiter.Policy
	Tenant(ip string) (string, error)
}

// Run runs the suite. newTenants must return a new backend with no tenant
// for cfg on every call, released by t's cleanup; the subtests run in
// parallel, each on backends of its own.
func Run(t *testing.T, newTenants func(t *testing.T, cfg tenant.Config) Tenants) {
	tests := []struct {
		name string
		run  func(t *testing.T, newTenants func(t *testing.T, cfg tenant.Config) Tenants)
	}{
		{"PolicyIsNormalized", testPolicy},
		{"TenantNames", testTenantNames},
		{"Grouping", testGrouping},
		{"InvalidInput", testInvalidInput},
		{"AllOrNothing", testAllOrNothing},
		{"AvailableNeverConsumes", testAvailableNeverConsumes},
		{"GCRADecisionFields", testGCRAFields},
		{"SlidingLogDecisionFields", testSlidingLogFields},
		{"ExceedsCapacity", testExceedsCapacity},
		{"LowestOrder", testLowestOrder},
		{"LowestBounds", testLowestBounds},
		{"ConcurrentAcquire", testConcurrentAcquire},
		{"Replenishment", testReplenishment},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, newTenants)
		})
	}
}

// hour is the period of every policy that must not replenish during a test.
const hour = time.Hour

// slack bounds how much time a test may take between two calls that it
// compares: far more than any call takes, far less than the hour-long
// periods.
const slack = time.Minute

// within reports whether d lies in (want-slack, want].
func within(d, want time.Duration) bool { return d <= want && d > want-slack }

var algorithms = []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func policy(limit int64, period time.Duration, alg limiter.Algorithm) tenant.Config {
	return tenant.Config{Policy: limiter.Policy{Limit: limit, Period: period, Algorithm: alg}}
}

func acquire(t *testing.T, ts Tenants, ip string, n int64) tenant.Decision {
	t.Helper()
	d, err := ts.Acquire(ctx(t), ip, n)
	if err != nil {
		t.Fatalf("Acquire(%q, %d): %v", ip, n, err)
	}
	return d
}

func available(t *testing.T, ts Tenants, ip string) tenant.Availability {
	t.Helper()
	a, err := ts.Available(ctx(t), ip)
	if err != nil {
		t.Fatalf("Available(%q): %v", ip, err)
	}
	return a
}

func lowest(t *testing.T, ts Tenants, k int) []tenant.Entry {
	t.Helper()
	es, err := ts.Lowest(ctx(t), k)
	if err != nil {
		t.Fatalf("Lowest(%d): %v", k, err)
	}
	return es
}

func wantRemaining(t *testing.T, ts Tenants, ip string, want int64) {
	t.Helper()
	if got := available(t, ts, ip).Remaining; got != want {
		t.Errorf("Available(%q).Remaining: got %d, want %d", ip, got, want)
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want one wrapping %v", what, err, want)
	}
}

func testPolicy(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	ts := newTenants(t, policy(9, time.Minute, ""))
	want := limiter.Policy{Limit: 9, Period: time.Minute, Algorithm: limiter.GCRA, Burst: 9}
	if got := ts.Policy(); got != want {
		t.Errorf("Policy(): got %+v, want %+v", got, want)
	}
	ts = newTenants(t, policy(9, time.Minute, limiter.SlidingLog))
	want = limiter.Policy{Limit: 9, Period: time.Minute, Algorithm: limiter.SlidingLog}
	if got := ts.Policy(); got != want {
		t.Errorf("Policy(): got %+v, want %+v", got, want)
	}
}

// testTenantNames: every answer names the tenant as Tenant does.
func testTenantNames(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	cfg := policy(9, hour, "")
	cfg.IPv6Prefix = 48
	ts := newTenants(t, cfg)
	for _, tc := range []struct{ ip, want string }{
		{"203.0.113.7", "203.0.113.7"},
		{"::ffff:203.0.113.7", "203.0.113.7"},
		{"2001:db8:1:2::1", "2001:db8:1::/48"},
		{"2001:db8:1::/48", "2001:db8:1::/48"},
	} {
		if got, err := ts.Tenant(tc.ip); err != nil || got != tc.want {
			t.Errorf("Tenant(%q): got %q, %v, want %q", tc.ip, got, err, tc.want)
		}
		if got := acquire(t, ts, tc.ip, 1).Tenant; got != tc.want {
			t.Errorf("Acquire(%q).Tenant: got %q, want %q", tc.ip, got, tc.want)
		}
		if got := available(t, ts, tc.ip).Tenant; got != tc.want {
			t.Errorf("Available(%q).Tenant: got %q, want %q", tc.ip, got, tc.want)
		}
	}
	es := lowest(t, ts, 10)
	if len(es) != 2 || es[0].Tenant != "2001:db8:1::/48" || es[1].Tenant != "203.0.113.7" {
		t.Errorf("Lowest(10): got %+v, want 2001:db8:1::/48 then 203.0.113.7", es)
	}
}

// testGrouping: IPv4-mapped IPv6 is its IPv4 address, and the hosts of one
// IPv6 prefix share a bucket, at the default /64 and at /48.
func testGrouping(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			ts := newTenants(t, policy(9, hour, alg))
			acquire(t, ts, "198.51.100.1", 2)
			acquire(t, ts, "::ffff:198.51.100.1", 3)
			wantRemaining(t, ts, "198.51.100.1", 4)
			wantRemaining(t, ts, "198.51.100.2", 9)
			acquire(t, ts, "2001:db8:0:1::1", 1)
			acquire(t, ts, "2001:db8:0:1:ffff:ffff:ffff:ffff", 1)
			wantRemaining(t, ts, "2001:db8:0:1::2", 7)
			wantRemaining(t, ts, "2001:db8:0:2::1", 9)

			cfg := policy(9, hour, alg)
			cfg.IPv6Prefix = 48
			wide := newTenants(t, cfg)
			acquire(t, wide, "2001:db8:5:1::9", 2)
			acquire(t, wide, "2001:db8:5:2::9", 2)
			wantRemaining(t, wide, "2001:db8:5:ffff::1", 5)
			wantRemaining(t, wide, "2001:db8:6::1", 9)
		})
	}
}

func testInvalidInput(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			ts := newTenants(t, policy(9, hour, alg))
			acquire(t, ts, "203.0.113.7", 2)
			for _, n := range []int64{0, -1, limiter.MaxLimit + 1} {
				_, err := ts.Acquire(ctx(t), "203.0.113.7", n)
				wantErr(t, "Acquire with permits "+itoa(n), err, limiter.ErrInvalidPermits)
			}
			for _, ip := range []string{"", "garbage", "fe80::1%eth0", "ff02::1", "::", "0.0.0.0", "10.0.0.0/8", "2001:db8::/32", "203.0.113.7 "} {
				_, err := ts.Acquire(ctx(t), ip, 1)
				wantErr(t, "Acquire("+ip+")", err, tenant.ErrInvalidIP)
				_, err = ts.Available(ctx(t), ip)
				wantErr(t, "Available("+ip+")", err, tenant.ErrInvalidIP)
				_, err = ts.Tenant(ip)
				wantErr(t, "Tenant("+ip+")", err, tenant.ErrInvalidIP)
			}
			for _, k := range []int{0, -1, tenant.MaxLowest + 1} {
				_, err := ts.Lowest(ctx(t), k)
				wantErr(t, "Lowest("+itoa(int64(k))+")", err, tenant.ErrInvalidK)
			}
			wantRemaining(t, ts, "203.0.113.7", 7)
			if es := lowest(t, ts, 5); len(es) != 1 || es[0].Remaining != 7 {
				t.Errorf("Lowest(5) after invalid calls: got %+v, want the one tenant with 7 left", es)
			}
		})
	}
}
