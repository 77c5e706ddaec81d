package httpapi

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

// refCheck is the reference model of checkMembers (strict set) and
// checkDepth: a plain recursion over each value, reading it again at every
// level and comparing each name with every name before it. It is quadratic,
// so it only ever sees small bodies.
func refCheck(data []byte, strict bool) *problem {
	return refValue(data, "body", 1, strict)
}

// refValue checks the valid JSON value data, found at where, depth levels
// deep if it is an array or an object.
func refValue(data []byte, where string, depth int, strict bool) *problem {
	var p *problem
	switch data[skipSpace(data, 0)] {
	case '{':
		if depth > maxDepth {
			return invalid(where, fmt.Sprintf("nests arrays and objects deeper than %d levels", maxDepth))
		}
		var keys []string
		members(data, func(key, value []byte) bool {
			name := string(key)
			switch {
			case strict && len(keys) == maxMembers:
				p = invalid(where, fmt.Sprintf("has more than %d members", maxMembers))
			case strict && slices.Contains(keys, name):
				p = invalid(where+"."+name, "appears more than once")
			case strict && value[0] == 'n':
				p = invalid(where+"."+name, "must not be null")
			default:
				p = refValue(value, where+"."+name, depth+1, strict)
			}
			keys = append(keys, name)
			return p == nil
		})
	case '[':
		if depth > maxDepth {
			return invalid(where, fmt.Sprintf("nests arrays and objects deeper than %d levels", maxDepth))
		}
		i := 0
		elements(data, func(value []byte) bool {
			at := where + "." + strconv.Itoa(i)
			if strict && value[0] == 'n' {
				p = invalid(at, "must not be null")
			} else {
				p = refValue(value, at, depth+1, strict)
			}
			i++
			return p == nil
		})
	}
	return p
}

// agree fails t unless checkMembers and checkDepth answer data as the
// reference model does.
func agree(t *testing.T, data []byte) {
	t.Helper()
	for _, c := range []struct {
		name    string
		check   func([]byte) *problem
		members bool
	}{
		{"checkMembers", checkMembers, true},
		{"checkDepth", checkDepth, false},
	} {
		if got, want := c.check(data), refCheck(data, c.members); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s(%.200s): got %v, want %v", c.name, data, got, want)
		}
	}
}

// nested is a body of n arrays, one in the other, around inner.
func nested(n int, inner string) string {
	return strings.Repeat("[", n) + inner + strings.Repeat("]", n)
}

// zeros is the location suffix of n first elements: ".0" n times.
func zeros(n int) string { return strings.Repeat(".0", n) }

func TestCheckMembers(t *testing.T) {
	deep := "nests arrays and objects deeper than 32 levels"
	wide := func(n int, last string) string {
		var b strings.Builder
		b.WriteString(`{`)
		for i := range n {
			fmt.Fprintf(&b, `"k%d":%d,`, i, i)
		}
		return b.String() + last + `}`
	}
	for _, tc := range []struct {
		name, body        string
		location, message string // "" when the body passes
	}{
		{name: "empty object", body: `{}`},
		{name: "scalars", body: `{"a":1,"b":"x","c":true,"d":false,"e":[1,"n",{}]}`},
		{name: "top-level null", body: `null`},
		{name: "top-level string", body: `"{["`},
		{name: "duplicate", body: `{"a":1,"a":2}`, location: "body.a", message: "appears more than once"},
		{name: "escaped duplicate", body: `{"a":1,"\u0061":2}`, location: "body.a", message: "appears more than once"},
		{name: "same name in two objects", body: `{"a":{"a":1},"b":{"a":1}}`},
		{name: "same name at two levels", body: `{"a":{"b":{"a":1}}}`},
		{name: "nested duplicate", body: `{"a":[{"b":1},{"b":1,"c":{"d":0,"d":0}}]}`, location: "body.a.1.c.d", message: "appears more than once"},
		{name: "duplicate after a nested object", body: `{"a":{"x":1,"y":2},"b":1,"a":3}`, location: "body.a", message: "appears more than once"},
		{name: "null member", body: `{"a":null}`, location: "body.a", message: "must not be null"},
		{name: "null element", body: `{"a":[1,2,null]}`, location: "body.a.2", message: "must not be null"},
		{name: "duplicate before null", body: `{"a":1,"a":null}`, location: "body.a", message: "appears more than once"},
		{name: "null before duplicate", body: `{"a":null,"a":1}`, location: "body.a", message: "must not be null"},
		{name: "strings that look like structure", body: `{"a":"{[\"null\\",\"b\":[null]}","b":"]}"}`},
		{name: "32 levels", body: nested(32, "1")},
		{name: "33 levels", body: nested(33, "1"), location: "body" + zeros(32), message: deep},
		{name: "9,999 levels", body: nested(9_999, ""), location: "body" + zeros(32), message: deep},
		{name: "33 levels of objects", body: strings.Repeat(`{"a":`, 33) + "1" + strings.Repeat("}", 33), location: "body" + strings.Repeat(".a", 32), message: deep},
		{name: "deep after shallow", body: `{"a":[1,2],"b":[0,` + nested(31, "") + `]}`, location: "body.b.1" + zeros(30), message: deep},
		{name: "problem before the depth", body: `{"a":null,"b":` + nested(40, "") + `}`, location: "body.a", message: "must not be null"},
		{name: "64 members", body: wide(63, `"z":0`)},
		{name: "65 members", body: wide(64, `"z":0`), location: "body", message: "has more than 64 members"},
		{name: "10,000 members", body: `[` + wide(10_000, `"z":0`) + `]`, location: "body.0", message: "has more than 64 members"},
		{name: "wide with a late duplicate", body: wide(63, `"k0":0`), location: "body.k0", message: "appears more than once"},
		{name: "duplicate as the 65th member", body: wide(64, `"k0":0`), location: "body", message: "has more than 64 members"},
		{name: "small then wide", body: wide(smallObject, `"k3":0`), location: "body.k3", message: "appears more than once"},
		{name: "wide object in a wide object", body: `{"a":` + wide(60, `"k59":0`) + `}`, location: "body.a.k59", message: "appears more than once"},
		{name: "names of a closed object forgotten", body: `{"a":` + wide(60, `"z":0`) + `,"k1":0,"b":` + wide(3, `"z":0`) + `}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := checkMembers([]byte(tc.body))
			switch {
			case tc.location == "" && p != nil:
				t.Fatalf("got %v, want no problem", p)
			case tc.location == "":
				return
			case p == nil:
				t.Fatalf("got no problem, want %s %s", tc.location, tc.message)
			}
			want := invalid(tc.location, tc.message)
			if !reflect.DeepEqual(p, want) {
				t.Errorf("got %v, want %v", p, want)
			}
			if len(tc.body) < 1<<14 {
				agree(t, []byte(tc.body))
			}
		})
	}
}

// TestCheckMembersAgreesWithReference compares checkMembers and checkDepth
// with the reference model on random bodies, deep, wide and full of
// repeated and escaped names.
func TestCheckMembersAgreesWithReference(t *testing.T) {
	rnd := rand.New(rand.NewPCG(13, 1))
	seen := map[string]int{} // how often each answer came, so that every kind is tried
	for range 2_000 {
		body := []byte(randomJSON(rnd, rnd.IntN(maxDepth+8), rnd.IntN(3) == 0, rnd.IntN(3) == 0))
		agree(t, body)
		msg := "none"
		if p := checkMembers(body); p != nil {
			msg = p.errors[0].Message
		}
		seen[msg]++
	}
	for _, msg := range []string{"none", "appears more than once", "must not be null", "nests arrays and objects deeper than 32 levels", "has more than 64 members"} {
		if seen[msg] < 50 {
			t.Errorf("%q: got %d random bodies, want at least 50 (%v)", msg, seen[msg], seen)
		}
	}
}

// randomJSON is a random JSON value nested depth levels deep, with a few
// nulls when nulls is set, and names repeated in an object when dups is.
func randomJSON(rnd *rand.Rand, depth int, nulls, dups bool) string {
	names := []string{`"a"`, `"b"`, `"\u0061"`, `"a\"b"`, `"a.b"`, `""`, `"permits"`}
	scalars := []string{`{}`, `[ ]`, `0`, `-1.5e3`, `true`, `false`, `"x"`, `"[{\"null"`, `" n "`}
	if depth == 0 {
		if nulls && rnd.IntN(40) == 0 {
			return "null"
		}
		return scalars[rnd.IntN(len(scalars))]
	}
	n := 1 + rnd.IntN(4)
	switch rnd.IntN(32) {
	case 0, 1, 2:
		n = smallObject + rnd.IntN(4)
	case 3:
		n = maxMembers - 1 + rnd.IntN(3)
	}
	var b strings.Builder
	object := rnd.IntN(2) == 0
	b.WriteString(map[bool]string{true: "{ ", false: "[\n"}[object])
	for i := range n {
		if i > 0 {
			b.WriteString(" ,")
		}
		if object {
			name := `"n` + strconv.Itoa(i) + `"`
			if dups && rnd.IntN(8) == 0 {
				name = names[rnd.IntN(len(names))]
			}
			b.WriteString(name + ": ")
		}
		// One deep branch, so that depth is reached, and shallow ones
		// beside it, so that the body stays small.
		d := depth - 1
		switch {
		case i > 0 && n > smallObject:
			d = 0
		case i > 0:
			d = min(d, rnd.IntN(3))
		}
		b.WriteString(randomJSON(rnd, d, nulls, dups))
	}
	b.WriteString(map[bool]string{true: "}", false: "\t]"}[object])
	return b.String()
}

// FuzzCheckMembers compares checkMembers and checkDepth with the reference
// model on any valid JSON body.
func FuzzCheckMembers(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `null`, `"x"`, `1`, `{"a":1,"a":2}`, `{"a":null}`, `[1,null]`, `{"a":{"b":[{"c":1,"\u0063":2}]}}`,
		`{"a":"\"}]","b":["{"]}`, nested(33, `{"a":1}`), strings.Repeat(`{"a":`, 34) + "1" + strings.Repeat("}", 34),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 || !json.Valid(data) {
			return // the reference is quadratic
		}
		agree(t, data)
	})
}

// TestDeepBodyRefused sends each operation with a body a body nested
// deeper than maxDepth: each is refused with a 400 naming where, before
// any validator reads it, and nothing is acquired.
func TestDeepBodyRefused(t *testing.T) {
	e := newEnv(t, nil)
	e.put("seed", client.LimiterSpec{Limit: 9, Period: "1m"})
	attack := nested(9_990, "") // within encoding/json's own bound of 10,000
	for _, tc := range []struct {
		name, method, path, body, location string
	}{
		{"put", http.MethodPut, "/v1/limiters/seed", `{"limit":5,"period":"1m","algorithm":` + attack + `}`, "body.algorithm" + zeros(31)},
		{"put as array", http.MethodPut, "/v1/limiters/other", attack, "body" + zeros(32)},
		{"acquire", http.MethodPost, "/v1/limiters/seed/acquire", `{"permits":` + attack + `}`, "body.permits" + zeros(31)},
		{"tenant acquire", http.MethodPost, "/v1/tenants/203.0.113.7/acquire", attack, "body" + zeros(32)},
		{"batch", http.MethodPost, "/v1/acquire", `{"acquisitions":[{"limiter":"seed"},{"limiter":` + attack + `}]}`, "body.acquisitions.1.limiter" + zeros(29)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := e.raw(tc.method, tc.path, "application/json", tc.body)
			p := checkProblem(t, res, body, http.StatusBadRequest)
			want := []client.FieldError{{Location: tc.location, Message: "nests arrays and objects deeper than 32 levels"}}
			if p.Errors == nil || !reflect.DeepEqual(*p.Errors, want) {
				t.Errorf("field errors: got %s, want %v", body, want)
			}
		})
	}
	if got := e.available("seed"); got != 9 {
		t.Errorf("available: got %d, want 9", got)
	}
	got, err := e.c.GetLimiterWithResponse(ctx, "seed")
	if err != nil {
		t.Fatal(err)
	}
	if got.JSON200 == nil || got.JSON200.Algorithm != client.AlgorithmGcra {
		t.Errorf("seed: got %d %s, want it unchanged", got.StatusCode(), got.Body)
	}
}

// TestWideBody: an object of thousands of members is refused at once, with
// one field error rather than one per unknown member, and a duplicate is
// found however late.
func TestWideBody(t *testing.T) {
	e := newEnv(t, nil)
	members := func(n int) string {
		var b strings.Builder
		b.WriteString(`{"limit":5,"period":"1m"`)
		for i := range n {
			fmt.Fprintf(&b, `,"k%d":%d`, i, i)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name, body, location, message string
	}{
		{"5,000 members", members(5_000) + `}`, "body", "has more than 64 members"},
		{"late duplicate", members(61) + `,"limit":6}`, "body.limit", "appears more than once"},
		{"unknown members", members(62) + `}`, "body.k0", "is not a known field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := e.raw(http.MethodPut, "/v1/limiters/wide", "application/json", tc.body)
			p := checkProblem(t, res, body, http.StatusBadRequest)
			if p.Errors == nil || !slices.Contains(*p.Errors, client.FieldError{Location: tc.location, Message: tc.message}) {
				t.Errorf("field errors: got %.300s, want %s %s", body, tc.location, tc.message)
			}
		})
	}
}

// wideObject is an object of maxMembers members, each member with # replaced
// by its index.
func wideObject(member string) string {
	ms := make([]string, maxMembers)
	for i := range ms {
		ms[i] = strings.ReplaceAll(member, "#", strconv.Itoa(i))
	}
	return "{" + strings.Join(ms, ",") + "}"
}

// BenchmarkCheckMembers reads bodies of two sizes: the time per byte
// (MB/s) stays flat when checking is linear.
//
//	go test -run '^$' -bench CheckMembers -count 6 ./internal/httpapi | benchstat -
func BenchmarkCheckMembers(b *testing.B) {
	fill := func(size int, open, unit, close string) []byte {
		var s strings.Builder
		s.WriteString(open)
		for i := 0; s.Len() < size-len(close); i++ {
			s.WriteString(strings.ReplaceAll(unit, "#", strconv.Itoa(i)))
		}
		return []byte(strings.TrimSuffix(s.String(), ",") + close)
	}
	for _, size := range []int{4 << 10, 64 << 10} {
		for _, bc := range []struct {
			name string
			body []byte
		}{
			// Arrays in arrays, as deep as the size allows within
			// encoding/json's bound (refused).
			{"nested", []byte(strings.Repeat("[   ", size/8) + strings.Repeat("]   ", size/8))},
			// Arrays 30 deep, again and again (accepted).
			{"nested30", fill(size, "[", nested(29, "0")+",", "]")},
			// Objects of as many short members as allowed.
			{"wide", fill(size, "[", wideObject(`"k#":0`)+",", "]")},
			// Objects of as many long names, alike but for their end.
			{"duplicates", fill(size, "[", wideObject(`"`+strings.Repeat("x", 48)+`#":0`)+",", "]")},
		} {
			b.Run(fmt.Sprintf("%s/%dKB", bc.name, size>>10), func(b *testing.B) {
				if !json.Valid(bc.body) {
					b.Fatalf("invalid body %.100s", bc.body)
				}
				b.SetBytes(int64(len(bc.body)))
				b.ReportAllocs()
				for b.Loop() {
					_ = checkMembers(bc.body)
				}
			})
		}
	}
}

func TestCheckText(t *testing.T) {
	const (
		notUTF8   = "must be UTF-8"
		surrogate = `must not hold a lone surrogate escape (\ud800 to \udfff)`
		badName   = "has a member name that is not UTF-8"
	)
	for _, tc := range []struct {
		in                string
		location, message string // both "" when the body is text
	}{
		{in: `{"key":"user-1"}`},
		{in: `{"key":"\\ud800"}`}, // a backslash, then ud800
		{in: `{"key":"\u00e9\ud83d\ude00\uD83D\uDE00"}`},
		{in: "{\"key\":\"\xc3\xa9\xf0\x9f\x98\x80\"}"},
		{in: `{"a\"b":"\"\ud800"}`, location: `body.a"b`, message: surrogate},
		{in: `{"key":"\ud83d\ude00\ud83d"}`, location: "body.key", message: surrogate},
		{in: `{"key":"\ude00\ud83d"}`, location: "body.key", message: surrogate},
		{in: `{"\u0041":"\udc00"}`, location: "body.A", message: surrogate},
		{in: "[\"ok\",\"\xff\"]", location: "body.1", message: notUTF8},
		{in: "\"\xff\"", location: "body", message: notUTF8},
		{in: "{\"a\":{\"b\xff\":1}}", location: "body.a", message: badName},
		{in: `[{"a":1},{"\udfff":1}]`, location: "body.1", message: badName},
		{in: "{\"a\":\"\xff\",\"b\":\"\\ud800\"}", location: "body.a", message: notUTF8},
		{in: "{\"a\":\"\\ud800\",\"b\":\"\xff\"}", location: "body.a", message: surrogate},
	} {
		t.Run(tc.in, func(t *testing.T) {
			if !json.Valid([]byte(tc.in)) {
				t.Fatalf("%s is not valid JSON", tc.in)
			}
			var location, message string
			if p := checkText([]byte(tc.in)); p != nil {
				location, message = p.errors[0].Location, p.errors[0].Message
			}
			if location != tc.location || message != tc.message {
				t.Errorf("checkText(%s): got %q %q, want %q %q", tc.in, location, message, tc.location, tc.message)
			}
		})
	}
}

// TestCheckTextAgreesWithReference holds checkText to an obviously correct
// reading of strings made of pieces whose nature is known: a piece of
// bytes that are not UTF-8 spoils the string; a high surrogate escape is
// text only right before a low one; a low one only right after a high one.
func TestCheckTextAgreesWithReference(t *testing.T) {
	const high, low = `\ud83d`, `\uDE00`
	pieces := []string{"a", "é", `\\`, `\n`, `\"`, `\u0041`, `\uFFFD`, "ud800", high, low, "\xff", "\xc3", "\xed\xa0\x80"}
	notText := func(p string) bool { return p == "\xff" || p == "\xc3" || p == "\xed\xa0\x80" }
	ref := func(ps []string) string {
		if slices.ContainsFunc(ps, notText) {
			return "must be UTF-8"
		}
		for i := 0; i < len(ps); i++ {
			switch {
			case ps[i] == high && i+1 < len(ps) && ps[i+1] == low:
				i++
			case ps[i] == high || ps[i] == low:
				return `must not hold a lone surrogate escape (\ud800 to \udfff)`
			}
		}
		return ""
	}
	rnd := rand.New(rand.NewPCG(3, 4))
	for range 5_000 {
		ps := make([]string, 1+rnd.IntN(6))
		for i := range ps {
			ps[i] = pieces[rnd.IntN(len(pieces))]
		}
		s, want := strings.Join(ps, ""), ref(ps)
		for _, tc := range []struct{ body, location string }{
			{`{"k":"` + s + `"}`, "body.k"},
			{`{"` + s + `":1}`, "body"},
		} {
			p := checkText([]byte(tc.body))
			var got string
			if p != nil {
				got = p.errors[0].Message
				if p.errors[0].Location != tc.location {
					t.Errorf("checkText(%s): got location %s, want %s", tc.body, p.errors[0].Location, tc.location)
				}
			}
			if tc.location == "body" && want != "" {
				want = "has a member name that is not UTF-8"
			}
			if got != want {
				t.Fatalf("checkText(%s): got %q, want %q", tc.body, got, want)
			}
		}
	}
}

// BenchmarkCheckText reads the bodies of BenchmarkAcquireHTTP and
// BenchmarkAcquireBatchHTTP, the cost checkText adds to every request
// with a body; a batch with a \u escape that needs no scan; and one with
// an escaped surrogate pair, which is scanned.
//
//	go test -run '^$' -bench CheckText -count 6 ./internal/httpapi | benchstat -
func BenchmarkCheckText(b *testing.B) {
	for _, bc := range []struct{ name, body string }{
		{"acquire", `{"permits":1}`},
		{"batch100", `{"acquisitions":[` + strings.Repeat(`{"limiter":"bench","permits":1},`, 99) + `{"limiter":"bench","permits":1}]}`},
		{"batch100-escaped", `{"acquisitions":[` + strings.Repeat(`{"limiter":"bench","permits":1},`, 99) + `{"limiter":"bench","key":"\u00e9"}]}`},
		{"batch100-pair", `{"acquisitions":[` + strings.Repeat(`{"limiter":"bench","permits":1},`, 99) + `{"limiter":"bench","key":"\ud83d\ude00"}]}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			body := []byte(bc.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if checkText(body) != nil {
					b.Fatal("refused")
				}
			}
		})
	}
}
