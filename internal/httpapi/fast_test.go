package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/ratelimitheader"
)

// TestFastValidationAgreesWithSpec sends the same requests to the hot
// operations of two servers, one validating them by hand (as in
// production) and one with kin-openapi against the spec, and checks that
// both answer alike. It is what keeps validateFast faithful to the spec.
func TestFastValidationAgreesWithSpec(t *testing.T) {
	fast := newEnvWith(t, settings{}, nil)
	spec := newEnvWith(t, settings{kinEverywhere: true}, nil)
	for _, e := range []*env{fast, spec} {
		e.put("seed", client.LimiterSpec{Limit: 1_000_000_000, Period: "1h"})
	}

	type request struct {
		method, path, body string
		header             []string
	}
	var reqs []request
	for _, tc := range badInputs {
		if tc.method == "" || tc.method == http.MethodPost || strings.Contains(tc.path, "/available") {
			if tc.contentType != "" || tc.status == http.StatusRequestEntityTooLarge {
				continue // checked before either validation
			}
			method, path := tc.method, tc.path
			if method == "" {
				method = http.MethodPost
			}
			if path == "" {
				path = "/v1/limiters/seed/acquire"
			}
			reqs = append(reqs, request{method: method, path: path, body: tc.body})
		}
	}
	// Valid bodies, and bodies at the edges.
	for _, permits := range []string{
		"1", "2", "1000000000", "1000000001", "0", "-0", "-1", "1.0", "1e0", "1E3", "10e-1", "0.5",
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "123456789012345678901234567890",
		"true", "false", "null", `"1"`, `""`, "[]", "[1]", "{}", `{"n":1}`,
	} {
		reqs = append(reqs, request{method: http.MethodPost, path: "/v1/limiters/seed/acquire", body: `{"permits":` + permits + `}`})
	}
	for _, body := range []string{
		`{}`, ` { } `, "{\n\t\"permits\" :\r 7 }", `{"perm\u0069ts":2}`, `{"permits\u0000":2}`, `{"":1}`,
		`{"permits":1,"":1}`, `{"x":{"permits":1}}`, `{"x":[1,"}"],"permits":1}`, `{"permits":2,"Permits":2}`,
		`"permits"`, `true`, `[]`, `0`,
		`{"key":"user-1"}`, `{"key":"user-1","permits":2}`, `{"key":""}`, `{"key":1}`, `{"key":null}`, `{"key":"a\u0007"}`,
		`{"key":"\u00e9"}`, `{"key":"` + strings.Repeat("k", 128) + `"}`, `{"key":"` + strings.Repeat("k", 129) + `"}`,
		`{"key":"` + strings.Repeat("é", 100) + `"}`, `{"key":"a","key":"a"}`,
	} {
		reqs = append(reqs, request{method: http.MethodPost, path: "/v1/limiters/seed/acquire", body: body})
	}
	// Batches, valid or not.
	for _, body := range []string{
		`{"acquisitions":[{"limiter":"seed"}]}`,
		`{"acquisitions":[{"limiter":"seed","permits":2},{"permits":3,"limiter":"seed"}]}`,
		` { "acquisitions" : [ { "limiter" : "seed" } , {"limiter":"s\u0065ed"} ] } `,
		`{"acquisitions":[{"limiter":"missing"}]}`,
		`{"acquisitions":[{"limiter":"seed","key":"user-1"}]}`, `{"acquisitions":[{"limiter":"seed","key":""}]}`,
		`{"acquisitions":[{"limiter":"seed","key":null}]}`, `{"acquisitions":[{"limiter":"seed","key":7}]}`,
		`{"acquisitions":[{"limiter":"seed","key":"a\u0007"}]}`, `{"acquisitions":[{"limiter":"seed","key":"a","key":"a"}]}`,
		`{"acquisitions":[{"limiter":"seed","key":"` + strings.Repeat("é", 129) + `"}]}`,
		`{"acquisitions":[{"limiter":"` + strings.Repeat("z", 128) + `"}]}`,
		`{"acquisitions":[{"limiter":"se\u00e9d"}]}`, `{"acquisitions":[{"limiter":""}]}`, `{"acquisitions":[{"limiter":5}]}`,
		`{"acquisitions":[{"limiter":["seed"]}]}`, `{"acquisitions":[{"limiter":"seed","permits":"1"}]}`,
		`{"acquisitions":[{"limiter":"seed","permits":1e0}]}`, `{"acquisitions":[{"limiter":"seed","permits":-0}]}`,
		`{"acquisitions":[{"limiter":"seed","permits":1000000000}]}`, `{"acquisitions":[{"limiter":"seed","permits":9223372036854775808}]}`,
		`{"acquisitions":[{"limiter":"seed","Limiter":"seed"}]}`, `{"acquisitions":[{}]}`, `{"acquisitions":[[]]}`,
		`{"acquisitions":[1]}`, `{"acquisitions":["seed"]}`, `{"acquisitions":[true]}`, `{"acquisitions":"seed"}`,
		`{"acquisitions":1}`, `{"acquisitions":[{"limiter":"seed"}],"acquisitions":[{"limiter":"seed"}]}`,
		`{"Acquisitions":[{"limiter":"seed"}]}`, `{"acquisitions":[{"limiter":"seed"},{"limiter":"seed","x":{"y":[1,"]"]}}]}`,
		`{"acquisitions":[` + strings.Repeat(`{"limiter":"seed"},`, 999) + `{"limiter":"seed"}]}`,
		`{"acquisitions":[` + strings.Repeat(`{"limiter":"seed"},`, 999) + `{"limiter":"-"}]}`,
		`[]`, `"x"`, `null`,
	} {
		reqs = append(reqs, request{method: http.MethodPost, path: "/v1/acquire", body: body})
		// The same lists as the items of a decision, which are bounded
		// at 32.
		if strings.Count(body, "seed") < 40 {
			for _, path := range []string{"/v1/decide", "/v1/peek", "/v1/charge", "/v1/refund"} {
				reqs = append(reqs, request{method: http.MethodPost, path: path, body: strings.ReplaceAll(strings.ReplaceAll(body, "acquisitions", "items"), "Acquisitions", "Items")})
			}
		}
	}
	for _, body := range []string{
		`{"items":[` + strings.Repeat(`{"limiter":"seed"},`, 31) + `{"limiter":"seed"}]}`,
		`{"items":[` + strings.Repeat(`{"limiter":"seed"},`, 32) + `{"limiter":"seed"}]}`,
		`{"items":[]}`, `{"items":null}`, `{"items":[{"limiter":"seed"}],"acquisitions":[]}`, `{}`,
	} {
		reqs = append(reqs, request{method: http.MethodPost, path: "/v1/decide", body: body})
	}
	// Idempotency keys, valid or not, where they are declared and where
	// they are not (peek ignores the header).
	for i, key := range []string{
		"a", "6f1c2a7e-0b1d-4c1e-9a55-0f3c2d8b9e41", "a.b_c:d-e", strings.Repeat("k", 128), strings.Repeat("k", 129),
		"", " ", "a b", "é", strings.Repeat("é", 100), "a/b", "a%41", "{a}",
	} {
		body := fmt.Sprintf(`{"items":[{"limiter":"seed","permits":%d}]}`, i+1)
		for _, path := range []string{"/v1/decide", "/v1/peek", "/v1/charge", "/v1/refund"} {
			reqs = append(reqs, request{method: http.MethodPost, path: path, body: body, header: []string{"Idempotency-Key", key}})
		}
		// The same key again with another body.
		reqs = append(reqs, request{method: http.MethodPost, path: "/v1/decide", body: `{"items":[{"limiter":"seed"}]}`, header: []string{"Idempotency-Key", key}})
	}
	// Names and addresses, valid or not, random or at the edges.
	names := []string{"seed", "a", "0", "a.b_c-d", strings.Repeat("z", 128), strings.Repeat("z", 129), "se%41d", "%73eed", "s%2Fd", "-", "a..", "A-"}
	ips := []string{"203.0.113.7", "::", "::1", "1", "fe80::1", "2001:DB8::1", "1.2.3", "ffff", strings.Repeat("1", 45), "1.2.3.4%2F8", "g::1"}
	rnd := rand.New(rand.NewPCG(1, 2))
	const alphabet = "aZ09._-~:é/ %"
	for range 200 {
		var b strings.Builder
		for range rnd.IntN(12) {
			b.WriteRune([]rune(alphabet)[rnd.IntN(len([]rune(alphabet)))])
		}
		s := url.PathEscape(b.String())
		if s == "" {
			continue
		}
		names = append(names, s)
		ips = append(ips, s)
	}
	for _, n := range names {
		reqs = append(reqs, request{method: http.MethodPost, path: "/v1/limiters/" + n + "/acquire"}, request{method: http.MethodGet, path: "/v1/limiters/" + n + "/available"})
		reqs = append(reqs, request{method: http.MethodPost, path: "/v1/decide", body: `{"items":[{"limiter":"` + n + `"}]}`})
	}
	for _, ip := range ips {
		reqs = append(reqs, request{method: http.MethodPost, path: "/v1/tenants/" + ip + "/acquire", body: `{"permits":1}`}, request{method: http.MethodGet, path: "/v1/tenants/" + ip + "/available"})
	}

	for _, r := range reqs {
		ct := ""
		if r.body != "" {
			ct = "application/json"
		}
		fres, fbody := fast.raw(r.method, r.path, ct, r.body, r.header...)
		sres, sbody := spec.raw(r.method, r.path, ct, r.body, r.header...)
		if fres.StatusCode != sres.StatusCode {
			t.Errorf("%s %s %s %q: fast validation answered %d %s, the spec %d %s", r.method, r.path, r.body, r.header, fres.StatusCode, fbody, sres.StatusCode, sbody)
			continue
		}
		if fres.StatusCode != http.StatusBadRequest {
			continue
		}
		var fp, sp client.Problem
		if json.Unmarshal(fbody, &fp) != nil || json.Unmarshal(sbody, &sp) != nil || fp.Errors == nil || sp.Errors == nil {
			t.Errorf("%s %s %s: problems without field errors: %s / %s", r.method, r.path, r.body, fbody, sbody)
			continue
		}
		// The fast validation stops at the first error; the spec's finds all.
		// Where kin-openapi lets a number like 1e0 through, encoding/json
		// refuses it and names the field without array indices.
		first := (*fp.Errors)[0]
		if !slices.Contains(fieldLocations(sp), first.Location) && !slices.Contains(fieldLocations(sp), withoutIndices(first.Location)) {
			t.Errorf("%s %s %s %q: fast validation blames %s, the spec %v", r.method, r.path, r.body, r.header, first.Location, fieldLocations(sp))
		}
	}
	if got, want := fast.available("seed"), spec.available("seed"); got != want {
		t.Errorf("available: fast validation left %d, the spec %d", got, want)
	}
}

// withoutIndices drops the array indices of a field location:
// body.acquisitions.0.permits is body.acquisitions.permits.
func withoutIndices(location string) string {
	parts := strings.Split(location, ".")
	parts = slices.DeleteFunc(parts, func(p string) bool { return p != "" && strings.Trim(p, "0123456789") == "" })
	return strings.Join(parts, ".")
}

// acquireModel is the obviously-correct reading of an AcquireRequest body:
// encoding/json's tokens, checked one by one. It returns the permits, 0
// when left out, the key, nil when left out, and whether the body is valid.
func acquireModel(data []byte) (permits int64, key *string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return 0, nil, false
	}
	seen := false
	for dec.More() {
		name, _ := dec.Token()
		if name == "key" && key == nil {
			v, err := dec.Token()
			k, ok := v.(string)
			if err != nil || !ok || k == "" || utf8.RuneCountInString(k) > 128 || strings.ContainsFunc(k, func(r rune) bool { return r < 0x20 || 0x7f <= r && r <= 0x9f }) {
				return 0, nil, false
			}
			key = &k
			continue
		}
		if name != "permits" || seen {
			return 0, nil, false
		}
		seen = true
		v, err := dec.Token()
		n, ok := v.(json.Number)
		if err != nil || !ok || strings.ContainsAny(string(n), ".eE") {
			return 0, nil, false
		}
		if _, err := fmt.Sscan(string(n), &permits); err != nil || permits < 1 || permits > 1_000_000_000 {
			return 0, nil, false
		}
	}
	return permits, key, true
}

func FuzzCheckAcquire(f *testing.F) {
	for _, s := range []string{`{}`, `{"permits":1}`, `{"key":"user-1","permits":2}`, `{"key":""}`, `{"key":"a\u0007"}`, `{"key":"a","key":"b"}`, `{"permits":1e3}`, `{"perm\u0069ts":2}`, `{"permits":1,"permits":1}`, `[]`, `{"a":{"b":[1,{"c":"}"}]}}`, `{"permits":-0}`, "{\"key\":\"\xff\"}", "{\"key\":\"a\xc3\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			return
		}
		permits, key, p := checkAcquire(data)
		wantPermits, wantKey, ok := acquireModel(data)
		if (p == nil) != ok {
			t.Fatalf("checkAcquire(%s): accepted %v, want %v", data, p == nil, ok)
		}
		if ok && (permits != wantPermits || (key == nil) != (wantKey == nil) || key != nil && *key != *wantKey) {
			t.Errorf("checkAcquire(%s) = %d %q, want %d %q", data, permits, deref(key), wantPermits, deref(wantKey))
		}
	})
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func TestMembers(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		obj  bool
	}{
		{in: `{}`, obj: true},
		{in: ` {"a" : 1 , "b":"x,}"} `, want: []string{"a=1", `b="x,}"`}, obj: true},
		{in: `{"a\"b":[1,{"c":"]"}],"d":{"e":{}}}`, want: []string{`a"b=[1,{"c":"]"}]`, `d={"e":{}}`}, obj: true},
		{in: `{"\u0070":null,"q":true}`, want: []string{"p=null", "q=true"}, obj: true},
		{in: `[1]`},
		{in: `"{}"`},
	} {
		var got []string
		obj := members([]byte(tc.in), func(k, v []byte) bool {
			got = append(got, string(k)+"="+string(v))
			return true
		})
		if obj != tc.obj || !slices.Equal(got, tc.want) {
			t.Errorf("members(%s): got %v %v, want %v %v", tc.in, obj, got, tc.obj, tc.want)
		}
	}
}

func TestHeaderValues(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{ratelimitheader.Policy("a", 0, 5), `"a";q=5`},
		{ratelimitheader.Policy("a", 1, 5), `"a";q=5;w=1`},
		{ratelimitheader.Policy("a", 3600e9, 5), `"a";q=5;w=3600`},
		{ratelimitheader.Policy("a", 3600e9+1, 5), `"a";q=5;w=3601`},
		{ratelimitheader.Policy(`q"\`, 1e9, 5), `"q\"\\";q=5;w=1`},
		{ratelimitheader.Value("a", 0, 0), `"a";r=0;t=0`},
		{ratelimitheader.Value("a", 3, 1), `"a";r=3;t=1`},
		{ratelimitheader.Value("a", 3, 2e9), `"a";r=3;t=2`},
		{fmt.Sprint(millis(1)), "1"},
		{fmt.Sprint(millis(1e6)), "1"},
		{fmt.Sprint(millis(1e6 + 1)), "2"},
		{fmt.Sprint(millis(1<<63 - 1)), "9223372036855"},
		{fmt.Sprint(*retryAfter(1)), "1"},
		{fmt.Sprint(*retryAfter(1e9 + 1)), "2"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}

// decideModel is the obviously-correct reading of a DecideRequest body:
// encoding/json's tokens, checked one by one. It returns the items, or
// false when the body is invalid.
func decideModel(data []byte) ([]limiter.Item, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var items []limiter.Item
	seenItems := false
	for dec.More() {
		if name, _ := dec.Token(); name != "items" || seenItems {
			return nil, false
		}
		seenItems = true
		if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
			return nil, false
		}
		for dec.More() {
			if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
				return nil, false
			}
			it := limiter.Item{Permits: 1}
			seen := map[string]bool{}
			for dec.More() {
				name, _ := dec.Token()
				field, _ := name.(string)
				if seen[field] {
					return nil, false
				}
				seen[field] = true
				v, err := dec.Token()
				if err != nil {
					return nil, false
				}
				switch field {
				case "limiter":
					s, ok := v.(string)
					if !ok || limiter.CheckName(s) != nil {
						return nil, false
					}
					it.Name = s
				case "key":
					k, ok := v.(string)
					if !ok || k == "" || utf8.RuneCountInString(k) > 128 || strings.ContainsFunc(k, func(r rune) bool { return r < 0x20 || 0x7f <= r && r <= 0x9f }) {
						return nil, false
					}
					it.Key = k
				case "permits":
					n, ok := v.(json.Number)
					if !ok || strings.ContainsAny(string(n), ".eE") {
						return nil, false
					}
					if _, err := fmt.Sscan(string(n), &it.Permits); err != nil || it.Permits < 1 || it.Permits > 1_000_000_000 {
						return nil, false
					}
				default:
					return nil, false // an unknown member, or an object or array value
				}
			}
			if _, err := dec.Token(); err != nil || !seen["limiter"] {
				return nil, false
			}
			items = append(items, it)
		}
		if _, err := dec.Token(); err != nil {
			return nil, false
		}
	}
	return items, seenItems && 1 <= len(items) && len(items) <= limiter.MaxItems
}

// FuzzCheckDecide holds checkDecide, and with it the readers of a batch's
// acquisitions, to decideModel.
func FuzzCheckDecide(f *testing.F) {
	for _, s := range []string{
		`{"items":[{"limiter":"a"}]}`, `{"items":[{"limiter":"a","key":"u","permits":2},{"permits":3,"limiter":"b"}]}`,
		`{"items":[]}`, `{"items":null}`, `{"items":[{"limiter":"a","limiter":"a"}]}`, `{"items":[{"limiter":"-"}]}`,
		`{"items":[{"limiter":"a","key":""}]}`, `{"items":[{"limiter":"a","permits":1e0}]}`, `{"items":[{"limiter":"a"}],"items":[]}`,
		`{"items":[{"limiter":"a","x":{"y":[1,"]"]}}]}`, `{"items":[{"limiter":"\u0061"}]}`, `{"Items":[{"limiter":"a"}]}`, `[]`,
		`{"items":[` + strings.Repeat(`{"limiter":"a"},`, 32) + `{"limiter":"a"}]}`,
		"{\"items\":[{\"limiter\":\"a\",\"key\":\"\xff\"}]}", "{\"items\":[{\"limiter\":\"a\",\"key\":\"\xef\xbf\xbd\"}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			return
		}
		got, p := checkDecide(data)
		want, ok := decideModel(data)
		if (p == nil) != ok {
			t.Fatalf("checkDecide(%s): accepted %v, want %v", data, p == nil, ok)
		}
		if ok && !slices.Equal(got, want) {
			t.Errorf("checkDecide(%s) = %#v, want %#v", data, got, want)
		}
	})
}
