package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The answers of the hot operations are written by hand rather than by the
// generated Visit methods, which spend a dozen allocations and reflection
// on every answer (json.Encoder, fmt.Sprint, header canonicalization).
// TestHandWrittenAnswersMatchGenerated checks that both write the same
// bytes, so the answers stay those of the spec.

var (
	_ gen.AcquireResponseObject            = (*decisionAnswer)(nil)
	_ gen.AcquireTenantResponseObject      = (*decisionAnswer)(nil)
	_ gen.GetAvailableResponseObject       = (*availabilityAnswer)(nil)
	_ gen.GetTenantAvailableResponseObject = (*availabilityAnswer)(nil)
)

// Canonical header keys, and a shared Content-Type value: net/http only
// reads header values.
const (
	hdrPolicy     = "Ratelimit-Policy" // RateLimit-Policy
	hdrRateLimit  = "Ratelimit"        // RateLimit
	hdrRetryAfter = "Retry-After"

	hdrIdempotencyKey = "Idempotency-Key"
)

var contentTypeJSON = []string{"application/json"}

// decisionAnswer is the 200 answer of acquire, and of acquireTenant when
// tenant is set.
type decisionAnswer struct {
	tenant    string
	isTenant  bool
	key       string // of a keyed limiter, when isKeyed
	isKeyed   bool
	keysFull  bool
	d         limiter.Decision
	policy    string // RateLimit-Policy
	rateLimit string // RateLimit
}

func (a *decisionAnswer) VisitAcquireResponse(w http.ResponseWriter) error       { return a.write(w) }
func (a *decisionAnswer) VisitAcquireTenantResponse(w http.ResponseWriter) error { return a.write(w) }

func (a *decisionAnswer) write(w http.ResponseWriter) error {
	d := a.d
	buf := buffers.Get().(*[]byte)
	defer buffers.Put(buf)
	b := appendDecision((*buf)[:0], d, a.isKeyed, a.key, a.keysFull)
	b = b[:len(b)-1] // writeAnswer ends the object
	retryHeader := ""
	if retries(d) {
		retryHeader = strconv.FormatInt(*retryAfter(d.RetryAfter), 10)
	}
	return writeAnswer(w, buf, b, a.isTenant, a.tenant, a.rateLimit, a.policy, retryHeader)
}

// appendDecision appends the Decision object of d, as the generated code
// writes it, with the key of a keyed limiter when keyed.
func appendDecision(b []byte, d limiter.Decision, keyed bool, key string, keysFull bool) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	if d.Degraded {
		b = append(b, `,"degraded":true`...)
	}
	b = append(b, `,"exceeds_capacity":`...)
	b = strconv.AppendBool(b, d.ExceedsCapacity)
	b = appendKey(b, keyed, key, keysFull)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, d.Limit, 10)
	b = append(b, `,"permits":`...)
	b = strconv.AppendInt(b, d.Permits, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, millis(d.ResetAfter), 10)
	if retries(d) {
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, millis(d.RetryAfter), 10)
	}
	return append(b, '}')
}

// appendKey appends, when keyed, the key and keys_full members that follow
// "exceeds_capacity" in a Decision and lead an Availability, in the
// generated code's order, each after a comma.
func appendKey(b []byte, keyed bool, key string, keysFull bool) []byte {
	if !keyed {
		return b
	}
	if b[len(b)-1] != '{' {
		b = append(b, ',')
	}
	b = append(b, `"key":`...)
	b = appendJSONString(b, key)
	if keysFull {
		b = append(b, `,"keys_full":true`...)
	}
	return b
}

// retries reports whether d is a denial that waiting can turn into a grant.
func retries(d limiter.Decision) bool {
	return !d.Allowed && !d.ExceedsCapacity && d.RetryAfter > 0
}

// availabilityAnswer is the 200 answer of getAvailable, and of
// getTenantAvailable when tenant is set.
type availabilityAnswer struct {
	tenant    string
	isTenant  bool
	key       string // of a keyed limiter, when isKeyed
	isKeyed   bool
	keysFull  bool
	a         limiter.Availability
	policy    string
	rateLimit string
}

func (a *availabilityAnswer) VisitGetAvailableResponse(w http.ResponseWriter) error {
	return a.write(w)
}

func (a *availabilityAnswer) VisitGetTenantAvailableResponse(w http.ResponseWriter) error {
	return a.write(w)
}

func (a *availabilityAnswer) write(w http.ResponseWriter) error {
	buf := buffers.Get().(*[]byte)
	defer buffers.Put(buf)
	b := appendKey(append((*buf)[:0], '{'), a.isKeyed, a.key, a.keysFull)
	if a.isKeyed {
		b = append(b, ',')
	}
	b = append(b, `"limit":`...)
	b = strconv.AppendInt(b, a.a.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, a.a.Remaining, 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, millis(a.a.ResetAfter), 10)
	return writeAnswer(w, buf, b, a.isTenant, a.tenant, a.rateLimit, a.policy, "")
}

// writeAnswer ends the JSON object begun in b (adding the tenant when
// isTenant), keeps the grown buffer in *buf for the pool, and writes a 200
// with the rate-limit headers when rateLimit is set (a degraded decision
// has none), plus Retry-After when retryAfter is set.
func writeAnswer(w http.ResponseWriter, buf *[]byte, b []byte, isTenant bool, tenant, rateLimit, policy, retryAfter string) error {
	if isTenant {
		b = append(b, `,"tenant":`...)
		b = appendJSONString(b, tenant)
	}
	b = append(b, "}\n"...)
	*buf = b

	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	// One backing array for all the header values: one allocation.
	vals := [3]string{rateLimit, policy, retryAfter}
	all := vals[:]
	if rateLimit != "" {
		h[hdrRateLimit] = all[0:1:1]
		h[hdrPolicy] = all[1:2:2]
	}
	if retryAfter != "" {
		h[hdrRetryAfter] = all[2:3:3]
	}
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(b)
	return err
}

var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// appendJSONString appends s as encoding/json writes it.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= utf8.RuneSelf {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
