package e2e

import (
	"context"
	"crypto/rand"
	"net/http"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestAdminToken runs a server with an admin token: creating, replacing and
// deleting limiters need it, everything else stays open.
func TestAdminToken(t *testing.T) {
	t.Parallel()
	token := rand.Text()
	svc := startService(t, map[string]string{"RATELIMITER_ADMIN_TOKEN": token})
	ctx := t.Context()
	open := svc.api
	admin, err := svc.newClient(client.WithRequestEditorFn(authorization("Bearer " + token)))
	if err != nil {
		t.Fatal(err)
	}

	const guarded = "guarded"
	original := client.LimiterSpec{Limit: 5, Period: "1h"}
	created, err := admin.PutLimiterWithResponse(ctx, guarded, original)
	if err != nil {
		t.Fatal(err)
	}
	if created.StatusCode() != http.StatusCreated {
		t.Fatalf("create with the token: got %d %s, want 201", created.StatusCode(), created.Body)
	}
	// The limiter as created, with one permit taken below.
	unchanged := func(t *testing.T) {
		t.Helper()
		res, err := open.GetLimiterWithResponse(ctx, guarded)
		if err != nil {
			t.Fatal(err)
		}
		if res.JSON200 == nil || res.JSON200.Limit != 5 || res.JSON200.Period != "1h0m0s" {
			t.Errorf("get %s: got %d %s, want it unchanged: limit 5, period 1h0m0s", guarded, res.StatusCode(), res.Body)
		}
		if got := available(t, open, guarded); got != 4 {
			t.Errorf("available %s: got %d, want 4: a refused mutation changed its state", guarded, got)
		}
		res, err = open.GetLimiterWithResponse(ctx, "guarded-new")
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode() != http.StatusNotFound {
			t.Errorf("get guarded-new: got %d %s, want 404: a refused creation created it", res.StatusCode(), res.Body)
		}
	}

	take(t, open, guarded, 1, true) // acquisitions need no token

	t.Run("other operations stay open", func(t *testing.T) {
		checks := []struct {
			name string
			do   func() (answer, error)
		}{
			{"getLimiter", func() (answer, error) { return open.GetLimiterWithResponse(ctx, guarded) }},
			{"listLimiters", func() (answer, error) { return open.ListLimitersWithResponse(ctx, nil) }},
			{"getAvailable", func() (answer, error) { return open.GetAvailableWithResponse(ctx, guarded, nil) }},
			{"acquireTenant", func() (answer, error) {
				return open.AcquireTenantWithResponse(ctx, "203.0.113.1", client.AcquireRequest{})
			}},
			{"getTenantAvailable", func() (answer, error) { return open.GetTenantAvailableWithResponse(ctx, "203.0.113.1") }},
			{"listLowestTenants", func() (answer, error) { return open.ListLowestTenantsWithResponse(ctx, nil) }},
			{"getTenantPolicy", func() (answer, error) { return open.GetTenantPolicyWithResponse(ctx) }},
		}
		for _, c := range checks {
			res, err := c.do()
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode() != http.StatusOK {
				t.Errorf("%s without a token: got %d %s, want 200", c.name, res.StatusCode(), res.GetBody())
			}
		}
		unchanged(t)
	})

	credentials := []struct {
		name          string
		authorization string // the Authorization header; empty sends none
	}{
		{"no token", ""},
		{"wrong token", "Bearer " + rand.Text()},
		{"token with a suffix", "Bearer " + token + "x"},
		{"token prefix", "Bearer " + token[:len(token)-1]},
		{"token without the scheme", token},
		{"basic scheme", "Basic " + token},
		{"empty bearer", "Bearer "},
	}
	for _, cred := range credentials {
		t.Run(cred.name, func(t *testing.T) {
			api, err := svc.newClient(client.WithRequestEditorFn(authorization(cred.authorization)))
			if err != nil {
				t.Fatal(err)
			}
			replace := client.LimiterSpec{Limit: 7, Period: "1m"}
			attempts := []struct {
				name     string
				do       func() (answer, string, error) // the answer and its WWW-Authenticate
				instance string
			}{
				{"create", func() (answer, string, error) {
					res, err := api.PutLimiterWithResponse(ctx, "guarded-new", original)
					return res, wwwAuthenticate(res), err
				}, "/v1/limiters/guarded-new"},
				{"replace", func() (answer, string, error) {
					res, err := api.PutLimiterWithResponse(ctx, guarded, replace)
					return res, wwwAuthenticate(res), err
				}, "/v1/limiters/" + guarded},
				{"delete", func() (answer, string, error) {
					res, err := api.DeleteLimiterWithResponse(ctx, guarded)
					var h string
					if res != nil && res.Headers401 != nil {
						h = res.Headers401.WWWAuthenticate
					}
					return res, h, err
				}, "/v1/limiters/" + guarded},
			}
			for _, a := range attempts {
				res, challenge, err := a.do()
				if err != nil {
					t.Fatalf("%s: %v", a.name, err)
				}
				checkProblem(t, res, http.StatusUnauthorized, a.instance, "")
				if !strings.HasPrefix(challenge, "Bearer") {
					t.Errorf("%s: WWW-Authenticate: got %q, want a Bearer challenge", a.name, challenge)
				}
				unchanged(t)
			}
		})
	}

	t.Run("with the token", func(t *testing.T) {
		res, err := admin.PutLimiterWithResponse(ctx, guarded, client.LimiterSpec{Limit: 7, Period: "1m"})
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode() != http.StatusOK || res.JSON200 == nil || res.JSON200.Limit != 7 {
			t.Errorf("replace: got %d %s, want 200 and limit 7", res.StatusCode(), res.Body)
		}
		del, err := admin.DeleteLimiterWithResponse(ctx, guarded)
		if err != nil {
			t.Fatal(err)
		}
		if del.StatusCode() != http.StatusNoContent {
			t.Errorf("delete: got %d %s, want 204", del.StatusCode(), del.Body)
		}
		get, err := open.GetLimiterWithResponse(ctx, guarded)
		if err != nil {
			t.Fatal(err)
		}
		if get.StatusCode() != http.StatusNotFound {
			t.Errorf("get after delete: got %d %s, want 404", get.StatusCode(), get.Body)
		}
	})
}

// authorization returns a request editor that sends the Authorization
// header value, or none when it is empty.
func authorization(value string) client.RequestEditorFn {
	return func(_ context.Context, req *http.Request) error {
		if value != "" {
			req.Header.Set("Authorization", value)
		}
		return nil
	}
}

// wwwAuthenticate is the challenge of a refused PUT.
func wwwAuthenticate(res *client.PutLimiterResponse) string {
	if res == nil || res.Headers401 == nil {
		return ""
	}
	return res.Headers401.WWWAuthenticate
}
