package httpapi

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

var ctx = context.Background()

func TestLimiterLifecycle(t *testing.T) {
	e := newEnv(t, nil)

	put, err := e.c.PutLimiterWithResponse(ctx, "checkout-api", client.LimiterSpec{Limit: 100, Period: "100s"})
	if err != nil {
		t.Fatal(err)
	}
	if put.StatusCode() != http.StatusCreated || put.JSON201 == nil {
		t.Fatalf("put: got %d %s, want 201", put.StatusCode(), put.Body)
	}
	want := client.Limiter{Name: "checkout-api", Limit: 100, Period: "1m40s", Algorithm: client.AlgorithmGcra, Burst: ptr[int64](100)}
	if got := *put.JSON201; !equalLimiter(got, want) {
		t.Errorf("put: got %+v, want %+v", got, want)
	}
	if got := put.HTTPResponse.Header.Get("Location"); got != "/v1/limiters/checkout-api" {
		t.Errorf("Location: got %q, want /v1/limiters/checkout-api", got)
	}

	replaced, err := e.c.PutLimiterWithResponse(ctx, "checkout-api", client.LimiterSpec{Limit: 10, Period: "1s", Algorithm: ptr(client.AlgorithmSlidingLog)})
	if err != nil {
		t.Fatal(err)
	}
	if replaced.StatusCode() != http.StatusOK || replaced.JSON200 == nil {
		t.Fatalf("replace: got %d %s, want 200", replaced.StatusCode(), replaced.Body)
	}
	want = client.Limiter{Name: "checkout-api", Limit: 10, Period: "1s", Algorithm: client.AlgorithmSlidingLog}
	if got := *replaced.JSON200; !equalLimiter(got, want) {
		t.Errorf("replace: got %+v, want %+v", got, want)
	}

	get, err := e.c.GetLimiterWithResponse(ctx, "checkout-api")
	if err != nil {
		t.Fatal(err)
	}
	if get.JSON200 == nil || !equalLimiter(*get.JSON200, want) {
		t.Fatalf("get: got %d %s, want %+v", get.StatusCode(), get.Body, want)
	}

	list, err := e.c.ListLimitersWithResponse(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if list.JSON200 == nil || len(list.JSON200.Items) != 1 || list.JSON200.NextPageToken != nil {
		t.Fatalf("list: got %d %s, want the one limiter", list.StatusCode(), list.Body)
	}

	del, err := e.c.DeleteLimiterWithResponse(ctx, "checkout-api")
	if err != nil {
		t.Fatal(err)
	}
	if del.StatusCode() != http.StatusNoContent {
		t.Fatalf("delete: got %d %s, want 204", del.StatusCode(), del.Body)
	}
	gone, err := e.c.GetLimiterWithResponse(ctx, "checkout-api")
	if err != nil {
		t.Fatal(err)
	}
	if gone.ApplicationProblemJSON404 == nil {
		t.Fatalf("get after delete: got %d %s, want 404", gone.StatusCode(), gone.Body)
	}
	again, err := e.c.DeleteLimiterWithResponse(ctx, "checkout-api")
	if err != nil {
		t.Fatal(err)
	}
	if again.ApplicationProblemJSON404 == nil {
		t.Fatalf("delete again: got %d %s, want 404", again.StatusCode(), again.Body)
	}
}

func equalLimiter(a, b client.Limiter) bool {
	return a.Name == b.Name && a.Limit == b.Limit && a.Period == b.Period && a.Algorithm == b.Algorithm &&
		(a.Burst == nil) == (b.Burst == nil) && (a.Burst == nil || *a.Burst == *b.Burst)
}

// TestSeedExample is the example every reader of the API tries first.
func TestSeedExample(t *testing.T) {
	e := newEnv(t, nil)
	e.put("seed", client.LimiterSpec{Limit: 9, Period: "1m"})

	res, err := e.c.AcquireWithResponse(ctx, "seed", client.AcquireRequest{Permits: ptr[int64](10)})
	if err != nil {
		t.Fatal(err)
	}
	d := res.JSON200
	if d == nil {
		t.Fatalf("acquire 10: got %d %s, want 200", res.StatusCode(), res.Body)
	}
	if d.Allowed || !d.ExceedsCapacity || d.RetryAfterMs != nil || d.Permits != 10 || d.Remaining != 9 || d.Limit != 9 {
		t.Errorf("acquire 10: got %+v, want a denial that exceeds capacity, without retry_after_ms", *d)
	}
	if got := res.HTTPResponse.Header.Get("Retry-After"); got != "" {
		t.Errorf("Retry-After: got %q, want none: waiting cannot help", got)
	}
	if got := e.available("seed"); got != 9 {
		t.Errorf("available after acquire 10: got %d, want 9", got)
	}

	res, err = e.c.AcquireWithResponse(ctx, "seed", client.AcquireRequest{Permits: ptr[int64](5)})
	if err != nil {
		t.Fatal(err)
	}
	if d := res.JSON200; d == nil || !d.Allowed || d.Remaining != 4 || d.ExceedsCapacity {
		t.Fatalf("acquire 5: got %d %s, want allowed with 4 remaining", res.StatusCode(), res.Body)
	}
	if got := e.available("seed"); got != 4 {
		t.Errorf("available after acquire 5: got %d, want 4", got)
	}

	// 5 more do not fit: a denial, answered 200, that says when to retry.
	res, err = e.c.AcquireWithResponse(ctx, "seed", client.AcquireRequest{Permits: ptr[int64](5)})
	if err != nil {
		t.Fatal(err)
	}
	d = res.JSON200
	if d == nil || d.Allowed || d.ExceedsCapacity || d.RetryAfterMs == nil {
		t.Fatalf("acquire 5 more: got %d %s, want a retryable denial", res.StatusCode(), res.Body)
	}
	// One permit every 60s/9 = 6.667 s; the fifth is 6666666667 ns away.
	if got, want := *d.RetryAfterMs, int64(6667); got != want {
		t.Errorf("retry_after_ms: got %d, want %d (rounded up)", got, want)
	}
	if got, want := res.HTTPResponse.Header.Get("Retry-After"), "7"; got != want {
		t.Errorf("Retry-After: got %q, want %q", got, want)
	}
	if got := e.available("seed"); got != 4 {
		t.Errorf("available after a denial: got %d, want 4", got)
	}
}

func TestAcquireBodyMayBeLeftOut(t *testing.T) {
	e := newEnv(t, nil)
	e.put("l", client.LimiterSpec{Limit: 10, Period: "1h"})
	for _, tc := range []struct {
		name        string
		contentType string
		body        string
		want        int64
	}{
		{name: "no body", want: 9},
		{name: "no body with a Content-Type", contentType: "application/json", want: 8},
		{name: "empty object", contentType: "application/json", body: "{}", want: 7},
		{name: "three", contentType: "application/json; charset=utf-8", body: `{"permits": 3}`, want: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := e.raw(http.MethodPost, "/v1/limiters/l/acquire", tc.contentType, tc.body)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("got %d %s, want 200", res.StatusCode, body)
			}
			if got := e.available("l"); got != tc.want {
				t.Errorf("available: got %d, want %d", got, tc.want)
			}
		})
	}
	// The SDK's way of sending no body.
	res, err := e.c.AcquireWithBodyWithResponse(ctx, "l", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.JSON200 == nil || res.JSON200.Permits != 1 {
		t.Fatalf("SDK without body: got %d %s, want 1 permit", res.StatusCode(), res.Body)
	}
}

func TestRateLimitHeaders(t *testing.T) {
	e := newEnv(t, nil)
	e.put("minute", client.LimiterSpec{Limit: 60, Period: "1m"})
	e.put("fast", client.LimiterSpec{Limit: 10, Period: "500ms", Algorithm: ptr(client.AlgorithmSlidingLog)})
	e.put("odd", client.LimiterSpec{Limit: 3, Period: "1500ms"})

	for _, tc := range []struct {
		name, limiter      string
		permits            int64
		policy, rateLimit  string
		retryAfter         string
		availablePolicy    string
		availableRateLimit string
	}{
		// 30 taken: full again in 30 s.
		{name: "minute", limiter: "minute", permits: 30, policy: `"minute";q=60;w=60`, rateLimit: `"minute";r=30;t=30`},
		// 31 more do not fit: one permit a second, so retry in 1 s.
		{name: "denied", limiter: "minute", permits: 31, policy: `"minute";q=60;w=60`, rateLimit: `"minute";r=30;t=30`, retryAfter: "1"},
		// Sub-second period: w rounds up to 1, t too.
		{name: "sub-second", limiter: "fast", permits: 4, policy: `"fast";q=10;w=1`, rateLimit: `"fast";r=6;t=1`},
		// 1.5 s rounds up to 2.
		{name: "fractional", limiter: "odd", permits: 1, policy: `"odd";q=3;w=2`, rateLimit: `"odd";r=2;t=1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := e.c.AcquireWithResponse(ctx, tc.limiter, client.AcquireRequest{Permits: &tc.permits})
			if err != nil {
				t.Fatal(err)
			}
			h := res.HTTPResponse.Header
			if got := h.Get("RateLimit-Policy"); got != tc.policy {
				t.Errorf("RateLimit-Policy: got %q, want %q", got, tc.policy)
			}
			if got := h.Get("RateLimit"); got != tc.rateLimit {
				t.Errorf("RateLimit: got %q, want %q", got, tc.rateLimit)
			}
			if got := h.Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("Retry-After: got %q, want %q", got, tc.retryAfter)
			}
			// The SDK reads them too.
			if sdk := res.Headers200; sdk == nil || sdk.RateLimitPolicy != tc.policy || sdk.RateLimit != tc.rateLimit ||
				(sdk.RetryAfter == nil) != (tc.retryAfter == "") || sdk.RetryAfter != nil && fmt.Sprint(*sdk.RetryAfter) != tc.retryAfter {
				t.Errorf("SDK headers: got %+v, want %s / %s / %q", sdk, tc.policy, tc.rateLimit, tc.retryAfter)
			}
			av, err := e.c.GetAvailableWithResponse(ctx, tc.limiter, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := av.HTTPResponse.Header.Get("RateLimit-Policy"); got != tc.policy {
				t.Errorf("available RateLimit-Policy: got %q, want %q", got, tc.policy)
			}
			if got := av.HTTPResponse.Header.Get("RateLimit"); got != tc.rateLimit {
				t.Errorf("available RateLimit: got %q, want %q", got, tc.rateLimit)
			}
			if got := av.HTTPResponse.Header.Get("Retry-After"); got != "" {
				t.Errorf("available Retry-After: got %q, want none", got)
			}
		})
	}

	// A replaced policy shows at once.
	e.put("minute", client.LimiterSpec{Limit: 60, Period: "2m"})
	res, err := e.c.AcquireWithResponse(ctx, "minute", client.AcquireRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.HTTPResponse.Header.Get("RateLimit-Policy"), `"minute";q=60;w=120`; got != want {
		t.Errorf("RateLimit-Policy after replace: got %q, want %q", got, want)
	}
}

func TestTenants(t *testing.T) {
	e := newEnv(t, nil)

	res, err := e.c.AcquireTenantWithResponse(ctx, "203.0.113.7", client.AcquireRequest{Permits: ptr[int64](40)})
	if err != nil {
		t.Fatal(err)
	}
	d := res.JSON200
	if d == nil {
		t.Fatalf("acquire: got %d %s, want 200", res.StatusCode(), res.Body)
	}
	if d.Tenant != "203.0.113.7" || !d.Allowed || d.Remaining != 60 || d.Limit != 100 {
		t.Errorf("acquire: got %+v, want tenant 203.0.113.7 allowed with 60 left of 100", *d)
	}
	if got, want := res.HTTPResponse.Header.Get("RateLimit-Policy"), `"tenant";q=100;w=60`; got != want {
		t.Errorf("RateLimit-Policy: got %q, want %q", got, want)
	}
	if got, want := res.HTTPResponse.Header.Get("RateLimit"), `"tenant";r=60;t=24`; got != want {
		t.Errorf("RateLimit: got %q, want %q", got, want)
	}

	// IPv6 addresses of one /64 are one tenant.
	res, err = e.c.AcquireTenantWithResponse(ctx, "2001:db8:1:2::7", client.AcquireRequest{Permits: ptr[int64](90)})
	if err != nil {
		t.Fatal(err)
	}
	if d := res.JSON200; d == nil || d.Tenant != "2001:db8:1:2::/64" || !d.Allowed {
		t.Fatalf("acquire v6: got %d %s, want allowed to 2001:db8:1:2::/64", res.StatusCode(), res.Body)
	}
	res, err = e.c.AcquireTenantWithResponse(ctx, "2001:db8:1:2:ffff::1", client.AcquireRequest{Permits: ptr[int64](20)})
	if err != nil {
		t.Fatal(err)
	}
	d = res.JSON200
	if d == nil || d.Allowed || d.RetryAfterMs == nil || d.Remaining != 10 {
		t.Fatalf("acquire v6 again: got %d %s, want a retryable denial with 10 left", res.StatusCode(), res.Body)
	}
	if res.HTTPResponse.Header.Get("Retry-After") == "" {
		t.Error("no Retry-After on a retryable denial")
	}

	av, err := e.c.GetTenantAvailableWithResponse(ctx, "2001:db8:1:2::8")
	if err != nil {
		t.Fatal(err)
	}
	if av.JSON200 == nil || av.JSON200.Tenant != "2001:db8:1:2::/64" || av.JSON200.Remaining != 10 {
		t.Fatalf("available: got %d %s, want 10 left to 2001:db8:1:2::/64", av.StatusCode(), av.Body)
	}
	if av.HTTPResponse.Header.Get("RateLimit") == "" || av.HTTPResponse.Header.Get("RateLimit-Policy") == "" {
		t.Error("available: rate-limit headers missing")
	}

	e.tenantAvailable("198.51.100.1") // a tenant never seen is full, and stays out of lowest
	low, err := e.c.ListLowestTenantsWithResponse(ctx, &client.ListLowestTenantsParams{K: ptr[int32](5)})
	if err != nil {
		t.Fatal(err)
	}
	if low.JSON200 == nil {
		t.Fatalf("lowest: got %d %s", low.StatusCode(), low.Body)
	}
	var got []string
	for _, it := range low.JSON200.Items {
		got = append(got, fmt.Sprintf("%s:%d", it.Tenant, it.Remaining))
	}
	if want := []string{"2001:db8:1:2::/64:10", "203.0.113.7:60"}; !slices.Equal(got, want) {
		t.Errorf("lowest: got %v, want %v", got, want)
	}
	if p := low.JSON200.Policy; p.Limit != 100 || p.Period != "1m0s" || p.Algorithm != client.AlgorithmGcra {
		t.Errorf("lowest policy: got %+v, want 100 per 1m0s gcra", p)
	}
	def, err := e.c.ListLowestTenantsWithResponse(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if def.JSON200 == nil || len(def.JSON200.Items) != 2 {
		t.Fatalf("lowest with the default k: got %d %s, want both tenants", def.StatusCode(), def.Body)
	}

	pol, err := e.c.GetTenantPolicyWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := pol.JSON200; p == nil || p.Limit != 100 || p.Period != "1m0s" || p.Burst == nil || *p.Burst != 100 {
		t.Fatalf("policy: got %d %s, want 100 per minute, burst 100", pol.StatusCode(), pol.Body)
	}
}

func TestPagination(t *testing.T) {
	e := newEnv(t, nil)
	var want []string
	for i := range 7 {
		name := fmt.Sprintf("limiter-%02d", i)
		want = append(want, name)
		e.put(name, client.LimiterSpec{Limit: 1, Period: "1s"})
	}
	var got []string
	var token *string
	pages := 0
	for {
		res, err := e.c.ListLimitersWithResponse(ctx, &client.ListLimitersParams{PageSize: ptr[int32](3), PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if res.JSON200 == nil {
			t.Fatalf("page %d: got %d %s", pages, res.StatusCode(), res.Body)
		}
		pages++
		for _, l := range res.JSON200.Items {
			got = append(got, l.Name)
		}
		if token = res.JSON200.NextPageToken; token == nil {
			break
		}
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("names: got %v, want %v", got, want)
	}
	if pages != 3 {
		t.Errorf("pages: got %d, want 3", pages)
	}

	// A page that ends exactly at the last limiter says there is no more.
	res, err := e.c.ListLimitersWithResponse(ctx, &client.ListLimitersParams{PageSize: ptr[int32](7)})
	if err != nil {
		t.Fatal(err)
	}
	if res.JSON200 == nil || len(res.JSON200.Items) != 7 || res.JSON200.NextPageToken != nil {
		t.Errorf("page of 7: got %d %s, want all 7 and no token", res.StatusCode(), res.Body)
	}
	// A token of a deleted limiter still works.
	tok := base64.RawURLEncoding.EncodeToString([]byte("limiter-035"))
	res, err = e.c.ListLimitersWithResponse(ctx, &client.ListLimitersParams{PageToken: &tok})
	if err != nil {
		t.Fatal(err)
	}
	if res.JSON200 == nil || len(res.JSON200.Items) != 3 || res.JSON200.Items[0].Name != "limiter-04" {
		t.Errorf("after limiter-035: got %d %s, want limiter-04 to 06", res.StatusCode(), res.Body)
	}
}

func TestHealth(t *testing.T) {
	var ready atomic.Bool
	e := newEnv(t, func(o *Options) { o.Ready = ready.Load })

	live, err := e.c.GetLivenessWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if live.JSON200 == nil || live.JSON200.Status != client.HealthStatusOk {
		t.Fatalf("livez: got %d %s", live.StatusCode(), live.Body)
	}
	res, body := e.raw(http.MethodGet, "/readyz", "", "")
	checkProblem(t, res, body, http.StatusServiceUnavailable)
	ready.Store(true)
	rd, err := e.c.GetReadinessWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rd.JSON200 == nil || rd.JSON200.Status != client.HealthStatusOk {
		t.Fatalf("readyz when ready: got %d %s", rd.StatusCode(), rd.Body)
	}
	// Still alive while not ready.
	ready.Store(false)
	live, err = e.c.GetLivenessWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if live.StatusCode() != http.StatusOK {
		t.Fatalf("livez when not ready: got %d", live.StatusCode())
	}
}

func TestServesTheSpec(t *testing.T) {
	e := newEnv(t, nil)
	y, err := e.c.GetOpenAPIWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if y.StatusCode() != http.StatusOK || !strings.HasPrefix(y.HTTPResponse.Header.Get("Content-Type"), "application/yaml") {
		t.Fatalf("openapi.yaml: got %d %s", y.StatusCode(), y.HTTPResponse.Header.Get("Content-Type"))
	}
	if !strings.HasPrefix(string(y.Body), "openapi: 3.0.3") || y.YAML200 == nil || (*y.YAML200)["paths"] == nil {
		t.Errorf("openapi.yaml: got %.40q, want the spec", y.Body)
	}
	j, err := e.c.GetOpenAPIJSONWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if j.JSON200 == nil || (*j.JSON200)["openapi"] != "3.0.3" || (*j.JSON200)["paths"] == nil {
		t.Fatalf("openapi.json: got %d %.80s", j.StatusCode(), j.Body)
	}
}

func TestDocs(t *testing.T) {
	e := newEnv(t, nil)
	res, body := e.raw(http.MethodGet, "/docs", "", "")
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("docs: got %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	page := string(body)
	if !strings.Contains(page, "/openapi.yaml") {
		t.Error("the docs page does not load /openapi.yaml")
	}
	for _, asset := range []string{"/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css", "/docs/swagger-ui-standalone-preset.js"} {
		if !strings.Contains(page, asset) {
			t.Errorf("the docs page does not load %s", asset)
		}
		res, body := e.raw(http.MethodGet, asset, "", "")
		if res.StatusCode != http.StatusOK || len(body) < 1000 {
			t.Errorf("%s: got %d, %d bytes", asset, res.StatusCode, len(body))
		}
	}
	for _, external := range []string{`src="http`, `href="http`, `src="//`, `href="//`} {
		if strings.Contains(page, external) {
			t.Errorf("the docs page loads something from another host: %s", external)
		}
	}
}

func TestMetricsEndpoint(t *testing.T) {
	e := newEnv(t, func(o *Options) {
		o.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("up 1\n"))
		})
	})
	res, body := e.raw(http.MethodGet, "/metrics", "", "")
	if res.StatusCode != http.StatusOK || string(body) != "up 1\n" {
		t.Fatalf("metrics: got %d %q", res.StatusCode, body)
	}
	none := newEnv(t, nil)
	res, body = none.raw(http.MethodGet, "/metrics", "", "")
	checkProblem(t, res, body, http.StatusNotFound)
}

func TestRequestsAreLogged(t *testing.T) {
	e := newEnv(t, nil)
	e.put("l", client.LimiterSpec{Limit: 1, Period: "1s"})
	e.available("l")
	if log := e.log.String(); !strings.Contains(log, "operation=getAvailable") || !strings.Contains(log, "status=200") {
		t.Errorf("log: got %q, want a line for getAvailable with its status", log)
	}
}

func TestReadyByDefault(t *testing.T) {
	e := newEnv(t, nil)
	rd, err := e.c.GetReadinessWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rd.StatusCode() != http.StatusOK {
		t.Fatalf("readyz without Ready: got %d, want 200", rd.StatusCode())
	}
}
