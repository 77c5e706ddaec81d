package tenanttest

import (
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// testLowestOrder: fewest permits left first; among equal counts the
// tenant that recovers later, then the smaller key (IPv6 prefixes before
// IPv4 addresses). Tenants with a full bucket are never listed.
func testLowestOrder(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			ts := newTenants(t, policy(10, hour, alg))
			if es := lowest(t, ts, 5); len(es) != 0 {
				t.Fatalf("Lowest of no tenants: got %+v, want none", es)
			}
			// In this order: 192.0.2.1 ties with 192.0.2.9, acquires
			// later (recovers later) and has the smaller key.
			steps := []struct {
				ip string
				n  int64
			}{
				{"192.0.2.9", 3}, {"2001:db8::1", 7}, {"192.0.2.1", 3}, {"192.0.2.5", 1},
				{"198.51.100.7", 10}, {"2001:db8:0:9::1", 4}, {"192.0.2.77", 5},
			}
			for _, s := range steps {
				if d := acquire(t, ts, s.ip, s.n); !d.Allowed {
					t.Fatalf("Acquire(%q, %d): got %+v, want allowed", s.ip, s.n, d)
				}
			}
			acquire(t, ts, "192.0.2.77", 6)   // denied: changes nothing
			acquire(t, ts, "203.0.113.1", 11) // exceeds capacity: never listed
			acquire(t, ts, "192.0.2.5", 100)  // likewise
			want := []tenant.Entry{
				{Tenant: "198.51.100.7", Remaining: 0},
				{Tenant: "2001:db8::/64", Remaining: 3},
				{Tenant: "192.0.2.77", Remaining: 5},
				{Tenant: "2001:db8:0:9::/64", Remaining: 6},
				{Tenant: "192.0.2.1", Remaining: 7},
				{Tenant: "192.0.2.9", Remaining: 7},
				{Tenant: "192.0.2.5", Remaining: 9},
			}
			interval := hour / 10
			taken := map[string]int64{}
			for _, s := range steps {
				taken[s.ip] = s.n
			}
			for _, k := range []int{1, 3, 7, 8, tenant.MaxLowest} {
				got := lowest(t, ts, k)
				if len(got) != min(k, len(want)) {
					t.Fatalf("Lowest(%d): got %d tenants %+v, want %d", k, len(got), got, min(k, len(want)))
				}
				for i, e := range got {
					w := want[i]
					resetMax := hour
					if alg == limiter.GCRA {
						resetMax = time.Duration(10-w.Remaining) * interval
					}
					if e.Tenant != w.Tenant || e.Remaining != w.Remaining || e.Limit != 10 || !within(e.ResetAfter, resetMax) {
						t.Errorf("Lowest(%d)[%d]: got %+v, want %s with %d of 10 left, reset within %s", k, i, e, w.Tenant, w.Remaining, resetMax)
					}
				}
			}
			// The tie: the later acquisition recovers later.
			if es := lowest(t, ts, 6); len(es) == 6 && es[4].ResetAfter < es[5].ResetAfter {
				t.Errorf("tied tenants: %+v resets before %+v, want it listed second", es[4], es[5])
			}
		})
	}
}

// testLowestBounds: k from 1 to MaxLowest, never more tenants than exist,
// and exactly k when more exist.
func testLowestBounds(t *testing.T, newTenants func(*testing.T, tenant.Config) Tenants) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			ts := newTenants(t, policy(50, hour, alg))
			const tenants = 40
			for i := range tenants {
				// Tenant i takes i+1 permits: tenant 39 has the fewest left.
				acquire(t, ts, "10.1.0."+itoa(int64(i)), int64(i+1))
			}
			for _, k := range []int{1, 2, 17, tenants - 1, tenants, tenants + 1, tenant.MaxLowest} {
				es := lowest(t, ts, k)
				if len(es) != min(k, tenants) {
					t.Fatalf("Lowest(%d): got %d tenants, want %d", k, len(es), min(k, tenants))
				}
				for i, e := range es {
					if wantIP := "10.1.0." + itoa(int64(tenants-1-i)); e.Tenant != wantIP || e.Remaining != int64(50-tenants+i) {
						t.Fatalf("Lowest(%d)[%d]: got %+v, want %s with %d left", k, i, e, wantIP, 50-tenants+i)
					}
				}
			}
		})
	}
}
