package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

// answer is what every response type of the generated client has.
type answer interface {
	StatusCode() int
	ContentType() string
	GetBody() []byte
}

// leaks are fragments of Go error text, stack traces and library names that
// a problem must never show a client.
var leaks = []string{
	"json: ", "cannot unmarshal", "Go struct field", "Go value of type", "strconv.",
	"runtime error", "goroutine ", "panic", ".go:", "interface {}", "map[string]",
	"*errors.", "openapi3", "kin-openapi", "oapi-codegen", "<nil>", "%!",
}

// checkProblem asserts that res is an RFC 9457 problem of status
// wantStatus about the request path instance, leaking nothing, and returns
// it. A 400 lists the invalid parts of the request; when wantLocation is not
// empty, one of them is there.
func checkProblem(t *testing.T, res answer, wantStatus int, instance, wantLocation string) client.Problem {
	t.Helper()
	if got := res.StatusCode(); got != wantStatus {
		t.Fatalf("status: got %d, want %d (body %s)", got, wantStatus, res.GetBody())
	}
	mediaType, _, err := mime.ParseMediaType(res.ContentType())
	if err != nil || mediaType != "application/problem+json" {
		t.Errorf("Content-Type: got %q, want application/problem+json", res.ContentType())
	}
	body := res.GetBody()
	for _, leak := range leaks {
		if bytes.Contains(body, []byte(leak)) {
			t.Errorf("problem leaks %q: %s", leak, body)
		}
	}
	var p client.Problem
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("problem body %s: %v", body, err)
	}
	if p.Type == "" {
		t.Errorf("problem type: got empty, want a URI reference such as about:blank")
	}
	if want := http.StatusText(wantStatus); p.Title != want {
		t.Errorf("problem title: got %q, want %q", p.Title, want)
	}
	if p.Status != int32(wantStatus) {
		t.Errorf("problem status: got %d, want %d", p.Status, wantStatus)
	}
	if p.Detail == nil || strings.TrimSpace(*p.Detail) == "" {
		t.Errorf("problem detail: got none, want a sentence for people")
	}
	if p.Instance == nil || *p.Instance != instance {
		t.Errorf("problem instance: got %s, want %q", strPtr(p.Instance), instance)
	}
	switch {
	case wantStatus != http.StatusBadRequest:
		if p.Errors != nil {
			t.Errorf("problem errors: got %+v, want none on a %d", *p.Errors, wantStatus)
		}
	case p.Errors == nil || len(*p.Errors) == 0:
		t.Errorf("problem errors: got none, want one per invalid part of the request")
	default:
		found := false
		for _, e := range *p.Errors {
			if e.Location == "" || e.Message == "" {
				t.Errorf("problem error %+v: want both a location and a message", e)
			}
			found = found || e.Location == wantLocation
		}
		if wantLocation != "" && !found {
			t.Errorf("problem errors: got %+v, want one at %q", *p.Errors, wantLocation)
		}
	}
	return p
}

// strPtr formats an optional string for a failure message.
func strPtr(s *string) string {
	if s == nil {
		return "none"
	}
	return strconv.Quote(*s)
}

// sfItem is a Structured Field item: a string with integer parameters, as
// the RateLimit and RateLimit-Policy headers carry.
type sfItem struct {
	name   string
	params map[string]int64
}

// parseSFItem parses `"<name>";key=<integer>;...`, failing t on anything
// else.
func parseSFItem(t *testing.T, header, value string) sfItem {
	t.Helper()
	item, err := parseSFItemErr(value)
	if err != nil {
		t.Fatalf("%s: %q: %v", header, value, err)
	}
	return item
}

func parseSFItemErr(v string) (sfItem, error) {
	if !strings.HasPrefix(v, `"`) {
		return sfItem{}, fmt.Errorf("does not start with a string")
	}
	var name strings.Builder
	i := 1
	for ; i < len(v) && v[i] != '"'; i++ {
		if v[i] == '\\' {
			i++
			if i == len(v) {
				break
			}
		}
		name.WriteByte(v[i])
	}
	if i >= len(v) {
		return sfItem{}, fmt.Errorf("unterminated string")
	}
	item := sfItem{name: name.String(), params: map[string]int64{}}
	rest := v[i+1:]
	if rest == "" {
		return item, nil
	}
	if rest[0] != ';' {
		return sfItem{}, fmt.Errorf("want ; after the string, got %q", rest)
	}
	for _, param := range strings.Split(rest[1:], ";") {
		key, val, ok := strings.Cut(param, "=")
		if !ok || key == "" {
			return sfItem{}, fmt.Errorf("parameter %q: want key=value", param)
		}
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n < 0 {
			return sfItem{}, fmt.Errorf("parameter %s=%q: want a non-negative integer", key, val)
		}
		if _, dup := item.params[key]; dup {
			return sfItem{}, fmt.Errorf("parameter %s twice", key)
		}
		item.params[key] = n
	}
	return item, nil
}

// ceilDiv is a / b rounded up, for non-negative a and positive b.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// limitState is what an answer says about a limit, to check its headers by.
type limitState struct {
	name      string // the limiter's name, or "tenant"
	limit     int64
	periodSec int64 // the period in whole seconds, rounded up, at least 1
	remaining int64
	resetMs   int64
	retryMs   *int64 // the decision's retry_after_ms, or nil
}

// checkRateLimitHeaders asserts that RateLimit-Policy, RateLimit and
// Retry-After agree with the answer's body, as the API describes them.
func checkRateLimitHeaders(t *testing.T, policy, rateLimit string, retryAfter *int64, want limitState) {
	t.Helper()
	p := parseSFItem(t, "RateLimit-Policy", policy)
	if p.name != want.name || len(p.params) != 2 || p.params["q"] != want.limit || p.params["w"] != want.periodSec {
		t.Errorf("RateLimit-Policy: got %q, want %q", policy,
			fmt.Sprintf("%q;q=%d;w=%d", want.name, want.limit, want.periodSec))
	}
	r := parseSFItem(t, "RateLimit", rateLimit)
	wantT := ceilDiv(want.resetMs, 1000)
	if r.name != want.name || len(r.params) != 2 || r.params["r"] != want.remaining || r.params["t"] != wantT {
		t.Errorf("RateLimit: got %q, want %q (remaining %d, reset after %d ms)", rateLimit,
			fmt.Sprintf("%q;r=%d;t=%d", want.name, want.remaining, wantT), want.remaining, want.resetMs)
	}
	switch {
	case want.retryMs == nil && retryAfter != nil:
		t.Errorf("Retry-After: got %d, want none without retry_after_ms", *retryAfter)
	case want.retryMs != nil && retryAfter == nil:
		t.Errorf("Retry-After: got none, want %d s for retry_after_ms %d", ceilDiv(*want.retryMs, 1000), *want.retryMs)
	case want.retryMs != nil && *retryAfter != max(1, ceilDiv(*want.retryMs, 1000)):
		t.Errorf("Retry-After: got %d, want %d s for retry_after_ms %d", *retryAfter, max(1, ceilDiv(*want.retryMs, 1000)), *want.retryMs)
	}
}

// ptr returns a pointer to v.
func ptr[T any](v T) *T { return &v }

// TestParseSFItem checks the suite's own parser of rate-limit headers; it
// needs no container.
func TestParseSFItem(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		value   string
		want    sfItem
		wantErr bool
	}{
		{"policy", `"checkout-api";q=100;w=60`, sfItem{"checkout-api", map[string]int64{"q": 100, "w": 60}}, false},
		{"no parameters", `"tenant"`, sfItem{"tenant", map[string]int64{}}, false},
		{"escaped quote", `"a\"b";r=0`, sfItem{`a"b`, map[string]int64{"r": 0}}, false},
		{"not a string", `tenant;q=1`, sfItem{}, true},
		{"unterminated string", `"tenant;q=1`, sfItem{}, true},
		{"junk after the string", `"tenant" q=1`, sfItem{}, true},
		{"parameter without value", `"tenant";q`, sfItem{}, true},
		{"empty parameter", `"tenant";q=1;`, sfItem{}, true},
		{"negative value", `"tenant";r=-1`, sfItem{}, true},
		{"fractional value", `"tenant";w=1.5`, sfItem{}, true},
		{"parameter twice", `"tenant";q=1;q=2`, sfItem{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSFItemErr(tt.value)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parse %q: got error %v, want error %v", tt.value, err, tt.wantErr)
			}
			if !tt.wantErr && (got.name != tt.want.name || !maps.Equal(got.params, tt.want.params)) {
				t.Errorf("parse %q: got %+v, want %+v", tt.value, got, tt.want)
			}
		})
	}
}
