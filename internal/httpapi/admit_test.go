package httpapi

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

// answer is a whole answer: status, Content-Type and body.
type answer struct {
	status      int
	contentType string
	body        string
}

// send sends a request as is, with the headers given in pairs, and
// returns the whole answer and the response.
func (e *env) send(method, path, body string, header ...string) (answer, *http.Response) {
	e.t.Helper()
	res, b := e.raw(method, path, "", body, header...)
	return answer{status: res.StatusCode, contentType: res.Header.Get("Content-Type"), body: string(b)}, res
}

// twoEnvs starts a server that validates the hot operations by hand, as
// in production, and one that validates them with kin-openapi, each with
// the limiters seed, k (keyed) and new-limiter absent.
func twoEnvs(t *testing.T) (fast, spec *env) {
	t.Helper()
	fast = newEnvWith(t, settings{}, nil)
	spec = newEnvWith(t, settings{kinEverywhere: true}, nil)
	for _, e := range []*env{fast, spec} {
		e.put("seed", client.LimiterSpec{Limit: 9, Period: "1m"})
		e.put("k", client.LimiterSpec{Limit: 9, Period: "1m", Keyed: ptr(true)})
	}
	return fast, spec
}

// checkUntouched checks that no request consumed permits of seed, of k
// or of the tenant of 203.0.113.7, created a key of k, or created the
// limiter new-limiter.
func checkUntouched(t *testing.T, e *env) {
	t.Helper()
	if got := e.available("seed"); got != 9 {
		t.Errorf("available of seed: got %d, want 9", got)
	}
	if got := e.tenantAvailable("203.0.113.7"); got != tenantPolicy.Limit {
		t.Errorf("available of the tenant: got %d, want %d", got, tenantPolicy.Limit)
	}
	if res, body := e.raw(http.MethodGet, "/v1/limiters/k/lowest", "", ""); res.StatusCode != http.StatusOK || string(body) != `{"items":[]}`+"\n" {
		t.Errorf("keys of k: got %d %s, want 200 {\"items\":[]}", res.StatusCode, body)
	}
	if res, _ := e.raw(http.MethodGet, "/v1/limiters/new-limiter", "", ""); res.StatusCode != http.StatusNotFound {
		t.Errorf("new-limiter: got status %d, want 404", res.StatusCode)
	}
}

// reservationID is an ID of the right form that names no reservation.
const reservationID = "l.k.0123456789abcdef0123456789abcdef"

// TestBodyTextIsUTF8: a string of a body, a member's name or its value,
// that is not UTF-8, or that escapes half of a UTF-16 surrogate pair, is
// refused with a 400 naming where it is, alike on every operation that
// takes a body, whether validated by hand or by kin-openapi, and consumes
// nothing. encoding/json would read each of them as U+FFFD, and so put
// distinct keys in one bucket.
func TestBodyTextIsUTF8(t *testing.T) {
	const (
		notUTF8   = "must be UTF-8"
		surrogate = `must not hold a lone surrogate escape (\ud800 to \udfff)`
		badName   = "has a member name that is not UTF-8"
	)
	for _, tc := range []struct {
		name, method, path, body string
		location, message        string
	}{
		{"key 0xff", "POST", "/v1/limiters/k/acquire", "{\"key\":\"\xff\"}", "body.key", notUTF8},
		{"key 0xfe", "POST", "/v1/limiters/k/acquire", "{\"key\":\"\xfe\"}", "body.key", notUTF8},
		{"key cut short", "POST", "/v1/limiters/k/acquire", "{\"key\":\"a\xc3\",\"permits\":2}", "body.key", notUTF8},
		{"key overlong", "POST", "/v1/limiters/k/acquire", "{\"permits\":2,\"key\":\"\xc0\xaf\"}", "body.key", notUTF8},
		{"key of an encoded surrogate", "POST", "/v1/limiters/k/acquire", "{\"key\":\"\xed\xa0\x80\"}", "body.key", notUTF8},
		{"key before a bad permits", "POST", "/v1/limiters/k/acquire", "{\"key\":\"\xff\",\"permits\":0}", "body.key", notUTF8},
		{"key after a bad permits", "POST", "/v1/limiters/k/acquire", "{\"permits\":null,\"key\":\"\xff\"}", "body.key", notUTF8},
		{"key of a high surrogate", "POST", "/v1/limiters/k/acquire", `{"key":"\ud800"}`, "body.key", surrogate},
		{"key of a low surrogate", "POST", "/v1/limiters/k/acquire", `{"key":"a\uDC00"}`, "body.key", surrogate},
		{"key of two high surrogates", "POST", "/v1/limiters/k/acquire", `{"key":"\ud83d\ud83d"}`, "body.key", surrogate},
		{"key of a high surrogate then a letter", "POST", "/v1/limiters/k/acquire", `{"key":"\ud83d\u0041"}`, "body.key", surrogate},
		{"key of a high surrogate at the end", "POST", "/v1/limiters/k/acquire", `{"key":"a\\\ud83d"}`, "body.key", surrogate},
		{"member name", "POST", "/v1/limiters/seed/acquire", "{\"perm\xffits\":1}", "body", badName},
		{"member name escaped", "POST", "/v1/limiters/seed/acquire", `{"perm\udfffits":1}`, "body", badName},
		{"unknown member", "POST", "/v1/limiters/seed/acquire", "{\"x\":[1,{\"y\":\"\xff\"}]}", "body.x.1.y", notUTF8},
		{"tenant unknown member", "POST", "/v1/tenants/203.0.113.7/acquire", "{\"x\":\"\xff\"}", "body.x", notUTF8},
		{"batch key", "POST", "/v1/acquire", "{\"acquisitions\":[{\"limiter\":\"k\",\"key\":\"a\"},{\"limiter\":\"k\",\"key\":\"\xff\"}]}", "body.acquisitions.1.key", notUTF8},
		{"batch limiter", "POST", "/v1/acquire", "{\"acquisitions\":[{\"limiter\":\"se\xffed\"}]}", "body.acquisitions.0.limiter", notUTF8},
		{"batch member name", "POST", "/v1/acquire", "{\"acquisitions\":[{\"limiter\":\"k\",\"k\xffey\":\"a\"}]}", "body.acquisitions.0", badName},
		{"decide key", "POST", "/v1/decide", `{"items":[{"limiter":"k","key":"\udc00"}]}`, "body.items.0.key", surrogate},
		{"peek key", "POST", "/v1/peek", "{\"items\":[{\"limiter\":\"k\",\"key\":\"\xff\"}]}", "body.items.0.key", notUTF8},
		{"charge key", "POST", "/v1/charge", "{\"items\":[{\"limiter\":\"k\",\"key\":\"\xff\"}]}", "body.items.0.key", notUTF8},
		{"refund key", "POST", "/v1/refund", "{\"items\":[{\"limiter\":\"k\",\"key\":\"\xff\"}]}", "body.items.0.key", notUTF8},
		{"reserve key", "POST", "/v1/reservations", "{\"items\":[{\"limiter\":\"k\",\"key\":\"\xff\"}]}", "body.items.0.key", notUTF8},
		{"reserve ttl", "POST", "/v1/reservations", "{\"items\":[{\"limiter\":\"seed\"}],\"ttl\":\"1\xffm\"}", "body.ttl", notUTF8},
		{"settle key", "POST", "/v1/reservations/" + reservationID + "/settle", "{\"items\":[{\"limiter\":\"k\",\"key\":\"\xff\",\"permits\":1}]}", "body.items.0.key", notUTF8},
		{"put group", "PUT", "/v1/limiters/new-limiter", "{\"limit\":5,\"period\":\"1m\",\"group\":\"g\xff\"}", "body.group", notUTF8},
		{"put period", "PUT", "/v1/limiters/new-limiter", `{"limit":5,"period":"1m\ud800"}`, "body.period", surrogate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fast, spec := twoEnvs(t)
			got, res := fast.send(tc.method, tc.path, tc.body, "Content-Type", "application/json")
			p := checkProblem(t, res, []byte(got.body), http.StatusBadRequest)
			if p.Errors == nil || len(*p.Errors) != 1 || (*p.Errors)[0].Location != tc.location || (*p.Errors)[0].Message != tc.message {
				t.Errorf("field errors: got %s, want one at %s: %s", got.body, tc.location, tc.message)
			}
			if want, _ := spec.send(tc.method, tc.path, tc.body, "Content-Type", "application/json"); got != want {
				t.Errorf("validated by hand: got %+v, validated by kin-openapi: %+v", got, want)
			}
			checkUntouched(t, fast)
			checkUntouched(t, spec)
		})
	}
}

// TestDistinctKeysKeepDistinctBuckets: keys that differ only in bytes
// that are not UTF-8 are refused, and leave the bucket of U+FFFD, which
// encoding/json would have read them as, alone; a key of U+FFFD itself,
// written or escaped, and an escaped surrogate pair are keys like others.
func TestDistinctKeysKeepDistinctBuckets(t *testing.T) {
	fast, spec := twoEnvs(t)
	for _, e := range []*env{fast, spec} {
		for _, key := range []string{"\xff", "\xfe", `\ud800`, `\udbff`} {
			if got, _ := e.send(http.MethodPost, "/v1/limiters/k/acquire", `{"key":"`+key+`"}`, "Content-Type", "application/json"); got.status != http.StatusBadRequest {
				t.Errorf("key %q: got %+v, want a 400", key, got)
			}
		}
		for _, tc := range []struct{ body, key string }{
			{"{\"key\":\"\xef\xbf\xbd\"}", "\ufffd"},
			{`{"key":"\ufffd"}`, "\ufffd"},
			{`{"key":"\ud83d\ude00"}`, "\U0001F600"},
			{`{"key":"\uD83D\uDE00","permits":2}`, "\U0001F600"},
		} {
			if got, _ := e.send(http.MethodPost, "/v1/limiters/k/acquire", tc.body, "Content-Type", "application/json"); got.status != http.StatusOK || !strings.Contains(got.body, `"key":"`+tc.key+`"`) {
				t.Errorf("%s: got %+v, want a 200 for key %q", tc.body, got, tc.key)
			}
		}
		res, err := e.c.ListLowestKeysWithResponse(ctx, "k", nil)
		if err != nil || res.JSON200 == nil {
			t.Fatalf("lowest keys: %v %s", err, res.Body)
		}
		got := map[string]int64{}
		for _, k := range res.JSON200.Items {
			got[k.Key] = k.Remaining
		}
		if len(got) != 2 || got["\ufffd"] != 7 || got["\U0001F600"] != 6 {
			t.Errorf("keys of k: got %v, want U+FFFD with 7 left and U+1F600 with 6", got)
		}
	}
}

// gzipped is s compressed with gzip.
func gzipped(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	if _, err := w.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestBodyCodingAndCharset: a body with a content coding, or labelled
// with a charset other than UTF-8, is refused with a 415 on every
// operation that takes a body, alike whether validated by hand or by
// kin-openapi, and consumes nothing; the refusal of a content coding says
// in Accept-Encoding that only identity is accepted (RFC 9110, 15.5.16).
func TestBodyCodingAndCharset(t *testing.T) {
	bodies := []struct{ method, path, body string }{
		{"POST", "/v1/limiters/seed/acquire", `{"permits":1}`},
		{"POST", "/v1/limiters/k/acquire", `{"key":"a"}`},
		{"POST", "/v1/tenants/203.0.113.7/acquire", `{"permits":1}`},
		{"POST", "/v1/acquire", `{"acquisitions":[{"limiter":"seed"},{"limiter":"k","key":"a"}]}`},
		{"POST", "/v1/decide", `{"items":[{"limiter":"seed"}]}`},
		{"POST", "/v1/peek", `{"items":[{"limiter":"seed"}]}`},
		{"POST", "/v1/charge", `{"items":[{"limiter":"seed"}]}`},
		{"POST", "/v1/refund", `{"items":[{"limiter":"seed"}]}`},
		{"POST", "/v1/reservations", `{"items":[{"limiter":"seed"}]}`},
		{"POST", "/v1/reservations/" + reservationID + "/settle", `{"items":[{"limiter":"k","key":"a","permits":1}]}`},
		{"PUT", "/v1/limiters/new-limiter", `{"limit":5,"period":"1m"}`},
	}
	for _, tc := range []struct {
		name           string
		header         []string
		gzip           bool   // send the body compressed
		acceptEncoding string // the Accept-Encoding of the answer
	}{
		{name: "gzip", header: []string{"Content-Encoding", "gzip"}, gzip: true, acceptEncoding: "identity"},
		{name: "gzip label on a plain body", header: []string{"Content-Encoding", "gzip"}, acceptEncoding: "identity"},
		{name: "br", header: []string{"Content-Encoding", "br"}, acceptEncoding: "identity"},
		{name: "identity then gzip", header: []string{"Content-Encoding", "identity, gzip"}, gzip: true, acceptEncoding: "identity"},
		{name: "unknown coding", header: []string{"Content-Encoding", "x-custom"}, acceptEncoding: "identity"},
		{name: "utf-16", header: []string{"Content-Type", "application/json; charset=utf-16"}},
		{name: "UTF-16LE", header: []string{"Content-Type", "application/json;charset=UTF-16LE"}},
		{name: "latin-1 quoted", header: []string{"Content-Type", `application/json; charset="iso-8859-1"`}},
		{name: "utf8 without the dash", header: []string{"Content-Type", "application/json; charset=utf8"}},
		{name: "malformed parameter", header: []string{"Content-Type", "application/json; charset"}},
		{name: "two charsets", header: []string{"Content-Type", "application/json; charset=utf-8; charset=utf-16"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fast, spec := twoEnvs(t)
			header := tc.header
			if header[0] != "Content-Type" {
				header = append([]string{"Content-Type", "application/json"}, header...)
			}
			for _, b := range bodies {
				body := b.body
				if tc.gzip {
					body = gzipped(t, body)
				}
				got, res := fast.send(b.method, b.path, body, header...)
				checkProblem(t, res, []byte(got.body), http.StatusUnsupportedMediaType)
				if ae := res.Header.Get("Accept-Encoding"); ae != tc.acceptEncoding {
					t.Errorf("%s %s: Accept-Encoding: got %q, want %q", b.method, b.path, ae, tc.acceptEncoding)
				}
				if want, _ := spec.send(b.method, b.path, body, header...); got != want {
					t.Errorf("%s %s: validated by hand: got %+v, validated by kin-openapi: %+v", b.method, b.path, got, want)
				}
			}
			checkUntouched(t, fast)
			checkUntouched(t, spec)
		})
	}
}

// TestBodyCodingAndCharsetAccepted: identity, an empty Content-Encoding
// and a UTF-8 charset however spelled are the body as it is.
func TestBodyCodingAndCharsetAccepted(t *testing.T) {
	fast, spec := twoEnvs(t)
	for _, header := range [][]string{
		{"Content-Type", "application/json", "Content-Encoding", "identity"},
		{"Content-Type", "application/json", "Content-Encoding", "IDENTITY"},
		{"Content-Type", "application/json", "Content-Encoding", ""},
		{"Content-Type", "application/json; charset=utf-8"},
		{"Content-Type", "Application/JSON;Charset=UTF-8"},
		{"Content-Type", `application/json ; charset="utf-8"`},
		{"Content-Type", "application/json;"},
	} {
		for _, e := range []*env{fast, spec} {
			for _, r := range []struct{ method, path, body string }{
				{"POST", "/v1/limiters/seed/acquire", `{"permits":1}`},
				{"POST", "/v1/acquire", `{"acquisitions":[{"limiter":"seed"}]}`},
				{"POST", "/v1/decide", `{"items":[{"limiter":"seed"}]}`},
				{"PUT", "/v1/limiters/other", `{"limit":5,"period":"1m"}`},
			} {
				if got, _ := e.send(r.method, r.path, r.body, header...); got.status != http.StatusOK && got.status != http.StatusCreated {
					t.Errorf("%s %s with %q: got %+v, want it served", r.method, r.path, header, got)
				}
			}
		}
	}
}
