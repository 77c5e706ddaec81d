package e2e

import (
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/client"
)

// tenantLimit and tenantPeriod are the per-IP policy of TestTenants: one
// permit refills every 6 minutes, so remaining capacity does not change
// while the test runs.
const (
	tenantLimit  = 10
	tenantPeriod = time.Hour
)

// TestTenants takes permits per requester IP, and lists the tenants with
// the least capacity left. It has a container of its own: the list covers
// every tenant of the server.
func TestTenants(t *testing.T) {
	t.Parallel()
	svc := startService(t, map[string]string{
		"RATELIMITER_TENANT_LIMIT":  "10",
		"RATELIMITER_TENANT_PERIOD": "1h",
	})
	api := svc.api
	ctx := t.Context()

	t.Run("policy", func(t *testing.T) {
		res, err := api.GetTenantPolicyWithResponse(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.JSON200 == nil {
			t.Fatalf("policy: got %d %s, want 200", res.StatusCode(), res.Body)
		}
		got := *res.JSON200
		if got.Limit != tenantLimit || got.Period != "1h0m0s" || got.Algorithm != client.AlgorithmGcra || got.Burst == nil || *got.Burst != tenantLimit {
			t.Errorf("policy: got %s, want limit 10, period 1h0m0s, gcra, burst 10", res.Body)
		}
	})

	// The steps run in order; what each leaves behind is listed in
	// wantLowest below.
	steps := []struct {
		name          string
		ip            string
		permits       int64 // 0: only ask what is available
		wantTenant    string
		wantAllowed   bool
		wantRemaining int64 // after the step
	}{
		{"IPv4 never seen is full", "198.51.100.1", 0, "198.51.100.1", false, 10},
		{"IPv4 grant", "203.0.113.7", 3, "203.0.113.7", true, 7},
		{"IPv4 denial takes nothing", "203.0.113.7", 8, "203.0.113.7", false, 7},
		{"IPv4 other address is another tenant", "203.0.113.8", 9, "203.0.113.8", true, 1},
		{"IPv4-mapped IPv6 is the IPv4 tenant", "::ffff:203.0.113.7", 2, "203.0.113.7", true, 5},
		{"IPv6 grant to the /64", "2001:db8:1:2::7", 4, "2001:db8:1:2::/64", true, 6},
		{"IPv6 same /64 shares the limit", "2001:db8:1:2:ffff:ffff:ffff:1", 0, "2001:db8:1:2::/64", false, 6},
		{"IPv6 written otherwise is the same tenant", "2001:DB8:1:2:0:0:0:9", 2, "2001:db8:1:2::/64", true, 4},
		{"IPv6 next /64 is another tenant", "2001:db8:1:3::7", 0, "2001:db8:1:3::/64", false, 10},
		{"IPv6 another /64 grant", "2001:db8:ffff::1", 1, "2001:db8:ffff::/64", true, 9},
		{"IPv6 more than the limit exceeds capacity", "2001:db8:ffff::2", 11, "2001:db8:ffff::/64", false, 9},
		{"IPv6 loopback", "::1", 8, "::/64", true, 2},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if s.permits > 0 {
				res, err := api.AcquireTenantWithResponse(ctx, s.ip, client.AcquireRequest{Permits: &s.permits})
				if err != nil {
					t.Fatal(err)
				}
				if res.JSON200 == nil {
					t.Fatalf("acquire: got %d %s, want 200", res.StatusCode(), res.Body)
				}
				d := res.JSON200
				if d.Tenant != s.wantTenant || d.Allowed != s.wantAllowed || d.Remaining != s.wantRemaining || d.Permits != s.permits || d.Limit != tenantLimit {
					t.Errorf("acquire %d for %s: got %s, want tenant %s, allowed %v, remaining %d, limit %d",
						s.permits, s.ip, res.Body, s.wantTenant, s.wantAllowed, s.wantRemaining, tenantLimit)
				}
				wantExceeds := s.permits > tenantLimit
				if d.ExceedsCapacity != wantExceeds || (!d.Allowed && !wantExceeds) != (d.RetryAfterMs != nil) {
					t.Errorf("acquire %d for %s: got exceeds capacity %v, retry after %v; want exceeds capacity %v and a retry time only on a denial that waiting fixes",
						s.permits, s.ip, d.ExceedsCapacity, d.RetryAfterMs, wantExceeds)
				}
				checkRateLimitHeaders(t, res.Headers200.RateLimitPolicy, res.Headers200.RateLimit, res.Headers200.RetryAfter, limitState{
					name: "tenant", limit: tenantLimit, periodSec: 3600, remaining: d.Remaining, resetMs: d.ResetAfterMs, retryMs: d.RetryAfterMs,
				})
			}
			res, err := api.GetTenantAvailableWithResponse(ctx, s.ip)
			if err != nil {
				t.Fatal(err)
			}
			if res.JSON200 == nil {
				t.Fatalf("available: got %d %s, want 200", res.StatusCode(), res.Body)
			}
			a := res.JSON200
			if a.Tenant != s.wantTenant || a.Remaining != s.wantRemaining || a.Limit != tenantLimit {
				t.Errorf("available for %s: got %s, want tenant %s, remaining %d, limit %d", s.ip, res.Body, s.wantTenant, s.wantRemaining, tenantLimit)
			}
			checkTenantReset(t, a.Remaining, a.ResetAfterMs)
			checkRateLimitHeaders(t, res.Headers200.RateLimitPolicy, res.Headers200.RateLimit, nil, limitState{
				name: "tenant", limit: tenantLimit, periodSec: 3600, remaining: a.Remaining, resetMs: a.ResetAfterMs,
			})
		})
	}

	// Every tenant that is not full, fewest permits left first. Tenants
	// only asked about (still full) are left out.
	wantLowest := []struct {
		tenant    string
		remaining int64
	}{
		{"203.0.113.8", 1},
		{"::/64", 2},
		{"2001:db8:1:2::/64", 4},
		{"203.0.113.7", 5},
		{"2001:db8:ffff::/64", 9},
	}
	for _, tc := range []struct {
		name string
		k    *int32
		want int
	}{
		{"default k", nil, len(wantLowest)},
		{"k=1", ptr[int32](1), 1},
		{"k=3", ptr[int32](3), 3},
		{"k=1000", ptr[int32](1000), len(wantLowest)},
	} {
		t.Run("lowest "+tc.name, func(t *testing.T) {
			res, err := api.ListLowestTenantsWithResponse(ctx, &client.ListLowestTenantsParams{K: tc.k})
			if err != nil {
				t.Fatal(err)
			}
			if res.JSON200 == nil {
				t.Fatalf("lowest: got %d %s, want 200", res.StatusCode(), res.Body)
			}
			got := res.JSON200
			if len(got.Items) != tc.want {
				t.Fatalf("lowest: got %d tenants %s, want %d", len(got.Items), res.Body, tc.want)
			}
			for i, e := range got.Items {
				w := wantLowest[i]
				if e.Tenant != w.tenant || e.Remaining != w.remaining || e.Limit != tenantLimit {
					t.Errorf("lowest[%d]: got %+v, want tenant %s with %d remaining of %d", i, e, w.tenant, w.remaining, tenantLimit)
				}
				checkTenantReset(t, e.Remaining, e.ResetAfterMs)
			}
			if p := got.Policy; p.Limit != tenantLimit || p.Period != "1h0m0s" || p.Algorithm != client.AlgorithmGcra {
				t.Errorf("lowest: policy: got %+v, want limit 10, period 1h0m0s, gcra", p)
			}
		})
	}

	// The tenant keys lowest answers, IPv6 prefixes included, name the
	// same tenants when passed back through the client (which escapes the
	// slash of a prefix as %2F).
	t.Run("keys from lowest passed back", func(t *testing.T) {
		for _, w := range wantLowest {
			res, err := api.GetTenantAvailableWithResponse(ctx, w.tenant)
			if err != nil {
				t.Fatal(err)
			}
			if res.JSON200 == nil || res.JSON200.Tenant != w.tenant || res.JSON200.Remaining != w.remaining {
				t.Errorf("available for key %s: got %d %s, want tenant %s with %d remaining", w.tenant, res.StatusCode(), res.Body, w.tenant, w.remaining)
			}
		}
		one := int64(1)
		res, err := api.AcquireTenantWithResponse(ctx, "2001:db8:ffff::/64", client.AcquireRequest{Permits: &one})
		if err != nil {
			t.Fatal(err)
		}
		if res.JSON200 == nil || res.JSON200.Tenant != "2001:db8:ffff::/64" || !res.JSON200.Allowed || res.JSON200.Remaining != 8 {
			t.Errorf("acquire 1 for key 2001:db8:ffff::/64: got %d %s, want granted with 8 remaining", res.StatusCode(), res.Body)
		}
	})
}

// checkTenantReset asserts that a tenant with remaining permits of the
// TestTenants policy is full again within the time its missing permits take
// to refill, and not before the last but one of them is back.
func checkTenantReset(t *testing.T, remaining, resetMs int64) {
	t.Helper()
	perPermit := (tenantPeriod / tenantLimit).Milliseconds()
	missing := tenantLimit - remaining
	lo, hi := max(0, (missing-1)*perPermit), missing*perPermit
	if resetMs < lo || resetMs > hi || (missing == 0 && resetMs != 0) {
		t.Errorf("reset_after_ms: got %d with %d of %d remaining, want between %d and %d", resetMs, remaining, tenantLimit, lo, hi)
	}
}
