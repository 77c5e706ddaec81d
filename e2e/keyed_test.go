package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestKeyed: a keyed limiter through the container's API on the embedded
// backend: one bucket per key, availability per key, the keys closest to
// their limit, and the calls that do not fit its definition refused with
// nothing taken.
func TestKeyed(t *testing.T) {
	t.Parallel()
	api := sharedService(t).api
	ctx := t.Context()
	lim := put(t, api, "key-search", client.LimiterSpec{Limit: 5, Period: "1h", Keyed: ptr(true), MaxKeys: ptr(int32(1000))})
	if lim.Keyed == nil || !*lim.Keyed || lim.MaxKeys == nil || *lim.MaxKeys != 1000 {
		t.Fatalf("put: got %+v, want keyed with max_keys 1000", lim)
	}
	acquire := func(key string, n int64) client.Decision {
		t.Helper()
		res, err := api.AcquireWithResponse(ctx, "key-search", client.AcquireRequest{Key: &key, Permits: &n})
		if err != nil || res.JSON200 == nil {
			t.Fatalf("acquire %s %d: %v %s", key, n, err, res.Body)
		}
		return *res.JSON200
	}
	if d := acquire("user-42", 3); !d.Allowed || d.Remaining != 2 || d.Key == nil || *d.Key != "user-42" {
		t.Errorf("user-42 3: got %+v, want allowed with 2 left", d)
	}
	if d := acquire("user-42", 3); d.Allowed || d.Remaining != 2 || d.RetryAfterMs == nil {
		t.Errorf("user-42 3 more: got %+v, want denied with 2 left and a retry time", d)
	}
	if d := acquire("user-7", 1); !d.Allowed || d.Remaining != 4 {
		t.Errorf("user-7 1: got %+v, want allowed with 4 left", d)
	}
	for key, want := range map[string]int64{"user-42": 2, "user-7": 4, "user-1": 5} {
		res, err := api.GetAvailableWithResponse(ctx, "key-search", &client.GetAvailableParams{Key: ptr(key)})
		if err != nil || res.JSON200 == nil || res.JSON200.Remaining != want {
			t.Errorf("available %s: %v %s, want %d left", key, err, res.Body, want)
		}
	}
	low, err := api.ListLowestKeysWithResponse(ctx, "key-search", &client.ListLowestKeysParams{K: ptr(int32(10))})
	if err != nil || low.JSON200 == nil || len(low.JSON200.Items) != 2 || low.JSON200.Items[0].Key != "user-42" || low.JSON200.Items[1].Key != "user-7" {
		t.Fatalf("lowest: %v %s, want user-42 then user-7", err, low.Body)
	}

	// What does not fit the definition is refused and takes nothing.
	put(t, api, "key-plain", client.LimiterSpec{Limit: 5, Period: "1h"})
	res, err := api.AcquireWithResponse(ctx, "key-search", client.AcquireRequest{Permits: ptr(int64(1))})
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, res, http.StatusBadRequest, "/v1/limiters/key-search/acquire", "body.key")
	res, err = api.AcquireWithResponse(ctx, "key-plain", client.AcquireRequest{Key: ptr("user-42")})
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, res, http.StatusBadRequest, "/v1/limiters/key-plain/acquire", "body.key")
	res, err = api.AcquireWithResponse(ctx, "key-search", client.AcquireRequest{Key: ptr(strings.Repeat("é", 65))})
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, res, http.StatusBadRequest, "/v1/limiters/key-search/acquire", "body.key")
	if got := available(t, api, "key-plain"); got != 5 {
		t.Errorf("key-plain: %d left, want 5", got)
	}
	low, err = api.ListLowestKeysWithResponse(ctx, "key-search", nil)
	if err != nil || low.JSON200 == nil || len(low.JSON200.Items) != 2 || low.JSON200.Items[0].Remaining != 2 {
		t.Errorf("lowest after the refusals: %v %s, want user-42 still at 2", err, low.Body)
	}
}

// TestKeyedDecide: a per-IP, a per-user and a global limit on one action,
// decided all or nothing through the container: the call denied by one
// key's limit charges neither the other key nor the global limit.
func TestKeyedDecide(t *testing.T) {
	t.Parallel()
	api := sharedService(t).api
	group := "key-api"
	put(t, api, "key-api-ip", client.LimiterSpec{Limit: 3, Period: "1h", Keyed: ptr(true), Group: &group})
	put(t, api, "key-api-user", client.LimiterSpec{Limit: 2, Period: "1h", Keyed: ptr(true), Group: &group})
	put(t, api, "key-api-global", client.LimiterSpec{Limit: 100, Period: "1h", Group: &group})
	call := func(ip, user string) client.DecideRequest {
		return client.DecideRequest{Items: []client.DecideItem{{Limiter: "key-api-ip", Key: &ip}, {Limiter: "key-api-user", Key: &user}, {Limiter: "key-api-global"}}}
	}
	for i, want := range []bool{true, true, false} {
		v := decide(t, api, call("203.0.113.7", "alice"))
		if v.Allowed != want {
			t.Fatalf("alice's call %d: got %+v, want allowed %v", i+1, v, want)
		}
	}
	if v := decide(t, api, call("203.0.113.7", "bob")); !v.Allowed || v.Items[0].Remaining != 0 {
		t.Fatalf("bob: got %+v, want allowed with the address's last permit", v)
	}
	if v := decide(t, api, call("203.0.113.7", "carol")); v.Allowed || v.Items[0].Fits || !v.Items[1].Fits {
		t.Fatalf("carol: got %+v, want denied by the address alone", v)
	}
	if got := available(t, api, "key-api-global"); got != 97 {
		t.Errorf("global: %d left, want 97: the denied calls took nothing", got)
	}
	res, err := api.GetAvailableWithResponse(t.Context(), "key-api-user", &client.GetAvailableParams{Key: ptr("carol")})
	if err != nil || res.JSON200 == nil || res.JSON200.Remaining != 2 {
		t.Errorf("carol's own limit: %v %s, want 2 left", err, res.Body)
	}
}

// TestKeyedOnRedisRefused: the Redis backend keeps no keyed limiters yet,
// and says so with a 501 that creates nothing.
func TestKeyedOnRedisRefused(t *testing.T) {
	t.Parallel()
	_, replicas := sharedRedis(t, 1, nil)
	api := replicas[0].api
	res, err := api.PutLimiterWithResponse(t.Context(), "key-redis", client.LimiterSpec{Limit: 5, Period: "1h", Keyed: ptr(true)})
	if err != nil {
		t.Fatal(err)
	}
	p := checkProblem(t, res, http.StatusNotImplemented, "/v1/limiters/key-redis", "")
	if !strings.Contains(strPtr(p.Detail), "memory backend") {
		t.Errorf("problem %+v: want it to say which backend keeps keyed limiters", p)
	}
	get, err := api.GetLimiterWithResponse(t.Context(), "key-redis")
	if err != nil || get.StatusCode() != http.StatusNotFound {
		t.Errorf("get after the refusal: %v %d, want 404", err, get.StatusCode())
	}
}
