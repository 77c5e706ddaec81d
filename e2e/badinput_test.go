package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestBadInput sends requests the API rejects and checks each answer is the
// documented problem, and that nothing was acquired or changed.
func TestBadInput(t *testing.T) {
	t.Parallel()
	api := sharedService(t).api
	ctx := t.Context()

	// The state every rejected request must leave as it is: a limiter with
	// 7 of 9 permits left, and a tenant with 97 of 100.
	const (
		name   = "bad-input"
		absent = "bad-input-absent" // must never come to exist
		ip     = "192.0.2.10"
	)
	spec := client.LimiterSpec{Limit: 9, Period: "1h"}
	wantLimiter := client.Limiter{Name: name, Limit: 9, Period: "1h0m0s", Algorithm: client.AlgorithmGcra, Burst: ptr[int64](9)}
	put(t, api, name, spec)
	take(t, api, name, 2, true)
	three := int64(3)
	if res, err := api.AcquireTenantWithResponse(ctx, ip, client.AcquireRequest{Permits: &three}); err != nil || res.JSON200 == nil || !res.JSON200.Allowed {
		t.Fatalf("acquire 3 for %s: got %v %v, want granted", ip, res, err)
	}
	unchanged := func(t *testing.T) {
		t.Helper()
		if got := available(t, api, name); got != 7 {
			t.Errorf("limiter %s: got %d available, want 7: a rejected request changed it", name, got)
		}
		get, err := api.GetLimiterWithResponse(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if get.JSON200 == nil {
			t.Fatalf("get %s: got %d %s, want 200", name, get.StatusCode(), get.Body)
		}
		checkLimiter(t, "limiter after a rejected request", *get.JSON200, wantLimiter)
		if get, err := api.GetLimiterWithResponse(ctx, absent); err != nil || get.StatusCode() != http.StatusNotFound {
			t.Errorf("get %s: got %v %v, want 404: a rejected request created it", absent, get.StatusCode(), err)
		}
		ta, err := api.GetTenantAvailableWithResponse(ctx, ip)
		if err != nil {
			t.Fatal(err)
		}
		if ta.JSON200 == nil || ta.JSON200.Remaining != 97 {
			t.Errorf("tenant %s: got %s, want 97 remaining: a rejected request changed it", ip, ta.Body)
		}
	}
	unchanged(t)

	acquireBody := func(contentType, body string) func(context.Context) (answer, error) {
		return func(ctx context.Context) (answer, error) {
			return api.AcquireWithBodyWithResponse(ctx, name, contentType, strings.NewReader(body))
		}
	}
	acquireTenantBody := func(body string) func(context.Context) (answer, error) {
		return func(ctx context.Context) (answer, error) {
			return api.AcquireTenantWithBodyWithResponse(ctx, ip, "application/json", strings.NewReader(body))
		}
	}
	batchBody := func(body string) func(context.Context) (answer, error) {
		return func(ctx context.Context) (answer, error) {
			return api.AcquireBatchWithBodyWithResponse(ctx, "application/json", strings.NewReader(body))
		}
	}
	putBody := func(limiter, body string) func(context.Context) (answer, error) {
		return func(ctx context.Context) (answer, error) {
			return api.PutLimiterWithBodyWithResponse(ctx, limiter, "application/json", strings.NewReader(body))
		}
	}
	// rawQuery replaces the query string the client sends, for values its
	// types cannot express.
	rawQuery := func(query string) client.RequestEditorFn {
		return func(_ context.Context, req *http.Request) error {
			req.URL.RawQuery = query
			return nil
		}
	}
	acquirePath := "/v1/limiters/" + name + "/acquire"
	// 40 levels of arrays, past the 32 a body may nest; and an object of
	// 65 members, past the 64 one may hold.
	deep := strings.Repeat("[", 40) + strings.Repeat("]", 40)
	var wide strings.Builder
	wide.WriteString(`{"limit":5,"period":"1m"`)
	for i := range 63 {
		fmt.Fprintf(&wide, `,"m%d":1`, i)
	}
	wide.WriteString("}")
	tooLarge := `{"permits":1` + strings.Repeat(" ", 70_000) + `}`
	longName := strings.Repeat("a", 129)

	cases := []struct {
		name         string
		do           func(context.Context) (answer, error)
		wantStatus   int
		wantInstance string
		wantLocation string // for a 400: where one of its errors is
	}{
		// Acquisition bodies.
		{"malformed JSON", acquireBody("application/json", `{"permits":`), 400, acquirePath, "body"},
		{"not an object", acquireBody("application/json", `[1]`), 400, acquirePath, "body"},
		{"unknown field", acquireBody("application/json", `{"permits":1,"extra":true}`), 400, acquirePath, "body.extra"},
		{"duplicate field", acquireBody("application/json", `{"permits":1,"permits":1}`), 400, acquirePath, "body.permits"},
		{"null permits", acquireBody("application/json", `{"permits":null}`), 400, acquirePath, "body.permits"},
		{"fractional permits", acquireBody("application/json", `{"permits":1.5}`), 400, acquirePath, "body.permits"},
		{"exponent permits", acquireBody("application/json", `{"permits":1e0}`), 400, acquirePath, "body.permits"},
		{"string permits", acquireBody("application/json", `{"permits":"1"}`), 400, acquirePath, "body.permits"},
		{"data after the value", acquireBody("application/json", `{"permits":1}{"permits":1}`), 400, acquirePath, "body"},
		{"zero permits", acquireBody("application/json", `{"permits":0}`), 400, acquirePath, "body.permits"},
		{"negative permits", acquireBody("application/json", `{"permits":-1}`), 400, acquirePath, "body.permits"},
		{"permits above 10^9", acquireBody("application/json", `{"permits":1000000001}`), 400, acquirePath, "body.permits"},
		{"permits beyond int64", acquireBody("application/json", `{"permits":100000000000000000000}`), 400, acquirePath, "body.permits"},
		{"not JSON", acquireBody("text/plain", `{"permits":1}`), 415, acquirePath, ""},
		{"body too large", acquireBody("application/json", tooLarge), 413, acquirePath, ""},
		{"tenant zero permits", acquireTenantBody(`{"permits":0}`), 400, "/v1/tenants/" + ip + "/acquire", "body.permits"},
		{"tenant malformed JSON", acquireTenantBody(`{`), 400, "/v1/tenants/" + ip + "/acquire", "body"},
		{"nested 40 levels deep", acquireBody("application/json", `{"permits":`+deep+`}`), 400, acquirePath, ""},
		{"tenant nested 40 levels deep", acquireTenantBody(`{"permits":` + deep + `}`), 400, "/v1/tenants/" + ip + "/acquire", ""},
		{"batch nested 40 levels deep", batchBody(`{"acquisitions":[{"limiter":"` + name + `"},{"limiter":` + deep + `}]}`), 400, "/v1/acquire", ""},

		// Batches: one bad acquisition refuses the batch, so the valid ones
		// around it take nothing.
		{"batch empty", batchBody(`{"acquisitions":[]}`), 400, "/v1/acquire", "body.acquisitions"},
		{"batch over 1000", batchBody(`{"acquisitions":[` + strings.Repeat(`{"limiter":"`+name+`"},`, 1000) + `{"limiter":"` + name + `"}]}`), 400, "/v1/acquire", "body.acquisitions"},
		{"batch zero permits", batchBody(`{"acquisitions":[{"limiter":"` + name + `"},{"limiter":"` + name + `","permits":0}]}`), 400, "/v1/acquire", "body.acquisitions.1.permits"},
		{"batch bad name", batchBody(`{"acquisitions":[{"limiter":"` + name + `"},{"limiter":"-x"}]}`), 400, "/v1/acquire", "body.acquisitions.1.limiter"},
		{"batch duplicate member", batchBody(`{"acquisitions":[{"limiter":"` + name + `","limiter":"` + name + `"}]}`), 400, "/v1/acquire", "body.acquisitions.0.limiter"},
		{"batch null permits", batchBody(`{"acquisitions":[{"limiter":"` + name + `","permits":null}]}`), 400, "/v1/acquire", "body.acquisitions.0.permits"},
		{"batch unknown member", batchBody(`{"acquisitions":[{"limiter":"` + name + `","ip":"192.0.2.1"}]}`), 400, "/v1/acquire", "body.acquisitions.0.ip"},
		{"batch not JSON", func(ctx context.Context) (answer, error) {
			return api.AcquireBatchWithBodyWithResponse(ctx, "text/plain", strings.NewReader(`{"acquisitions":[{"limiter":"`+name+`"}]}`))
		}, 415, "/v1/acquire", ""},

		// Limiter definitions, replacing an existing limiter or creating one.
		{"unknown field in a policy", putBody(name, `{"limit":5,"period":"1m","extra":1}`), 400, "/v1/limiters/" + name, "body.extra"},
		{"no limit", putBody(name, `{"period":"1m"}`), 400, "/v1/limiters/" + name, "body.limit"},
		{"no body", putBody(name, ``), 400, "/v1/limiters/" + name, "body"},
		{"zero limit", putBody(name, `{"limit":0,"period":"1m"}`), 400, "/v1/limiters/" + name, "body.limit"},
		{"limit above 10^9", putBody(name, `{"limit":1000000001,"period":"1m"}`), 400, "/v1/limiters/" + name, "body.limit"},
		{"period without unit", putBody(name, `{"limit":5,"period":"60"}`), 400, "/v1/limiters/" + name, "body.period"},
		{"period with unknown unit", putBody(name, `{"limit":5,"period":"1d"}`), 400, "/v1/limiters/" + name, "body.period"},
		{"zero period", putBody(name, `{"limit":5,"period":"0s"}`), 400, "/v1/limiters/" + name, "body.period"},
		{"period below 1ms", putBody(name, `{"limit":5,"period":"999us"}`), 400, "/v1/limiters/" + name, "body.period"},
		{"period above 366 days", putBody(name, `{"limit":5,"period":"8785h"}`), 400, "/v1/limiters/" + name, "body.period"},
		{"burst above limit", putBody(name, `{"limit":5,"period":"1m","burst":6}`), 400, "/v1/limiters/" + name, "body"},
		{"zero burst", putBody(name, `{"limit":5,"period":"1m","burst":0}`), 400, "/v1/limiters/" + name, "body.burst"},
		{"policy nested 40 levels deep", putBody(absent, `{"limit":5,"period":"1m","algorithm":`+deep+`}`), 400, "/v1/limiters/" + absent, ""},
		{"policy of 65 members", putBody(absent, wide.String()), 400, "/v1/limiters/" + absent, "body"},
		{"unknown algorithm", putBody(absent, `{"limit":5,"period":"1m","algorithm":"leaky_bucket"}`), 400, "/v1/limiters/" + absent, "body.algorithm"},
		{"policy not JSON", func(ctx context.Context) (answer, error) {
			return api.PutLimiterWithBodyWithResponse(ctx, absent, "application/x-www-form-urlencoded", strings.NewReader("limit=5&period=1m"))
		}, 415, "/v1/limiters/" + absent, ""},

		// Limiter names.
		{"name starting with a dash", func(ctx context.Context) (answer, error) {
			return api.GetLimiterWithResponse(ctx, "-dash")
		}, 400, "/v1/limiters/-dash", "path.name"},
		{"name starting with a dot", func(ctx context.Context) (answer, error) {
			return api.PutLimiterWithResponse(ctx, ".dot", spec)
		}, 400, "/v1/limiters/.dot", "path.name"},
		{"name with a space", func(ctx context.Context) (answer, error) {
			return api.AcquireWithResponse(ctx, "bad input", client.AcquireRequest{})
		}, 400, "/v1/limiters/bad%20input/acquire", "path.name"},
		{"name of 129 characters", func(ctx context.Context) (answer, error) {
			return api.GetAvailableWithResponse(ctx, longName, nil)
		}, 400, "/v1/limiters/" + longName + "/available", "path.name"},
		{"name not ASCII", func(ctx context.Context) (answer, error) {
			return api.DeleteLimiterWithResponse(ctx, "naïve")
		}, 400, "/v1/limiters/" + url.PathEscape("naïve"), "path.name"},

		// Tenant addresses.
		{"IP not an address", func(ctx context.Context) (answer, error) {
			return api.AcquireTenantWithResponse(ctx, "not-an-ip", client.AcquireRequest{})
		}, 400, "/v1/tenants/not-an-ip/acquire", "path.ip"},
		{"IPv4 with five parts", func(ctx context.Context) (answer, error) {
			return api.AcquireTenantWithResponse(ctx, "1.2.3.4.5", client.AcquireRequest{})
		}, 400, "/v1/tenants/1.2.3.4.5/acquire", "path.ip"},
		{"IPv4 part above 255", func(ctx context.Context) (answer, error) {
			return api.GetTenantAvailableWithResponse(ctx, "256.1.1.1")
		}, 400, "/v1/tenants/256.1.1.1/available", "path.ip"},
		{"IPv6 with two ::", func(ctx context.Context) (answer, error) {
			return api.GetTenantAvailableWithResponse(ctx, "2001:db8::1::2")
		}, 400, "/v1/tenants/2001:db8::1::2/available", "path.ip"},
		{"IPv6 prefix other than the configured /64", func(ctx context.Context) (answer, error) {
			return api.GetTenantAvailableWithResponse(ctx, "2001:db8::/48")
		}, 400, "/v1/tenants/2001:db8::%2F48/available", "path.ip"},
		{"IPv6 with a zone", func(ctx context.Context) (answer, error) {
			return api.AcquireTenantWithResponse(ctx, "fe80::1%eth0", client.AcquireRequest{})
		}, 400, "/v1/tenants/fe80::1%25eth0/acquire", "path.ip"},

		// Query parameters.
		{"page_size 0", func(ctx context.Context) (answer, error) {
			return api.ListLimitersWithResponse(ctx, &client.ListLimitersParams{PageSize: ptr[int32](0)})
		}, 400, "/v1/limiters", "query.page_size"},
		{"page_size 1001", func(ctx context.Context) (answer, error) {
			return api.ListLimitersWithResponse(ctx, &client.ListLimitersParams{PageSize: ptr[int32](1001)})
		}, 400, "/v1/limiters", "query.page_size"},
		{"page_size not a number", func(ctx context.Context) (answer, error) {
			return api.ListLimitersWithResponse(ctx, nil, rawQuery("page_size=ten"))
		}, 400, "/v1/limiters", "query.page_size"},
		{"page_token not base64url", func(ctx context.Context) (answer, error) {
			return api.ListLimitersWithResponse(ctx, &client.ListLimitersParams{PageToken: ptr("!!!")})
		}, 400, "/v1/limiters", "query.page_token"},
		{"page_token not from a page", func(ctx context.Context) (answer, error) {
			return api.ListLimitersWithResponse(ctx, &client.ListLimitersParams{PageToken: ptr("LWJhZA")}) // "-bad"
		}, 400, "/v1/limiters", "query.page_token"},
		{"k 0", func(ctx context.Context) (answer, error) {
			return api.ListLowestTenantsWithResponse(ctx, &client.ListLowestTenantsParams{K: ptr[int32](0)})
		}, 400, "/v1/tenants/lowest", "query.k"},
		{"k 1001", func(ctx context.Context) (answer, error) {
			return api.ListLowestTenantsWithResponse(ctx, &client.ListLowestTenantsParams{K: ptr[int32](1001)})
		}, 400, "/v1/tenants/lowest", "query.k"},
		{"k not a number", func(ctx context.Context) (answer, error) {
			return api.ListLowestTenantsWithResponse(ctx, nil, rawQuery("k=-"))
		}, 400, "/v1/tenants/lowest", "query.k"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := tc.do(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkProblem(t, res, tc.wantStatus, tc.wantInstance, tc.wantLocation)
			unchanged(t)
		})
	}

	t.Run("method not allowed", func(t *testing.T) {
		res, err := api.GetLimiterWithResponse(ctx, name, func(_ context.Context, req *http.Request) error {
			req.Method = http.MethodPost
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		checkProblem(t, res, http.StatusMethodNotAllowed, "/v1/limiters/"+name, "")
		allow := strings.Split(strings.ReplaceAll(res.HTTPResponse.Header.Get("Allow"), " ", ""), ",")
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
			if !strings.Contains(","+strings.Join(allow, ",")+",", ","+m+",") {
				t.Errorf("Allow: got %q, want %s among the methods", res.HTTPResponse.Header.Get("Allow"), m)
			}
		}
		unchanged(t)
	})
}
