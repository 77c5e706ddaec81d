package e2e

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

// decideItems builds a decision of (limiter, permits) pairs.
func decideItems(pairs ...any) client.DecideRequest {
	var req client.DecideRequest
	for i := 0; i+1 < len(pairs); i += 2 {
		n := int64(pairs[i+1].(int))
		req.Items = append(req.Items, client.DecideItem{Limiter: pairs[i].(string), Permits: &n})
	}
	return req
}

func decide(t *testing.T, api *client.ClientWithResponses, req client.DecideRequest) client.Verdict {
	t.Helper()
	res, err := api.DecideWithResponse(t.Context(), nil, req)
	if err != nil {
		t.Fatalf("decide %+v: %v", req, err)
	}
	if res.JSON200 == nil {
		t.Fatalf("decide %+v: got %d %s, want 200", req, res.StatusCode(), res.Body)
	}
	return *res.JSON200
}

// TestDecide: a burst limit and a daily quota on one action, decided
// together through the container's API: all or nothing, peeks take
// nothing, charges go into debt and refunds pay it off, and what is
// refused changes nothing.
func TestDecide(t *testing.T) {
	api := sharedService(t).api
	group := "dec-checkout"
	put(t, api, "dec-burst", client.LimiterSpec{Limit: 3, Period: "1h", Group: &group})
	put(t, api, "dec-daily", client.LimiterSpec{Limit: 5, Period: "24h", Group: &group, Algorithm: ptr(client.AlgorithmSlidingLog)})

	if v := decide(t, api, decideItems("dec-burst", 2, "dec-daily", 2)); !v.Allowed || v.Items[0].Remaining != 1 || v.Items[1].Remaining != 3 {
		t.Fatalf("2 of both: got %+v, want allowed with 1 and 3 left", v)
	}
	v := decide(t, api, decideItems("dec-burst", 2, "dec-daily", 2))
	if v.Allowed || v.RetryAfterMs == nil || v.Items[0].Fits || !v.Items[1].Fits {
		t.Fatalf("2 more: got %+v, want denied by the burst limit alone", v)
	}
	if b, d := available(t, api, "dec-burst"), available(t, api, "dec-daily"); b != 1 || d != 3 {
		t.Fatalf("after the denial: %d and %d left, want 1 and 3: a denied decision took something", b, d)
	}
	res, err := api.PeekWithResponse(t.Context(), decideItems("dec-burst", 1, "dec-daily", 3))
	if err != nil || res.JSON200 == nil || !res.JSON200.Allowed {
		t.Fatalf("peek: got %v %s, want allowed", err, res.Body)
	}
	if b, d := available(t, api, "dec-burst"), available(t, api, "dec-daily"); b != 1 || d != 3 {
		t.Fatalf("after the peek: %d and %d left, want 1 and 3", b, d)
	}

	// Charge 3 more than the burst limiter holds: it is in debt, and a
	// refund pays the debt off before it gives anything back.
	cres, err := api.ChargeWithResponse(t.Context(), nil, decideItems("dec-burst", 4, "dec-daily", 1))
	if err != nil || cres.JSON200 == nil || !cres.JSON200.Allowed || cres.JSON200.Items[0].Remaining != 0 || cres.JSON200.Items[1].Remaining != 2 {
		t.Fatalf("charge 4 and 1: got %v %s, want applied with 0 and 2 left", err, cres.Body)
	}
	if v := decide(t, api, decideItems("dec-burst", 1, "dec-daily", 1)); v.Allowed {
		t.Fatalf("decide in debt: got %+v, want denied", v)
	}
	rres, err := api.RefundWithResponse(t.Context(), nil, decideItems("dec-burst", 4, "dec-daily", 1))
	if err != nil || rres.JSON200 == nil || rres.JSON200.Items[0].Remaining != 1 || rres.JSON200.Items[1].Remaining != 3 {
		t.Fatalf("refund 4 and 1: got %v %s, want 1 and 3 left", err, rres.Body)
	}

	// A reservation holds its permits until it is cancelled.
	two := int64(2)
	vres, err := api.ReserveWithResponse(t.Context(), nil, client.ReserveRequest{Items: []client.DecideItem{{Limiter: "dec-daily", Permits: &two}}, TTL: ptr("1m")})
	if err != nil || vres.JSON200 == nil || vres.JSON200.Reservation == nil || vres.JSON200.Items[0].Remaining != 1 {
		t.Fatalf("reserve 2 of 3: %v %s", err, vres.Body)
	}
	xres, err := api.CancelReservationWithResponse(t.Context(), *vres.JSON200.Reservation)
	if err != nil || xres.JSON200 == nil || xres.JSON200.Items[0].Remaining != 3 {
		t.Fatalf("cancel: %v %s, want 3 left", err, xres.Body)
	}

	put(t, api, "dec-solo", client.LimiterSpec{Limit: 5, Period: "1h"})
	key := &client.DecideParams{IdempotencyKey: ptr("dec-key-1")}
	for i := range 3 {
		res, err := api.DecideWithResponse(t.Context(), key, decideItems("dec-solo", 2))
		if err != nil || res.JSON200 == nil || !res.JSON200.Allowed || (res.JSON200.Replayed != nil) != (i > 0) {
			t.Fatalf("decide with a key, call %d: %v %s", i, err, res.Body)
		}
	}
	kres, err := api.DecideWithResponse(t.Context(), key, decideItems("dec-solo", 1))
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, kres, http.StatusUnprocessableEntity, "/v1/decide", "")
	if got := available(t, api, "dec-solo"); got != 3 {
		t.Fatalf("after one decision of 2 sent 3 times with one key: %d left, want 3", got)
	}
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"across groups", `{"items":[{"limiter":"dec-burst"},{"limiter":"dec-solo"}]}`, http.StatusBadRequest},
		{"unknown limiter", `{"items":[{"limiter":"dec-burst"},{"limiter":"dec-nope"}]}`, http.StatusNotFound},
		{"zero permits", `{"items":[{"limiter":"dec-burst","permits":0}]}`, http.StatusBadRequest},
		{"33 items", `{"items":[` + strings.Repeat(`{"limiter":"dec-burst"},`, 32) + `{"limiter":"dec-burst"}]}`, http.StatusBadRequest},
		{"duplicate field", `{"items":[{"limiter":"dec-burst","limiter":"dec-daily"}]}`, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dres, err := api.DecideWithBodyWithResponse(t.Context(), nil, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			checkProblem(t, dres, tc.status, "/v1/decide", "")
			pres, err := api.PeekWithBodyWithResponse(t.Context(), "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			checkProblem(t, pres, tc.status, "/v1/peek", "")
		})
	}
	// Moving a limiter to another group is a conflict.
	other := "dec-other"
	pres, err := api.PutLimiterWithResponse(t.Context(), "dec-burst", client.LimiterSpec{Limit: 3, Period: "1h", Group: &other})
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, pres, http.StatusConflict, "/v1/limiters/dec-burst", "")
	if b, d, s := available(t, api, "dec-burst"), available(t, api, "dec-daily"), available(t, api, "dec-solo"); b != 1 || d != 3 || s != 3 {
		t.Errorf("after the refusals: %d, %d and %d left, want 1, 3 and 3", b, d, s)
	}
}

// TestDecideAcrossReplicas: 2,000 concurrent decisions through 3 replicas
// on one Redis, each asking 1, 2 and 3 permits of three limiters of one
// group, whose limits are 500, 700 and 3,000 per 8784h. A sequential model
// admits exactly 350 and takes 350, 700 and 1,050 permits, whatever the
// order. The period is the longest so that nothing refills while the test
// runs: 3,000 an hour would regain a permit every 1.2 s.
func TestDecideAcrossReplicas(t *testing.T) {
	_, replicas := sharedRedis(t, 3, map[string]string{"RATELIMITER_REDIS_TIMEOUT": "2s"})
	group := "rep"
	limits := []int64{500, 700, 3000}
	names := []string{"rep-a", "rep-b", "rep-c"}
	for j, name := range names {
		put(t, replicas[j].api, name, client.LimiterSpec{Limit: limits[j], Period: "8784h", Group: &group})
	}
	req := decideItems(names[0], 1, names[1], 2, names[2], 3)
	const decisions = 2000
	var (
		next, allowed, denied, degraded atomic.Int64
		mu                              sync.Mutex
		failures                        []string
		wg                              sync.WaitGroup
	)
	for w := range 48 {
		wg.Go(func() {
			api := replicas[w%len(replicas)].api
			for next.Add(1) <= decisions {
				res, err := api.DecideWithResponse(t.Context(), nil, req)
				switch {
				case err != nil:
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
				case res.JSON200 == nil:
					mu.Lock()
					failures = append(failures, res.Status()+" "+string(res.Body))
					mu.Unlock()
				case res.JSON200.Degraded != nil:
					degraded.Add(1)
				case res.JSON200.Allowed:
					allowed.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d decisions failed, first: %s", len(failures), failures[0])
	}
	if got := degraded.Load(); got != 0 {
		t.Errorf("%d decisions were degraded with Redis up", got)
	}
	if got := allowed.Load(); got != 350 {
		t.Errorf("admitted %d of %d decisions through 3 replicas, the sequential model admits 350", got, decisions)
	}
	for j, name := range names {
		if used, want := limits[j]-available(t, replicas[(j+1)%3].api, name), int64(350*(j+1)); used != want {
			t.Errorf("%s: %d permits taken, the model takes %d", name, used, want)
		}
	}
	t.Logf("admitted %d, denied %d of %d decisions of 3 limiters through 3 replicas", allowed.Load(), denied.Load(), decisions)

	// A charge retried with its Idempotency-Key through another replica,
	// as a client does after a timeout, is charged once.
	put(t, replicas[0].api, "rep-once", client.LimiterSpec{Limit: 100, Period: "8784h"})
	key := &client.ChargeParams{IdempotencyKey: ptr("retry-after-timeout")}
	for i, r := range replicas {
		res, err := r.api.ChargeWithResponse(t.Context(), key, decideItems("rep-once", 30))
		if err != nil || res.JSON200 == nil {
			t.Fatalf("charge through replica %d: %v %s", i, err, res.Body)
		}
		if replayed := res.JSON200.Replayed != nil && *res.JSON200.Replayed; replayed != (i > 0) || res.JSON200.Items[0].Remaining != 70 {
			t.Errorf("charge through replica %d: got %s, want 70 left, replayed %v", i, res.Body, i > 0)
		}
	}
	if got := available(t, replicas[2].api, "rep-once"); got != 70 {
		t.Errorf("after a charge of 30 sent 3 times with one key: %d left, want 70", got)
	}

	// A reservation made through one replica is settled through another,
	// once.
	n := int64(20)
	rres, err := replicas[0].api.ReserveWithResponse(t.Context(), nil, client.ReserveRequest{Items: []client.DecideItem{{Limiter: "rep-once", Permits: &n}}})
	if err != nil || rres.JSON200 == nil || rres.JSON200.Reservation == nil || rres.JSON200.Items[0].Remaining != 50 {
		t.Fatalf("reserve 20 of 70: %v %s", err, rres.Body)
	}
	id := *rres.JSON200.Reservation
	settle := client.SettleRequest{Items: []client.SettleItem{{Limiter: "rep-once", Permits: 45}}}
	sres, err := replicas[1].api.SettleReservationWithResponse(t.Context(), id, nil, settle)
	if err != nil || sres.JSON200 == nil || sres.JSON200.Items[0].Remaining != 25 {
		t.Fatalf("settle at 45 through another replica: %v %s, want 25 left", err, sres.Body)
	}
	again, err := replicas[2].api.SettleReservationWithResponse(t.Context(), id, nil, settle)
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, again, http.StatusNotFound, "/v1/reservations/"+id+"/settle", "")
	if got := available(t, replicas[0].api, "rep-once"); got != 25 {
		t.Errorf("after settling twice: %d left, want 25", got)
	}
}
