package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/ratelimitheader"
)

// TestKeyedLimiter drives a keyed limiter through the generated client:
// one bucket per key, availability per key, the keys closest to their
// limit, and the definition as it was given.
func TestKeyedLimiter(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	keyed, maxKeys := true, int32(50)
	e.put("per-user", client.LimiterSpec{Limit: 9, Period: "1m", Keyed: &keyed, MaxKeys: &maxKeys})

	def, err := e.c.GetLimiterWithResponse(ctx, "per-user")
	if err != nil || def.JSON200 == nil || def.JSON200.Keyed == nil || !*def.JSON200.Keyed || *def.JSON200.MaxKeys != 50 {
		t.Fatalf("GetLimiter: %v %s, want keyed with max_keys 50", err, def.Body)
	}
	acquire := func(key string, n int64) *client.Decision {
		t.Helper()
		res, err := e.c.AcquireWithResponse(ctx, "per-user", client.AcquireRequest{Key: &key, Permits: &n})
		if err != nil || res.JSON200 == nil {
			t.Fatalf("acquire %s %d: %v %d %s", key, n, err, res.StatusCode(), res.Body)
		}
		if res.JSON200.Key == nil || *res.JSON200.Key != key {
			t.Errorf("acquire %s: the answer names key %v", key, res.JSON200.Key)
		}
		if got, want := res.HTTPResponse.Header.Get("RateLimit"), ratelimitheader.Value("per-user", res.JSON200.Remaining, time.Duration(res.JSON200.ResetAfterMs)*time.Millisecond); !strings.HasPrefix(got, `"per-user";r=`) {
			t.Errorf("acquire %s: RateLimit %q, want one like %q", key, got, want)
		}
		return res.JSON200
	}
	if d := acquire("alice", 5); !d.Allowed || d.Remaining != 4 {
		t.Errorf("alice 5: got %+v, want allowed with 4 left", d)
	}
	if d := acquire("bob", 10); d.Allowed || !d.ExceedsCapacity || d.Remaining != 9 {
		t.Errorf("bob 10: got %+v, want denied, exceeds capacity, 9 left", d)
	}
	if d := acquire("carol", 9); !d.Allowed || d.Remaining != 0 {
		t.Errorf("carol 9: got %+v, want allowed with 0 left", d)
	}
	if d := acquire("carol", 1); d.Allowed || d.RetryAfterMs == nil {
		t.Errorf("carol 1 more: got %+v, want denied with a retry time", d)
	}
	for key, want := range map[string]int64{"alice": 4, "bob": 9, "carol": 0, "user with spaces/é": 9} {
		k := key
		res, err := e.c.GetAvailableWithResponse(ctx, "per-user", &client.GetAvailableParams{Key: &k})
		if err != nil || res.JSON200 == nil || res.JSON200.Remaining != want || res.JSON200.Key == nil || *res.JSON200.Key != key {
			t.Errorf("available %q: %v %s, want %d left", key, err, res.Body, want)
		}
	}
	k := int32(10)
	low, err := e.c.ListLowestKeysWithResponse(ctx, "per-user", &client.ListLowestKeysParams{K: &k})
	if err != nil || low.JSON200 == nil {
		t.Fatalf("lowest: %v %s", err, low.Body)
	}
	var got []string
	for _, it := range low.JSON200.Items {
		got = append(got, it.Key)
	}
	if strings.Join(got, ",") != "carol,alice" || low.JSON200.Items[0].Remaining != 0 || low.JSON200.Items[1].Remaining != 4 {
		t.Errorf("lowest: got %+v, want carol (0 left) then alice (4); bob took nothing", low.JSON200.Items)
	}
}

// TestKeyedBadInput: a key where none is taken, none where one is needed,
// a key that breaks the rule, a budget of keys exceeded: each is the right
// 4xx problem, and nothing is taken.
func TestKeyedBadInput(t *testing.T) {
	e := newEnv(t, nil)
	keyed := true
	e.put("per-user", client.LimiterSpec{Limit: 9, Period: "1m", Keyed: &keyed})
	e.put("plain", client.LimiterSpec{Limit: 9, Period: "1m"})
	long := strings.Repeat("é", 65) // 65 characters, 130 bytes
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		location                 string
	}{
		{"no key for a keyed limiter", "POST", "/v1/limiters/per-user/acquire", `{"permits":1}`, 400, "body.key"},
		{"no body for a keyed limiter", "POST", "/v1/limiters/per-user/acquire", ``, 400, "body.key"},
		{"a key for a plain limiter", "POST", "/v1/limiters/plain/acquire", `{"key":"alice"}`, 400, "body.key"},
		{"an empty key", "POST", "/v1/limiters/per-user/acquire", `{"key":""}`, 400, "body.key"},
		{"a key of 129 characters", "POST", "/v1/limiters/per-user/acquire", `{"key":"` + strings.Repeat("k", 129) + `"}`, 400, "body.key"},
		{"a key of 130 bytes", "POST", "/v1/limiters/per-user/acquire", `{"key":"` + long + `"}`, 400, "body.key"},
		{"a control character", "POST", "/v1/limiters/per-user/acquire", `{"key":"a\u0000b"}`, 400, "body.key"},
		{"a key that is a number", "POST", "/v1/limiters/per-user/acquire", `{"key":42}`, 400, "body.key"},
		{"available without a key", "GET", "/v1/limiters/per-user/available", "", 400, "query.key"},
		{"available with a key of a plain limiter", "GET", "/v1/limiters/plain/available?key=alice", "", 400, "query.key"},
		{"available with an empty key", "GET", "/v1/limiters/per-user/available?key=", "", 400, "query.key"},
		{"available with a control character", "GET", "/v1/limiters/per-user/available?key=" + url.QueryEscape("a\x01"), "", 400, "query.key"},
		{"lowest of a plain limiter", "GET", "/v1/limiters/plain/lowest", "", 400, "query.key"},
		{"lowest with k=0", "GET", "/v1/limiters/per-user/lowest?k=0", "", 400, "query.k"},
		{"lowest with k=1001", "GET", "/v1/limiters/per-user/lowest?k=1001", "", 400, "query.k"},
		{"lowest of an unknown limiter", "GET", "/v1/limiters/missing/lowest", "", 404, ""},
		{"acquire from an unknown keyed limiter", "POST", "/v1/limiters/missing/acquire", `{"key":"alice"}`, 404, ""},
		{"max_keys without keyed", "PUT", "/v1/limiters/other", `{"limit":1,"period":"1s","max_keys":5}`, 400, "body"},
		{"max_keys of 0", "PUT", "/v1/limiters/other", `{"limit":1,"period":"1s","keyed":true,"max_keys":0}`, 400, "body.max_keys"},
		{"max_keys past the bound", "PUT", "/v1/limiters/other", `{"limit":1,"period":"1s","keyed":true,"max_keys":10000001}`, 400, "body.max_keys"},
		{"max_keys past the budget", "PUT", "/v1/limiters/other", `{"limit":1,"period":"1s","keyed":true,"max_keys":1000000}`, 409, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct := ""
			if tc.body != "" {
				ct = "application/json"
			}
			res, body := e.raw(tc.method, tc.path, ct, tc.body)
			if res.StatusCode != tc.status || res.Header.Get("Content-Type") != problemJSON {
				t.Fatalf("got %d %s %s, want a %d problem", res.StatusCode, res.Header.Get("Content-Type"), body, tc.status)
			}
			var p client.Problem
			if err := json.Unmarshal(body, &p); err != nil {
				t.Fatal(err)
			}
			if tc.location != "" && (p.Errors == nil || !containsLocation(*p.Errors, tc.location)) {
				t.Errorf("got %s, want an error at %s", body, tc.location)
			}
			if strings.Contains(string(body), "limiter:") || strings.Contains(string(body), "memory:") {
				t.Errorf("the problem leaks internal text: %s", body)
			}
		})
	}
	if got := e.available("plain"); got != 9 {
		t.Errorf("plain: %d left after the bad requests, want 9", got)
	}
	low, err := e.c.ListLowestKeysWithResponse(context.Background(), "per-user", nil)
	if err != nil || low.JSON200 == nil || len(low.JSON200.Items) != 0 {
		t.Errorf("per-user after the bad requests: %v %s, want no key used", err, low.Body)
	}
	if res, _ := e.c.GetLimiterWithResponse(context.Background(), "other"); res.StatusCode() != http.StatusNotFound {
		t.Errorf("the refused definitions: GET other answered %d, want 404", res.StatusCode())
	}
	// The budget's message says what to do.
	_, body := e.raw("PUT", "/v1/limiters/other", "application/json", `{"limit":1,"period":"1s","keyed":true,"max_keys":`+strconv.Itoa(limiter.KeyBudget)+`}`)
	if !strings.Contains(string(body), "max_keys") || !strings.Contains(string(body), "budget") {
		t.Errorf("budget problem %s: want it to name max_keys and the budget", body)
	}
}

func containsLocation(errs []client.FieldError, location string) bool {
	for _, e := range errs {
		if e.Location == location {
			return true
		}
	}
	return false
}

// TestKeyedDecide: a per-IP limit, a per-user limit and a global one on
// one action, decided all or nothing through POST /v1/decide: when one key
// is out of permits, neither the other key nor the global limit is
// charged. Keys of limiters in no group, and reservations of keys, are
// refused.
func TestKeyedDecide(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	keyed, group := true, "api"
	e.put("api-per-ip", client.LimiterSpec{Limit: 3, Period: "1h", Keyed: &keyed, Group: &group})
	e.put("api-per-user", client.LimiterSpec{Limit: 2, Period: "1h", Keyed: &keyed, Group: &group})
	e.put("api-global", client.LimiterSpec{Limit: 100, Period: "1h", Group: &group})
	req := func(ip, user string) client.DecideRequest {
		return client.DecideRequest{Items: []client.DecideItem{
			{Limiter: "api-per-ip", Key: &ip}, {Limiter: "api-per-user", Key: &user}, {Limiter: "api-global"},
		}}
	}
	decide := func(ip, user string) client.Verdict {
		t.Helper()
		res, err := e.c.DecideWithResponse(ctx, nil, req(ip, user))
		if err != nil || res.JSON200 == nil {
			t.Fatalf("decide %s %s: %v %s", ip, user, err, res.Body)
		}
		return *res.JSON200
	}
	for range 2 {
		if v := decide("203.0.113.7", "alice"); !v.Allowed {
			t.Fatalf("alice: got %+v, want allowed", v)
		}
	}
	v := decide("203.0.113.7", "alice")
	if v.Allowed || v.Items[1].Fits || !v.Items[0].Fits || v.Items[0].Remaining != 1 || v.Items[2].Remaining != 98 {
		t.Fatalf("alice's third: got %+v, want denied by the per-user limit alone, nothing taken", v)
	}
	if v.Items[1].Key == nil || *v.Items[1].Key != "alice" {
		t.Errorf("the check names key %v, want alice", v.Items[1].Key)
	}
	if v := decide("203.0.113.7", "bob"); !v.Allowed || v.Items[0].Remaining != 0 || v.Items[1].Remaining != 1 {
		t.Fatalf("bob from the same address: got %+v, want allowed, the address's last permit", v)
	}
	if v := decide("203.0.113.7", "carol"); v.Allowed || v.Items[0].Fits {
		t.Fatalf("carol from the same address: got %+v, want denied by the per-IP limit", v)
	}
	if got := e.available("api-global"); got != 97 {
		t.Errorf("global: %d left, want 97: the denied decisions took nothing", got)
	}

	e.put("lone-per-user", client.LimiterSpec{Limit: 2, Period: "1h", Keyed: &keyed})
	a, b := "a", "b"
	for _, tc := range []struct {
		name string
		body client.DecideRequest
	}{
		{"two keys of a limiter in no group", client.DecideRequest{Items: []client.DecideItem{{Limiter: "lone-per-user", Key: &a}, {Limiter: "lone-per-user", Key: &b}}}},
		{"a keyed limiter without its key", client.DecideRequest{Items: []client.DecideItem{{Limiter: "api-per-user"}, {Limiter: "api-global"}}}},
		{"a key of a plain limiter", client.DecideRequest{Items: []client.DecideItem{{Limiter: "api-global", Key: &a}}}},
	} {
		res, err := e.c.DecideWithResponse(ctx, nil, tc.body)
		if err != nil || res.StatusCode() != http.StatusBadRequest || !strings.Contains(string(res.Body), "body.items") {
			t.Errorf("%s: %v %d %s, want a 400 at body.items", tc.name, err, res.StatusCode(), res.Body)
		}
	}
	if got := e.available("api-global"); got != 97 {
		t.Errorf("global after the refusals: %d left, want 97", got)
	}

	// A key that finds its limiter full of limited keys is refused room.
	one := int32(1)
	e.put("tiny", client.LimiterSpec{Limit: 1, Period: "1h", Keyed: &keyed, MaxKeys: &one, Group: &group})
	full := func(key string) client.Verdict {
		t.Helper()
		res, err := e.c.DecideWithResponse(ctx, nil, client.DecideRequest{Items: []client.DecideItem{{Limiter: "tiny", Key: &key}, {Limiter: "api-global"}}})
		if err != nil || res.JSON200 == nil {
			t.Fatalf("tiny %s: %v %s", key, err, res.Body)
		}
		return *res.JSON200
	}
	if v := full("x"); !v.Allowed {
		t.Fatalf("tiny x: got %+v, want allowed", v)
	}
	if v := full("y"); v.Allowed || v.Items[0].KeysFull == nil || !*v.Items[0].KeysFull || v.RetryAfterMs == nil {
		t.Fatalf("tiny y: got %+v, want denied, keys_full, with a retry time", v)
	}
	if got := e.available("api-global"); got != 96 {
		t.Errorf("global after tiny: %d left, want 96", got)
	}
}

// TestKeyedReservation: a reservation of one key of a keyed limiter in no
// group is settled through its ID, which names the key; a settlement
// naming another key is refused and changes nothing.
func TestKeyedReservation(t *testing.T) {
	e := newEnv(t, nil)
	ctx := t.Context()
	keyed := true
	e.put("llm-per-user", client.LimiterSpec{Limit: 10, Period: "1h", Keyed: &keyed})
	alice, bob := "alice: user/1", "bob"
	n := int64(8)
	res, err := e.c.ReserveWithResponse(ctx, nil, client.ReserveRequest{Items: []client.DecideItem{{Limiter: "llm-per-user", Key: &alice, Permits: &n}}})
	if err != nil || res.JSON200 == nil || !res.JSON200.Allowed || res.JSON200.Reservation == nil || res.JSON200.Items[0].Remaining != 2 {
		t.Fatalf("reserve 8 of alice's 10: %v %s", err, res.Body)
	}
	id := *res.JSON200.Reservation
	wrong, err := e.c.SettleReservationWithResponse(ctx, id, nil, client.SettleRequest{Items: []client.SettleItem{{Limiter: "llm-per-user", Key: &bob, Permits: 1}}})
	if err != nil || wrong.StatusCode() != http.StatusBadRequest || !strings.Contains(string(wrong.Body), `key \"bob\"`) {
		t.Errorf("a settlement of another key: %v %d %s, want a 400 naming the key", err, wrong.StatusCode(), wrong.Body)
	}
	set, err := e.c.SettleReservationWithResponse(ctx, id, nil, client.SettleRequest{Items: []client.SettleItem{{Limiter: "llm-per-user", Key: &alice, Permits: 3}}})
	if err != nil || set.JSON200 == nil || set.JSON200.Items[0].Remaining != 7 || set.JSON200.Items[0].Key == nil || *set.JSON200.Items[0].Key != alice {
		t.Errorf("settle alice at 3: %v %s, want 7 left", err, set.Body)
	}
	for key, want := range map[string]int64{alice: 7, bob: 10} {
		a, err := e.c.GetAvailableWithResponse(ctx, "llm-per-user", &client.GetAvailableParams{Key: &key})
		if err != nil || a.JSON200 == nil || a.JSON200.Remaining != want {
			t.Errorf("%s after the settlement: %v %s, want %d left", key, err, a.Body, want)
		}
	}
}

// TestKeyedBatch: a batch names keys; an acquisition that does not fit its
// limiter's definition is a 400 problem of its own, the others decided.
func TestKeyedBatch(t *testing.T) {
	e := newEnv(t, nil)
	ctx := t.Context()
	keyed := true
	e.put("batch-per-user", client.LimiterSpec{Limit: 3, Period: "1h", Keyed: &keyed})
	e.put("batch-plain", client.LimiterSpec{Limit: 3, Period: "1h"})
	u1, n := "user-1", int64(2)
	res, err := e.c.AcquireBatchWithResponse(ctx, client.BatchAcquireRequest{Acquisitions: []client.BatchAcquisition{
		{Limiter: "batch-per-user", Key: &u1, Permits: &n},
		{Limiter: "batch-per-user", Key: &u1, Permits: &n},
		{Limiter: "batch-per-user"},
		{Limiter: "batch-plain", Key: &u1},
	}})
	if err != nil || res.JSON200 == nil || len(res.JSON200.Results) != 4 {
		t.Fatalf("batch: %v %s", err, res.Body)
	}
	rs := res.JSON200.Results
	if d := rs[0].Decision; d == nil || !d.Allowed || d.Remaining != 1 || d.Key == nil || *d.Key != u1 {
		t.Errorf("user-1 2: got %+v, want allowed with 1 left, naming the key", rs[0])
	}
	if d := rs[1].Decision; d == nil || d.Allowed || d.Remaining != 1 {
		t.Errorf("user-1 2 more: got %+v, want denied with 1 left", rs[1])
	}
	for _, r := range rs[2:] {
		if r.Status != http.StatusBadRequest || r.Problem == nil || r.Problem.Detail == nil || !strings.Contains(*r.Problem.Detail, "keyed") {
			t.Errorf("%s: got %+v, want a 400 problem saying why", r.Limiter, r)
		}
	}
	if got := e.available("batch-plain"); got != 3 {
		t.Errorf("batch-plain: %d left, want 3", got)
	}
}
