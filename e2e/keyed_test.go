package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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

// TestKeyedAcrossReplicas: 2,000 concurrent decisions through 3 replicas
// on one Redis, each asking one permit of an address's key, a user's key
// and a global limit of one group. Four clients, each with its own
// address and user, make 500 decisions each; a user may make 60 per
// 8784h, an address 100, everyone together 1,000. A sequential model
// admits exactly 60 per client whatever the order, and takes 60 of each
// address's 100: a decision denied by the user's limit charges neither its
// address nor the global limit.
func TestKeyedAcrossReplicas(t *testing.T) {
	t.Parallel()
	_, replicas := sharedRedis(t, 3, map[string]string{"RATELIMITER_REDIS_TIMEOUT": "2s"})
	group := "rk"
	put(t, replicas[0].api, "rk-ip", client.LimiterSpec{Limit: 100, Period: "8784h", Keyed: ptr(true), Group: &group})
	put(t, replicas[1].api, "rk-user", client.LimiterSpec{Limit: 60, Period: "8784h", Keyed: ptr(true), Group: &group})
	put(t, replicas[2].api, "rk-global", client.LimiterSpec{Limit: 1000, Period: "8784h", Group: &group})
	const clients, decisions = 4, 2000
	call := func(c int) client.DecideRequest {
		ip, user := fmt.Sprintf("203.0.113.%d", c), fmt.Sprintf("user-%d", c)
		return client.DecideRequest{Items: []client.DecideItem{{Limiter: "rk-ip", Key: &ip}, {Limiter: "rk-user", Key: &user}, {Limiter: "rk-global"}}}
	}
	var (
		next     atomic.Int64
		allowed  [clients]atomic.Int64
		mu       sync.Mutex
		failures []string
		wg       sync.WaitGroup
	)
	for w := range 48 {
		wg.Go(func() {
			api := replicas[w%len(replicas)].api
			for {
				i := next.Add(1)
				if i > decisions {
					return
				}
				c := int(i % clients)
				res, err := api.DecideWithResponse(t.Context(), nil, call(c))
				switch {
				case err != nil || res.JSON200 == nil || res.JSON200.Degraded != nil:
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%v %s", err, res.Body))
					mu.Unlock()
				case res.JSON200.Allowed:
					allowed[c].Add(1)
				}
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d decisions failed, first: %s", len(failures), failures[0])
	}
	api := replicas[1].api
	for c := range clients {
		if got := allowed[c].Load(); got != 60 {
			t.Errorf("client %d: admitted %d of %d decisions, the sequential model admits 60", c, got, decisions/clients)
		}
		for name, want := range map[string]int64{"rk-ip": 40, "rk-user": 0} {
			key := fmt.Sprintf("203.0.113.%d", c)
			if name == "rk-user" {
				key = fmt.Sprintf("user-%d", c)
			}
			res, err := api.GetAvailableWithResponse(t.Context(), name, &client.GetAvailableParams{Key: &key})
			if err != nil || res.JSON200 == nil || res.JSON200.Remaining != want {
				t.Errorf("%s %s: %v %s, want %d left", name, key, err, res.Body, want)
			}
		}
	}
	if got := available(t, replicas[0].api, "rk-global"); got != 1000-60*clients {
		t.Errorf("global: %d left, want %d", got, 1000-60*clients)
	}
	low, err := replicas[2].api.ListLowestKeysWithResponse(t.Context(), "rk-ip", &client.ListLowestKeysParams{K: ptr(int32(10))})
	if err != nil || low.JSON200 == nil || len(low.JSON200.Items) != clients || low.JSON200.Items[0].Remaining != 40 {
		t.Errorf("lowest addresses: %v %s, want the %d addresses at 40 left", err, low.Body, clients)
	}

	// A changed definition starts the keys afresh, on every replica.
	put(t, replicas[0].api, "rk-user", client.LimiterSpec{Limit: 61, Period: "8784h", Keyed: ptr(true), Group: &group})
	key := "user-0"
	res, err := replicas[2].api.AcquireWithResponse(t.Context(), "rk-user", client.AcquireRequest{Key: &key})
	if err != nil || res.JSON200 == nil || !res.JSON200.Allowed || res.JSON200.Remaining != 60 {
		t.Errorf("user-0 under the new definition: %v %s, want allowed with 60 left", err, res.Body)
	}

	// A reservation of a key made through one replica is settled through
	// another, once.
	put(t, replicas[0].api, "rk-tokens", client.LimiterSpec{Limit: 10000, Period: "8784h", Keyed: ptr(true)})
	user, n := "user-9", int64(4000)
	rres, err := replicas[0].api.ReserveWithResponse(t.Context(), nil, client.ReserveRequest{Items: []client.DecideItem{{Limiter: "rk-tokens", Key: &user, Permits: &n}}})
	if err != nil || rres.JSON200 == nil || rres.JSON200.Reservation == nil || !strings.HasPrefix(*rres.JSON200.Reservation, "k.rk-tokens.") {
		t.Fatalf("reserve 4000 of user-9's tokens: %v %s", err, rres.Body)
	}
	id := *rres.JSON200.Reservation
	settle := client.SettleRequest{Items: []client.SettleItem{{Limiter: "rk-tokens", Key: &user, Permits: 6500}}}
	sres, err := replicas[1].api.SettleReservationWithResponse(t.Context(), id, nil, settle)
	if err != nil || sres.JSON200 == nil || sres.JSON200.Items[0].Remaining != 3500 {
		t.Fatalf("settle at 6500 through another replica: %v %s, want 3500 left", err, sres.Body)
	}
	again, err := replicas[2].api.SettleReservationWithResponse(t.Context(), id, nil, settle)
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, again, http.StatusNotFound, "/v1/reservations/"+id+"/settle", "")

	// A batch names keys, each decided on its own.
	b, err := replicas[2].api.AcquireBatchWithResponse(t.Context(), client.BatchAcquireRequest{Acquisitions: []client.BatchAcquisition{
		{Limiter: "rk-tokens", Key: &user, Permits: ptr(int64(3500))}, {Limiter: "rk-tokens", Key: &user}, {Limiter: "rk-tokens"},
	}})
	if err != nil || b.JSON200 == nil || len(b.JSON200.Results) != 3 {
		t.Fatalf("batch: %v %s", err, b.Body)
	}
	rs := b.JSON200.Results
	if rs[0].Decision == nil || !rs[0].Decision.Allowed || rs[1].Decision == nil || rs[1].Decision.Allowed || rs[2].Status != http.StatusBadRequest {
		t.Errorf("batch of user-9's last 3500, one more, and one without a key: %s", b.Body)
	}
}
