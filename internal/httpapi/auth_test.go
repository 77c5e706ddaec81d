package httpapi

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/ratelimiter/ratelimiter/api"
	"github.com/ratelimiter/ratelimiter/internal/auth"
	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The tokens of TestScopes, one per scope.
const (
	adminToken  = "admin-0123456789"
	decideToken = "decide-0123456789"
	adjustToken = "adjust-0123456789"
)

// scoped is a request to every operation that requires a scope.
var scoped = []struct {
	op, method, path, body string
}{
	{"putLimiter", http.MethodPut, "/v1/limiters/other", `{"limit":5,"period":"1h"}`},
	{"deleteLimiter", http.MethodDelete, "/v1/limiters/pay", ""},
	{"listLimiters", http.MethodGet, "/v1/limiters", ""},
	{"getLimiter", http.MethodGet, "/v1/limiters/pay", ""},
	{"getTenantPolicy", http.MethodGet, "/v1/tenants/policy", ""},
	{"acquire", http.MethodPost, "/v1/limiters/pay/acquire", `{"permits":1}`},
	{"getAvailable", http.MethodGet, "/v1/limiters/pay/available", ""},
	{"listLowestKeys", http.MethodGet, "/v1/limiters/pay/lowest", ""},
	{"acquireBatch", http.MethodPost, "/v1/acquire", `{"acquisitions":[{"limiter":"pay","permits":1}]}`},
	{"decide", http.MethodPost, "/v1/decide", `{"items":[{"limiter":"pay","permits":1}]}`},
	{"peek", http.MethodPost, "/v1/peek", `{"items":[{"limiter":"pay","permits":1}]}`},
	{"reserve", http.MethodPost, "/v1/reservations", `{"items":[{"limiter":"pay","permits":1}]}`},
	{"acquireTenant", http.MethodPost, "/v1/tenants/192.0.2.1/acquire", `{"permits":1}`},
	{"getTenantAvailable", http.MethodGet, "/v1/tenants/192.0.2.1/available", ""},
	{"listLowestTenants", http.MethodGet, "/v1/tenants/lowest", ""},
	{"forwardAuth", http.MethodGet, "/v1/forward-auth", ""},
	{"charge", http.MethodPost, "/v1/charge", `{"items":[{"limiter":"pay","permits":2}]}`},
	{"refund", http.MethodPost, "/v1/refund", `{"items":[{"limiter":"pay","permits":2}]}`},
	{"settleReservation", http.MethodPost, "/v1/reservations/g.x/settle", `{"items":[{"limiter":"pay","permits":0}]}`},
	{"cancelReservation", http.MethodDelete, "/v1/reservations/g.x", ""},
}

// tokenOf returns the token of TestScopes that holds scope.
func tokenOf(scope auth.Scope) string {
	switch {
	case scope&auth.Decide != 0:
		return decideToken
	case scope&auth.Admin != 0:
		return adminToken
	default:
		return adjustToken
	}
}

// With a token for every scope, every operation but the probes and the
// contract takes a token with its scope: without one it is answered 401,
// with a token lacking it 403, and nothing is taken or given back.
func TestScopes(t *testing.T) {
	guard := auth.NewGuard([]auth.Token{
		auth.NewToken("ops", adminToken, auth.Admin),
		auth.NewToken("app", decideToken, auth.Decide),
		auth.NewToken("billing", adjustToken, auth.Adjust),
	})
	e := newEnv(t, func(o *Options) {
		o.Guard = guard
		o.ForwardAuth = forwardauth.NewService(forwardauth.Config{DenyStatus: 429, Rules: []forwardauth.Rule{
			{Limiter: "pay", Key: forwardauth.ByRoute, Permits: 1},
		}}, nil, false)
	})
	ctx := context.Background()
	if _, err := e.limiters.Put(ctx, limiter.Definition{Name: "pay", Group: "g", Policy: limiter.Policy{Limit: 5, Period: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.limiters.Acquire(ctx, "pay", 3); err != nil {
		t.Fatal(err)
	}
	state := func() (int64, int64) {
		t.Helper()
		a, err := e.limiters.Available(ctx, "pay")
		if err != nil {
			t.Fatal(err)
		}
		ta, err := e.tenants.Available(ctx, "192.0.2.1")
		if err != nil {
			t.Fatal(err)
		}
		return a.Remaining, ta.Remaining
	}
	payBefore, tenantBefore := state()

	// Every operation that requires a scope is here.
	doc, err := openapi3.NewLoader().LoadFromData(api.Spec)
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, r := range scoped {
		covered[r.op] = true
	}
	for _, item := range doc.Paths.Map() {
		for _, o := range item.Operations() {
			if _, ok := auth.Required(o.OperationID); ok && !covered[o.OperationID] {
				t.Errorf("%s requires a scope, but this test does not call it", o.OperationID)
			}
		}
	}

	for _, r := range scoped {
		need, _ := auth.Required(r.op)
		wrong := adjustToken
		if need&auth.Adjust != 0 {
			wrong = decideToken
		}
		ct := ""
		if r.body != "" {
			ct = "application/json"
		}
		for _, tc := range []struct {
			who, header  string
			status       int
			authenticate string
		}{
			{"no token", "", http.StatusUnauthorized, realm},
			{"basic", "Basic " + tokenOf(need), http.StatusUnauthorized, realm},
			{"an unknown token", "Bearer forged-token", http.StatusUnauthorized, realm + `, error="invalid_token"`},
			{"a token without the scope", "Bearer " + wrong, http.StatusForbidden, realm + `, error="insufficient_scope", scope="` + need.String() + `"`},
		} {
			t.Run(r.op+"/"+tc.who, func(t *testing.T) {
				var hdr []string
				if tc.header != "" {
					hdr = []string{"Authorization", tc.header}
				}
				res, body := e.raw(r.method, r.path, ct, r.body, hdr...)
				if r.op == "forwardAuth" && tc.status == http.StatusForbidden {
					// Bodiless denials are forward-auth's; this 403 has a problem.
					if res.StatusCode != tc.status {
						t.Fatalf("status: got %d, want %d", res.StatusCode, tc.status)
					}
				} else {
					checkProblem(t, res, body, tc.status)
				}
				if got := res.Header.Get("WWW-Authenticate"); got != tc.authenticate {
					t.Errorf("WWW-Authenticate: got %q, want %q", got, tc.authenticate)
				}
				for _, secret := range []string{"forged-token", decideToken, adjustToken, adminToken} {
					if strings.Contains(string(body), secret) {
						t.Errorf("the problem quotes a token: %s", body)
					}
				}
			})
		}
	}
	if pay, tenant := state(); pay != payBefore || tenant != tenantBefore {
		t.Errorf("after the refused requests: got remaining %d and %d for the tenant, want %d and %d (unchanged)", pay, tenant, payBefore, tenantBefore)
	}
	if _, err := e.limiters.Get(ctx, "other"); err == nil {
		t.Error("a refused put created its limiter")
	}

	// With its token, each operation gets past the check (some then fail
	// for want of a reservation or a keyed limiter, which is not this
	// test's business). Deleting comes last.
	for _, r := range scoped[1:] {
		if r.op == "deleteLimiter" {
			continue
		}
		need, _ := auth.Required(r.op)
		ct := ""
		if r.body != "" {
			ct = "application/json"
		}
		res, body := e.raw(r.method, r.path, ct, r.body, "Authorization", "Bearer "+tokenOf(need))
		if res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden {
			t.Errorf("%s with a %s token: got %d %s", r.op, need, res.StatusCode, body)
		}
	}
	if res, body := e.raw(http.MethodDelete, "/v1/limiters/pay", "", "", "Authorization", "Bearer "+adminToken); res.StatusCode != http.StatusNoContent {
		t.Errorf("delete with the admin token: got %d %s, want 204", res.StatusCode, body)
	}

	// The probes and the contract stay open.
	for _, path := range []string{"/livez", "/readyz", "/openapi.yaml", "/openapi.json"} {
		if res, body := e.raw(http.MethodGet, path, "", ""); res.StatusCode != http.StatusOK {
			t.Errorf("GET %s without a token: got %d %s, want 200", path, res.StatusCode, body)
		}
	}
}

// An open scope's operations take no token, and /readyz names the open
// scopes; a request's Authorization header is not read for them.
func TestReadinessNamesOpenScopes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*Options)
		want  string
		allow []string // operations open to a caller without a token
	}{
		{name: "no tokens", want: `{"open_scopes":["admin","decide","adjust"],"status":"ok"}`, allow: []string{"getLimiter", "refund"}},
		{name: "admin token", edit: func(o *Options) { o.AdminToken = adminToken },
			want: `{"open_scopes":["decide","adjust"],"status":"ok"}`, allow: []string{"getLimiter", "refund"}},
		{name: "decide and adjust only", edit: func(o *Options) {
			o.Guard = auth.NewGuard([]auth.Token{auth.NewToken("app", decideToken, auth.Decide|auth.Adjust)})
		}, want: `{"open_scopes":["admin"],"status":"ok"}`, allow: []string{"getLimiter"}},
		{name: "every scope", edit: func(o *Options) {
			o.Guard = auth.NewGuard([]auth.Token{auth.NewToken("all", decideToken, auth.All)})
		}, want: `{"status":"ok"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.edit)
			res, body := e.raw(http.MethodGet, "/readyz", "", "")
			if got := strings.TrimSpace(string(body)); res.StatusCode != http.StatusOK || got != tc.want {
				t.Errorf("/readyz: got %d %s, want 200 %s", res.StatusCode, got, tc.want)
			}
			for _, op := range tc.allow {
				for _, r := range scoped {
					if r.op != op {
						continue
					}
					ct := ""
					if r.body != "" {
						ct = "application/json"
					}
					res, body := e.raw(r.method, r.path, ct, r.body, "Authorization", "Bearer forged-token")
					if res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden {
						t.Errorf("%s, open: got %d %s", op, res.StatusCode, body)
					}
				}
			}
		})
	}
}
