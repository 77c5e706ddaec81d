package httpapi

import (
	"maps"
	"math"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/ratelimitheader"
)

// decisionOf is the generated model of a decision, the reference for the
// hand-written answers.
func decisionOf(d limiter.Decision) gen.Decision {
	out := gen.Decision{
		Allowed:         d.Allowed,
		Permits:         d.Permits,
		Remaining:       d.Remaining,
		Limit:           d.Limit,
		ResetAfterMs:    millis(d.ResetAfter),
		ExceedsCapacity: d.ExceedsCapacity,
	}
	if !d.Allowed && !d.ExceedsCapacity && d.RetryAfter > 0 {
		retry := millis(d.RetryAfter)
		out.RetryAfterMs = &retry
	}
	if d.Degraded {
		degraded := true
		out.Degraded = &degraded
	}
	return out
}

// same checks that two recorders saw the same answer.
func same(t *testing.T, what string, got, want *httptest.ResponseRecorder) {
	t.Helper()
	if got.Code != want.Code {
		t.Errorf("%s: status %d, want %d", what, got.Code, want.Code)
	}
	if !maps.EqualFunc(got.Header(), want.Header(), slices.Equal) {
		t.Errorf("%s: headers %v, want %v", what, got.Header(), want.Header())
	}
	if got.Body.String() != want.Body.String() {
		t.Errorf("%s: body %s, want %s", what, got.Body, want.Body)
	}
}

func TestHandWrittenAnswersMatchGenerated(t *testing.T) {
	decisions := []limiter.Decision{
		{Allowed: true, Permits: 5, Remaining: 4, Limit: 9, ResetAfter: 33333333334},
		{Permits: 5, Remaining: 4, Limit: 9, ResetAfter: 33333333334, RetryAfter: 6666666667},
		{Permits: 10, Remaining: 9, Limit: 9, ExceedsCapacity: true},
		{Permits: 1, Remaining: 0, Limit: 1, ResetAfter: time.Nanosecond, RetryAfter: time.Nanosecond},
		{Allowed: true, Permits: limiter.MaxLimit, Limit: limiter.MaxLimit, ResetAfter: math.MaxInt64},
	}
	tenants := []string{"203.0.113.7", "2001:db8:1:2::/64", `<odd "tenant">`, "é"}
	for i, d := range decisions {
		policy, rateLimit := ratelimitheader.Policy("l", time.Minute, d.Limit), ratelimitheader.Value("l", d.Remaining, d.ResetAfter)
		h := gen.Acquire200ResponseHeaders{RateLimitPolicy: policy, RateLimit: rateLimit}
		body := decisionOf(d)
		if body.RetryAfterMs != nil {
			h.RetryAfter = retryAfter(d.RetryAfter)
		}
		want, got := httptest.NewRecorder(), httptest.NewRecorder()
		if err := (gen.Acquire200JSONResponse{Body: body, Headers: h}).VisitAcquireResponse(want); err != nil {
			t.Fatal(err)
		}
		if err := (&decisionAnswer{d: d, policy: policy, rateLimit: rateLimit}).VisitAcquireResponse(got); err != nil {
			t.Fatal(err)
		}
		same(t, "acquire", got, want)

		tenant := tenants[i%len(tenants)]
		th := gen.AcquireTenant200ResponseHeaders{RateLimitPolicy: policy, RateLimit: rateLimit, RetryAfter: h.RetryAfter}
		tb := gen.TenantDecision{
			Tenant: tenant, Allowed: body.Allowed, Permits: body.Permits, Remaining: body.Remaining, Limit: body.Limit,
			ResetAfterMs: body.ResetAfterMs, RetryAfterMs: body.RetryAfterMs, ExceedsCapacity: body.ExceedsCapacity,
		}
		want, got = httptest.NewRecorder(), httptest.NewRecorder()
		if err := (gen.AcquireTenant200JSONResponse{Body: tb, Headers: th}).VisitAcquireTenantResponse(want); err != nil {
			t.Fatal(err)
		}
		if err := (&decisionAnswer{tenant: tenant, isTenant: true, d: d, policy: policy, rateLimit: rateLimit}).VisitAcquireTenantResponse(got); err != nil {
			t.Fatal(err)
		}
		same(t, "acquireTenant", got, want)

		a := limiter.Availability{Remaining: d.Remaining, Limit: d.Limit, ResetAfter: d.ResetAfter}
		want, got = httptest.NewRecorder(), httptest.NewRecorder()
		err := (gen.GetAvailable200JSONResponse{
			Body:    gen.Availability{Remaining: a.Remaining, Limit: a.Limit, ResetAfterMs: millis(a.ResetAfter)},
			Headers: gen.GetAvailable200ResponseHeaders{RateLimitPolicy: policy, RateLimit: rateLimit},
		}).VisitGetAvailableResponse(want)
		if err != nil {
			t.Fatal(err)
		}
		if err := (&availabilityAnswer{a: a, policy: policy, rateLimit: rateLimit}).VisitGetAvailableResponse(got); err != nil {
			t.Fatal(err)
		}
		same(t, "getAvailable", got, want)

		want, got = httptest.NewRecorder(), httptest.NewRecorder()
		err = (gen.GetTenantAvailable200JSONResponse{
			Body:    gen.TenantAvailability{Tenant: tenant, Remaining: a.Remaining, Limit: a.Limit, ResetAfterMs: millis(a.ResetAfter)},
			Headers: gen.GetTenantAvailable200ResponseHeaders{RateLimitPolicy: policy, RateLimit: rateLimit},
		}).VisitGetTenantAvailableResponse(want)
		if err != nil {
			t.Fatal(err)
		}
		if err := (&availabilityAnswer{tenant: tenant, isTenant: true, a: a, policy: policy, rateLimit: rateLimit}).VisitGetTenantAvailableResponse(got); err != nil {
			t.Fatal(err)
		}
		same(t, "getTenantAvailable", got, want)

		// A keyed limiter's answers carry the key, and keys_full when set.
		key, full := tenants[(i+1)%len(tenants)], i%2 == 0
		kb := body
		kb.Key = &key
		if full {
			kb.KeysFull = &full
		}
		want, got = httptest.NewRecorder(), httptest.NewRecorder()
		if err := (gen.Acquire200JSONResponse{Body: kb, Headers: h}).VisitAcquireResponse(want); err != nil {
			t.Fatal(err)
		}
		if err := (&decisionAnswer{d: d, key: key, isKeyed: true, keysFull: full, policy: policy, rateLimit: rateLimit}).VisitAcquireResponse(got); err != nil {
			t.Fatal(err)
		}
		same(t, "acquire with a key", got, want)

		ka := gen.Availability{Key: &key, Remaining: a.Remaining, Limit: a.Limit, ResetAfterMs: millis(a.ResetAfter)}
		if full {
			ka.KeysFull = &full
		}
		want, got = httptest.NewRecorder(), httptest.NewRecorder()
		err = (gen.GetAvailable200JSONResponse{
			Body:    ka,
			Headers: gen.GetAvailable200ResponseHeaders{RateLimitPolicy: policy, RateLimit: rateLimit},
		}).VisitGetAvailableResponse(want)
		if err != nil {
			t.Fatal(err)
		}
		if err := (&availabilityAnswer{a: a, key: key, isKeyed: true, keysFull: full, policy: policy, rateLimit: rateLimit}).VisitGetAvailableResponse(got); err != nil {
			t.Fatal(err)
		}
		same(t, "getAvailable with a key", got, want)
	}
}
