package httpapi

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/bolt"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

type badRequest struct {
	name        string
	method      string
	path        string
	contentType string
	body        string
	status      int
	location    string // a field error location the problem must carry, if any
}

// badInputs are malformed requests, each with the answer it must get.
// None of them may acquire anything or change a limiter.
var badInputs = []badRequest{
	// The acquire body, through the fast validation.
	{name: "truncated JSON", body: `{"permits":`, location: "body"},
	{name: "trailing garbage", body: `{"permits":1} x`, location: "body"},
	{name: "two values", body: `{"permits":1}{"permits":1}`, location: "body"},
	{name: "whitespace only", body: " \n", location: "body"},
	{name: "unknown field", body: `{"permits":1,"extra":1}`, location: "body.extra"},
	{name: "case-folded field", body: `{"Permits":1}`, location: "body.Permits"},
	{name: "duplicate field", body: `{"permits":1,"permits":2}`, location: "body.permits"},
	{name: "null permits", body: `{"permits":null}`, location: "body.permits"},
	{name: "string permits", body: `{"permits":"1"}`, location: "body.permits"},
	{name: "boolean permits", body: `{"permits":true}`, location: "body.permits"},
	{name: "fractional permits", body: `{"permits":1.5}`, location: "body.permits"},
	{name: "integral float permits", body: `{"permits":1.0}`, location: "body.permits"},
	{name: "exponent permits", body: `{"permits":1e0}`, location: "body.permits"},
	{name: "zero permits", body: `{"permits":0}`, location: "body.permits"},
	{name: "negative permits", body: `{"permits":-1}`, location: "body.permits"},
	{name: "negative zero permits", body: `{"permits":-0}`, location: "body.permits"},
	{name: "too many permits", body: `{"permits":1000000001}`, location: "body.permits"},
	{name: "absurd permits", body: `{"permits":99999999999999999999999}`, location: "body.permits"},
	{name: "array body", body: `[{"permits":1}]`, location: "body"},
	{name: "deeply nested permits", body: `{"permits":` + nested(40, "1") + `}`, location: "body.permits" + zeros(31)},
	{name: "null body", body: `null`, location: "body"},
	{name: "number body", body: `1`, location: "body"},
	{name: "text/plain", contentType: "text/plain", body: `{"permits":1}`, status: http.StatusUnsupportedMediaType},
	{name: "no Content-Type", contentType: "-", body: `{"permits":1}`, status: http.StatusUnsupportedMediaType},
	{name: "merge-patch", contentType: "application/merge-patch+json", body: `{"permits":1}`, status: http.StatusUnsupportedMediaType},
	{name: "form", contentType: "application/x-www-form-urlencoded", body: `permits=1`, status: http.StatusUnsupportedMediaType},
	{name: "body too large", body: `{"permits":1` + strings.Repeat(" ", DefaultMaxBodyBytes) + `}`, status: http.StatusRequestEntityTooLarge},
	{name: "UTF-16", contentType: "application/json; charset=utf-16", body: `{"permits":1}`, status: http.StatusUnsupportedMediaType},
	{name: "string not UTF-8", body: "{\"permits\":1,\"x\":\"\xff\"}", location: "body.x"},
	{name: "lone surrogate", body: `{"permits":1,"x":"\udc00"}`, location: "body.x"},

	// Path parameters, through the fast validation.
	{name: "name starts with a dash", path: "/v1/limiters/-seed/acquire", body: `{}`, location: "path.name"},
	{name: "name too long", path: "/v1/limiters/" + strings.Repeat("a", 129) + "/acquire", location: "path.name"},
	{name: "name not ASCII", path: "/v1/limiters/s%C3%A9ed/acquire", location: "path.name"},
	{name: "name with a space", path: "/v1/limiters/se%20ed/available", method: http.MethodGet, location: "path.name"},
	{name: "name with a colon", path: "/v1/limiters/se:ed/available", method: http.MethodGet, location: "path.name"},
	{name: "IP with letters", path: "/v1/tenants/localhost/acquire", location: "path.ip"},
	{name: "IP with a zone", path: "/v1/tenants/fe80::1%25eth0/acquire", location: "path.ip"},
	{name: "IP with a prefix other than the tenants'", path: "/v1/tenants/2001:db8::%2F48/available", method: http.MethodGet, location: "path.ip"},
	{name: "IPv4 with a prefix", path: "/v1/tenants/203.0.113.7%2F32/acquire", location: "path.ip"},
	{name: "IP too long", path: "/v1/tenants/" + strings.Repeat("1", 50) + "/available", method: http.MethodGet, location: "path.ip"},
	{name: "tenant body", path: "/v1/tenants/203.0.113.7/acquire", body: `{"permits":0}`, location: "body.permits"},
	{name: "tenant unknown field", path: "/v1/tenants/203.0.113.7/acquire", body: `{"permit":1}`, location: "body.permit"},
	{name: "tenant text/plain", path: "/v1/tenants/203.0.113.7/acquire", contentType: "text/plain", body: `{}`, status: http.StatusUnsupportedMediaType},

	// putLimiter, through kin-openapi and the domain.
	{name: "put nothing", method: http.MethodPut, path: "/v1/limiters/seed", body: `{}`, location: "body.limit"},
	{name: "put no period", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5}`, location: "body.period"},
	{name: "put zero limit", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":0,"period":"1m"}`, location: "body.limit"},
	{name: "put huge limit", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":1000000001,"period":"1m"}`, location: "body.limit"},
	{name: "put string limit", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":"5","period":"1m"}`, location: "body.limit"},
	{name: "put exponent limit", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5e0,"period":"1m"}`, location: "body.limit"},
	{name: "put null algorithm", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"1m","algorithm":null}`, location: "body.algorithm"},
	{name: "put null limit", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":null,"period":"1m"}`, location: "body.limit"},
	{name: "put bad period", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"1 minute"}`, location: "body.period"},
	{name: "put zero period", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"0s"}`, location: "body.period"},
	{name: "put sub-millisecond period", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"999us"}`, location: "body.period"},
	{name: "put period over a year", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"8785h"}`, location: "body.period"},
	{name: "put unknown algorithm", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"1m","algorithm":"leaky_bucket"}`, location: "body.algorithm"},
	{name: "put burst over limit", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"1m","burst":6}`, location: "body"},
	{name: "put burst on sliding log", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"1m","algorithm":"sliding_log","burst":5}`, location: "body"},
	{name: "put zero burst", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"1m","burst":0}`, location: "body.burst"},
	{name: "put unknown field", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"1m","window":"1m"}`, location: "body.window"},
	{name: "put case-folded field", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"Limit":5,"period":"1m"}`, location: "body.Limit"},
	{name: "put duplicate field", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"limit":6,"period":"1m"}`, location: "body.limit"},
	{name: "put trailing garbage", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"1m"},`, location: "body"},
	{name: "put array", method: http.MethodPut, path: "/v1/limiters/seed", body: `[]`, location: "body"},
	{name: "put deeply nested", method: http.MethodPut, path: "/v1/limiters/seed", body: `{"limit":5,"period":"1m","burst":` + nested(40, "") + `}`, location: "body.burst" + zeros(31)},
	{name: "put no body", method: http.MethodPut, path: "/v1/limiters/seed", location: "body"},
	{name: "put text/plain", method: http.MethodPut, path: "/v1/limiters/seed", contentType: "text/plain", body: `{"limit":5,"period":"1m"}`, status: http.StatusUnsupportedMediaType},
	{name: "put bad name", method: http.MethodPut, path: "/v1/limiters/se~ed", body: `{"limit":5,"period":"1m"}`, location: "path.name"},
	{name: "delete bad name", method: http.MethodDelete, path: "/v1/limiters/.seed", location: "path.name"},
	{name: "get bad name", method: http.MethodGet, path: "/v1/limiters/_seed", location: "path.name"},

	// acquireBatch, through kin-openapi: one bad acquisition refuses the
	// whole batch, so the valid ones before and after it take nothing.
	{name: "batch no body", path: "/v1/acquire", location: "body"},
	{name: "batch empty object", path: "/v1/acquire", body: `{}`, location: "body.acquisitions"},
	{name: "batch empty", path: "/v1/acquire", body: `{"acquisitions":[]}`, location: "body.acquisitions"},
	{name: "batch too long", path: "/v1/acquire", body: `{"acquisitions":[` + strings.Repeat(`{"limiter":"seed"},`, 1000) + `{"limiter":"seed"}]}`, location: "body.acquisitions"},
	{name: "batch null", path: "/v1/acquire", body: `{"acquisitions":null}`, location: "body.acquisitions"},
	{name: "batch not an array", path: "/v1/acquire", body: `{"acquisitions":{"limiter":"seed"}}`, location: "body.acquisitions"},
	{name: "batch item without limiter", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed"},{"permits":1}]}`, location: "body.acquisitions.1.limiter"},
	{name: "batch zero permits", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed"},{"limiter":"seed","permits":0},{"limiter":"seed"}]}`, location: "body.acquisitions.1.permits"},
	{name: "batch too many permits", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed","permits":1000000001}]}`, location: "body.acquisitions.0.permits"},
	{name: "batch fractional permits", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed","permits":1.5}]}`, location: "body.acquisitions.0.permits"},
	{name: "batch bad name", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed"},{"limiter":"-seed"}]}`, location: "body.acquisitions.1.limiter"},
	{name: "batch name too long", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"` + strings.Repeat("a", 129) + `"}]}`, location: "body.acquisitions.0.limiter"},
	{name: "batch unknown field", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed","tenant":"x"}]}`, location: "body.acquisitions.0.tenant"},
	{name: "batch unknown top field", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed"}],"atomic":true}`, location: "body.atomic"},
	{name: "batch duplicate field", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed","limiter":"seed","permits":1}]}`, location: "body.acquisitions.0.limiter"},
	{name: "batch duplicate permits", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed","permits":1,"permits":2}]}`, location: "body.acquisitions.0.permits"},
	{name: "batch null permits", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed","permits":null}]}`, location: "body.acquisitions.0.permits"},
	{name: "batch deeply nested", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed","permits":` + nested(40, "") + `}]}`, location: "body.acquisitions.0.permits" + zeros(29)},
	{name: "batch null item", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed"},null]}`, location: "body.acquisitions.1"},
	{name: "batch text/plain", path: "/v1/acquire", contentType: "text/plain", body: `{"acquisitions":[{"limiter":"seed"}]}`, status: http.StatusUnsupportedMediaType},
	{name: "batch trailing garbage", path: "/v1/acquire", body: `{"acquisitions":[{"limiter":"seed"}]}]`, location: "body"},

	// Query parameters.
	{name: "page size zero", method: http.MethodGet, path: "/v1/limiters?page_size=0", location: "query.page_size"},
	{name: "page size too big", method: http.MethodGet, path: "/v1/limiters?page_size=1001", location: "query.page_size"},
	{name: "page size not a number", method: http.MethodGet, path: "/v1/limiters?page_size=ten", location: "query.page_size"},
	{name: "page token not base64url", method: http.MethodGet, path: "/v1/limiters?page_token=a+b/c", location: "query.page_token"},
	{name: "page token of no name", method: http.MethodGet, path: "/v1/limiters?page_token=LXg", location: "query.page_token"},
	{name: "page token not a token", method: http.MethodGet, path: "/v1/limiters?page_token=A", location: "query.page_token"},
	{name: "k zero", method: http.MethodGet, path: "/v1/tenants/lowest?k=0", location: "query.k"},
	{name: "k too big", method: http.MethodGet, path: "/v1/tenants/lowest?k=1001", location: "query.k"},
	{name: "k not a number", method: http.MethodGet, path: "/v1/tenants/lowest?k=-", location: "query.k"},
}

func TestBadInputIsRejectedAndConsumesNothing(t *testing.T) {
	e := newEnv(t, nil)
	e.put("seed", client.LimiterSpec{Limit: 9, Period: "1m"})
	const ip = "203.0.113.7"
	seed, tenant := e.available("seed"), e.tenantAvailable(ip)
	for _, tc := range badInputs {
		t.Run(tc.name, func(t *testing.T) {
			method, path, ct, status := tc.method, tc.path, tc.contentType, tc.status
			if method == "" {
				method = http.MethodPost
			}
			if path == "" {
				path = "/v1/limiters/seed/acquire"
			}
			switch {
			case ct == "-":
				ct = ""
			case ct == "" && tc.body != "":
				ct = "application/json"
			}
			if status == 0 {
				status = http.StatusBadRequest
			}
			res, body := e.raw(method, path, ct, tc.body)
			p := checkProblem(t, res, body, status)
			if tc.location != "" && !slices.Contains(fieldLocations(p), tc.location) {
				t.Errorf("field errors: got %v, want one at %s (%s)", fieldLocations(p), tc.location, body)
			}
			if got := e.available("seed"); got != seed {
				t.Errorf("available: got %d, want %d: a bad request consumed permits", got, seed)
			}
			if got := e.tenantAvailable(ip); got != tenant {
				t.Errorf("tenant available: got %d, want %d: a bad request consumed permits", got, tenant)
			}
		})
	}
	got, err := e.c.GetLimiterWithResponse(ctx, "seed")
	if err != nil {
		t.Fatal(err)
	}
	if got.JSON200 == nil || got.JSON200.Limit != 9 || got.JSON200.Period != "1m0s" {
		t.Errorf("seed after bad puts: got %d %s, want 9 per 1m0s", got.StatusCode(), got.Body)
	}
}

// TestInvalidIPFromTheDomain: addresses that match the spec's pattern but
// are no addresses are refused by the tenant package, before it counts
// anything.
func TestInvalidIPFromTheDomain(t *testing.T) {
	e := newEnv(t, nil)
	for _, ip := range []string{"1.2.3", "1.2.3.4.5", "::ffff::1", "256.1.1.1"} {
		t.Run(ip, func(t *testing.T) {
			res, body := e.raw(http.MethodPost, "/v1/tenants/"+ip+"/acquire", "", "")
			p := checkProblem(t, res, body, http.StatusBadRequest)
			if !slices.Contains(fieldLocations(p), "path.ip") {
				t.Errorf("field errors: got %v, want path.ip", fieldLocations(p))
			}
		})
	}
	low, err := e.c.ListLowestTenantsWithResponse(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if low.JSON200 == nil || len(low.JSON200.Items) != 0 {
		t.Errorf("lowest: got %d %s, want no tenant", low.StatusCode(), low.Body)
	}
}

func TestChunkedBodyTooLarge(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBodyBytes = 100 })
	e.put("seed", client.LimiterSpec{Limit: 9, Period: "1m"})
	// A body of unknown length, cut off by the limit while it is read.
	body := io.MultiReader(strings.NewReader(`{"permits":1`), strings.NewReader(strings.Repeat(" ", 200)+"}"))
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/limiters/seed/acquire", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	p := checkProblem(t, res, b, http.StatusRequestEntityTooLarge)
	if !strings.Contains(*p.Detail, "100 bytes") {
		t.Errorf("detail: got %q, want the limit", *p.Detail)
	}
	if got := e.available("seed"); got != 9 {
		t.Errorf("available: got %d, want 9", got)
	}
}

func TestNotFound(t *testing.T) {
	e := newEnv(t, nil)
	for _, path := range []string{"/nope", "/v1", "/v1/limiters/x/y", "/v1/tenants"} {
		res, body := e.raw(http.MethodGet, path, "", "")
		checkProblem(t, res, body, http.StatusNotFound)
	}
	res, err := e.c.AcquireWithResponse(ctx, "missing", client.AcquireRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if p := res.ApplicationProblemJSON404; p == nil || p.Detail == nil || !strings.Contains(*p.Detail, `"missing"`) {
		t.Fatalf("acquire from an unknown limiter: got %d %s, want 404 naming it", res.StatusCode(), res.Body)
	}
	av, err := e.c.GetAvailableWithResponse(ctx, "missing", nil)
	if err != nil {
		t.Fatal(err)
	}
	if av.ApplicationProblemJSON404 == nil {
		t.Fatalf("available of an unknown limiter: got %d %s, want 404", av.StatusCode(), av.Body)
	}
}

func TestMethodNotAllowed(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodDelete, "/v1/limiters", "GET, HEAD"},
		{http.MethodPost, "/v1/limiters/x", "GET, HEAD, PUT, DELETE"},
		{http.MethodGet, "/v1/limiters/x/acquire", "POST"},
		{http.MethodPut, "/v1/limiters/x/available", "GET, HEAD"},
		{http.MethodPatch, "/v1/tenants/policy", "GET, HEAD"},
		{http.MethodPost, "/livez", "GET, HEAD"},
		{http.MethodDelete, "/openapi.yaml", "GET, HEAD"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			res, body := e.raw(tc.method, tc.path, "", "")
			checkProblem(t, res, body, http.StatusMethodNotAllowed)
			if got := res.Header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow: got %q, want %q", got, tc.allow)
			}
		})
	}
}

func TestAdminToken(t *testing.T) {
	const token = "s3cret-admin-token"
	e := newEnv(t, func(o *Options) { o.AdminToken = token })
	spec := `{"limit":5,"period":"1m"}`
	for _, tc := range []struct {
		name, method, path, body, auth string
		status                         int
		invalidToken                   bool
	}{
		{name: "put without token", method: http.MethodPut, path: "/v1/limiters/a", body: spec, status: 401},
		{name: "put with a wrong token", method: http.MethodPut, path: "/v1/limiters/a", body: spec, auth: "Bearer nope", status: 401, invalidToken: true},
		{name: "put with a longer token", method: http.MethodPut, path: "/v1/limiters/a", body: spec, auth: "Bearer " + token + "x", status: 401, invalidToken: true},
		{name: "put with basic auth", method: http.MethodPut, path: "/v1/limiters/a", body: spec, auth: "Basic " + token, status: 401},
		{name: "put with the token and a bad body", method: http.MethodPut, path: "/v1/limiters/a", body: `{}`, auth: "Bearer " + token, status: 400},
		{name: "put bad body without token", method: http.MethodPut, path: "/v1/limiters/a", body: `{`, status: 401},
		{name: "put with the token", method: http.MethodPut, path: "/v1/limiters/a", body: spec, auth: "Bearer " + token, status: 201},
		{name: "scheme is case-insensitive", method: http.MethodPut, path: "/v1/limiters/a", body: spec, auth: "bearer " + token, status: 200},
		{name: "delete without token", method: http.MethodDelete, path: "/v1/limiters/a", status: 401},
		{name: "get is open", method: http.MethodGet, path: "/v1/limiters/a", status: 200},
		{name: "acquire is open", method: http.MethodPost, path: "/v1/limiters/a/acquire", status: 200},
		{name: "list is open", method: http.MethodGet, path: "/v1/limiters", status: 200},
		{name: "delete with the token", method: http.MethodDelete, path: "/v1/limiters/a", auth: "Bearer " + token, status: 204},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct := ""
			if tc.body != "" {
				ct = "application/json"
			}
			var hdr []string
			if tc.auth != "" {
				hdr = []string{"Authorization", tc.auth}
			}
			res, body := e.raw(tc.method, tc.path, ct, tc.body, hdr...)
			if tc.status != http.StatusUnauthorized {
				if res.StatusCode != tc.status {
					t.Fatalf("status: got %d %s, want %d", res.StatusCode, body, tc.status)
				}
				return
			}
			checkProblem(t, res, body, http.StatusUnauthorized)
			want := `Bearer realm="ratelimiter"`
			if tc.invalidToken {
				want += `, error="invalid_token"`
			}
			if got := res.Header.Get("WWW-Authenticate"); got != want {
				t.Errorf("WWW-Authenticate: got %q, want %q", got, want)
			}
			if strings.Contains(string(body), token) {
				t.Error("the problem echoes the token")
			}
		})
	}

	// The SDK sends the token with a request editor.
	withToken, err := client.NewClientWithResponses(e.srv.URL, client.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+token)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	res, err := withToken.PutLimiterWithResponse(ctx, "b", client.LimiterSpec{Limit: 1, Period: "1s"})
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode() != http.StatusCreated {
		t.Fatalf("SDK put with token: got %d %s", res.StatusCode(), res.Body)
	}
	res, err = e.c.PutLimiterWithResponse(ctx, "b", client.LimiterSpec{Limit: 1, Period: "1s"})
	if err != nil {
		t.Fatal(err)
	}
	if res.ApplicationProblemJSON401 == nil {
		t.Fatalf("SDK put without token: got %d %s, want 401", res.StatusCode(), res.Body)
	}
}

func TestOpenWithoutAdminToken(t *testing.T) {
	e := newEnv(t, nil)
	res, body := e.raw(http.MethodPut, "/v1/limiters/a", "application/json", `{"limit":5,"period":"1m"}`)
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("put without a configured token: got %d %s, want 201", res.StatusCode, body)
	}
	res, body = e.raw(http.MethodDelete, "/v1/limiters/a", "", "")
	if res.StatusCode != http.StatusNoContent {
		t.Fatalf("delete without a configured token: got %d %s, want 204", res.StatusCode, body)
	}
}

// Creating a limiter beyond the store's maximum is a 409 problem that
// creates nothing; replacing one at the maximum still works, and a
// deletion makes room.
func TestTooManyLimiters(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, func(o *Options) { o.Limiters = limiter.NewService(memory.New(nil, 2)) })
	spec := client.LimiterSpec{Limit: 5, Period: "1m"}
	e.put("a", spec)
	e.put("b", spec)
	res, body := e.raw(http.MethodPut, "/v1/limiters/c", "application/json", `{"limit":5,"period":"1m"}`)
	p := checkProblem(t, res, body, http.StatusConflict)
	if want := `Limiter "c" was not created`; !strings.Contains(*p.Detail, want) {
		t.Errorf("detail: got %q, want it to contain %q", *p.Detail, want)
	}
	if res, body := e.raw(http.MethodGet, "/v1/limiters/c", "", ""); res.StatusCode != http.StatusNotFound {
		t.Errorf("GET the refused limiter: got %d %s, want 404", res.StatusCode, body)
	}
	// The SDK sees the documented response.
	sdk, err := e.c.PutLimiterWithResponse(ctx, "c", spec)
	if err != nil {
		t.Fatal(err)
	}
	if sdk.ApplicationProblemJSON409 == nil {
		t.Errorf("SDK put beyond the maximum: got %d %s, want the 409 problem", sdk.StatusCode(), sdk.Body)
	}
	replaced, err := e.c.PutLimiterWithResponse(ctx, "b", client.LimiterSpec{Limit: 9, Period: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if replaced.JSON200 == nil || replaced.JSON200.Limit != 9 {
		t.Errorf("replacing at the maximum: got %d %s, want 200 with limit 9", replaced.StatusCode(), replaced.Body)
	}
	if res, body := e.raw(http.MethodDelete, "/v1/limiters/a", "", ""); res.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: got %d %s, want 204", res.StatusCode, body)
	}
	if res, body := e.raw(http.MethodPut, "/v1/limiters/c", "application/json", `{"limit":5,"period":"1m"}`); res.StatusCode != http.StatusCreated {
		t.Errorf("put after a deletion: got %d %s, want 201", res.StatusCode, body)
	}
}

// A definition change the data directory cannot take is a 503 that says
// nothing changed, with nothing internal in it; the definition in force
// before stays, and decisions go on.
func TestDefinitionNotWrittenToDisk(t *testing.T) {
	disk, err := bolt.Open(t.TempDir(), memory.New(nil, 0), bolt.Options{Clock: limiter.NewClock()})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(o *Options) { o.Limiters = limiter.NewService(disk) })
	e.put("a", client.LimiterSpec{Limit: 5, Period: "1m"})
	if err := disk.Close(); err != nil { // every write fails from now on
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodPut, "/v1/limiters/b", `{"limit":5,"period":"1m"}`},
		{http.MethodPut, "/v1/limiters/a", `{"limit":50,"period":"1h"}`},
		{http.MethodDelete, "/v1/limiters/a", ""},
	} {
		ct := ""
		if tc.body != "" {
			ct = "application/json"
		}
		res, body := e.raw(tc.method, tc.path, ct, tc.body)
		p := checkProblem(t, res, body, http.StatusServiceUnavailable)
		if want := "was not changed"; !strings.Contains(*p.Detail, want) || strings.Contains(string(body), "database") {
			t.Errorf("%s %s: detail %q, want it to say %q and nothing internal", tc.method, tc.path, *p.Detail, want)
		}
	}
	if res, body := e.raw(http.MethodGet, "/v1/limiters/b", "", ""); res.StatusCode != http.StatusNotFound {
		t.Errorf("GET the limiter not created: got %d %s, want 404", res.StatusCode, body)
	}
	got, err := e.c.GetLimiterWithResponse(context.Background(), "a")
	if err != nil || got.JSON200 == nil || got.JSON200.Limit != 5 || got.JSON200.Period != "1m0s" {
		t.Errorf("GET the limiter not replaced: %v %s, want limit 5 per 1m", err, got.Body)
	}
	if res, body := e.raw(http.MethodPost, "/v1/limiters/a/acquire", "application/json", `{"permits":2}`); res.StatusCode != http.StatusOK || !strings.Contains(string(body), `"allowed":true`) {
		t.Errorf("acquire: got %d %s, want allowed", res.StatusCode, body)
	}
}
