package httpapi

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestTenantKeysRoundTrip passes the tenant keys lowest answers back to
// available and acquire, with the slash of an IPv6 prefix escaped as a
// client might: they must name the same tenants.
//
// It runs with the hand-written validation only: kin-openapi checks path
// parameters as sent, escaped (kin-openapi issue 1089), so with it every
// IPv6 tenant fails the pattern on its %2F.
func TestTenantKeysRoundTrip(t *testing.T) {
	e := newEnv(t, nil)
	for ip, permits := range map[string]int64{"2001:db8:1:2::7": 30, "203.0.113.7": 10} {
		res, err := e.c.AcquireTenantWithResponse(ctx, ip, client.AcquireRequest{Permits: &permits})
		if err != nil {
			t.Fatal(err)
		}
		if res.JSON200 == nil || !res.JSON200.Allowed {
			t.Fatalf("acquire %d for %s: got %d %s, want allowed", permits, ip, res.StatusCode(), res.Body)
		}
	}
	low, err := e.c.ListLowestTenantsWithResponse(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if low.JSON200 == nil {
		t.Fatalf("lowest: got %d %s", low.StatusCode(), low.Body)
	}
	var keys []string
	for _, it := range low.JSON200.Items {
		keys = append(keys, it.Tenant)
	}
	if want := []string{"2001:db8:1:2::/64", "203.0.113.7"}; !slices.Equal(keys, want) {
		t.Fatalf("lowest: got %v, want %v", keys, want)
	}

	remaining := map[string]int64{"2001:db8:1:2::/64": 70, "203.0.113.7": 90}
	for _, key := range keys {
		upper := url.PathEscape(key) // %2F
		for _, spelling := range []string{upper, strings.ReplaceAll(upper, "%2F", "%2f")} {
			res, body := e.raw(http.MethodGet, "/v1/tenants/"+spelling+"/available", "", "")
			var a client.TenantAvailability
			if res.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil {
				t.Fatalf("available %s: got %d %s, want 200", spelling, res.StatusCode, body)
			}
			if a.Tenant != key || a.Remaining != remaining[key] {
				t.Errorf("available %s: got tenant %s with %d left, want %s with %d", spelling, a.Tenant, a.Remaining, key, remaining[key])
			}
			res, body = e.raw(http.MethodPost, "/v1/tenants/"+spelling+"/acquire", "application/json", `{"permits":1}`)
			var d client.TenantDecision
			if res.StatusCode != http.StatusOK || json.Unmarshal(body, &d) != nil {
				t.Fatalf("acquire %s: got %d %s, want 200", spelling, res.StatusCode, body)
			}
			remaining[key]--
			if d.Tenant != key || !d.Allowed || d.Remaining != remaining[key] {
				t.Errorf("acquire %s: got tenant %s allowed %v with %d left, want %s allowed with %d", spelling, d.Tenant, d.Allowed, d.Remaining, key, remaining[key])
			}
		}
		// The generated client escapes the key itself.
		res, err := e.c.GetTenantAvailableWithResponse(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if res.JSON200 == nil || res.JSON200.Tenant != key || res.JSON200.Remaining != remaining[key] {
			t.Errorf("available %s through the client: got %d %s, want %s with %d left", key, res.StatusCode(), res.Body, key, remaining[key])
		}
	}
}

// TestTenantKeyForms checks which prefix forms name a tenant: only the
// configured IPv6 prefix length, host bits cleared. As above, with the
// hand-written validation only.
func TestTenantKeyForms(t *testing.T) {
	e := newEnv(t, nil)
	for _, ok := range []struct{ ip, tenant string }{
		{"2001:db8::%2F64", "2001:db8::/64"},
		{"2001:DB8::%2f64", "2001:db8::/64"},
		{"2001:db8::1:2:3:4%2F64", "2001:db8::/64"},
		{"::%2F64", "::/64"},
		{"2001%3Adb8%3A%3A%2F64", "2001:db8::/64"},
		{"2001:db8::%2F6%34", "2001:db8::/64"},
	} {
		res, body := e.raw(http.MethodGet, "/v1/tenants/"+ok.ip+"/available", "", "")
		var a client.TenantAvailability
		if res.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil || a.Tenant != ok.tenant {
			t.Errorf("%s: got %d %s, want 200 for tenant %s", ok.ip, res.StatusCode, body, ok.tenant)
		}
	}
	for _, bad := range []string{
		"2001:db8::%2F48", "2001:db8::%2F80", "2001:db8::%2F128", "2001:db8::%2F0", "2001:db8::%2F064",
		"2001:db8::%2F", "2001:db8::%2Fx", "%2F64", "203.0.113.7%2F32", "203.0.113.0%2F24",
		"::ffff:203.0.113.7%2F64", "ff02::%2F64", "2001:db8::%2F64%2F64", "2001:db8::%2F64%2F",
		"2001:db8::%252F64", "2001:db8:0:0:0:0:0:0:0%2F64",
	} {
		for _, path := range []string{"/v1/tenants/" + bad + "/available", "/v1/tenants/" + bad + "/acquire"} {
			method := http.MethodGet
			if strings.HasSuffix(path, "/acquire") {
				method = http.MethodPost
			}
			res, body := e.raw(method, path, "", "")
			p := checkProblem(t, res, body, http.StatusBadRequest)
			if got := fieldLocations(p); !slices.Equal(got, []string{"path.ip"}) {
				t.Errorf("%s %s: got locations %v, want [path.ip]", method, path, got)
			}
		}
	}
	if low := e.tenants.Stats().Tenants; low != 0 {
		t.Errorf("refused keys left %d tenants, want 0", low)
	}
}
