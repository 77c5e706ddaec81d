package forwardauth

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// The upstreams a proxy may forward to, each routing a path as it is
// written on the request line by its own rules. A rule must apply to
// every request that one of them routes to a path under its prefix.
var upstreams = []struct {
	name  string
	route func(raw string) string
}{
	// Go's ServeMux, Django, werkzeug: decoded once, leniently, then
	// cleaned.
	{"decode, clean", func(p string) string { return path.Clean(refDecode(p)) }},
	// A router on the raw path (Express's prefixes).
	{"raw", func(p string) string { return p }},
	// A router on the decoded path that keeps dot segments.
	{"decode", refDecode},
	// Tomcat, Jetty, Spring: path parameters dropped, then decoded and
	// cleaned (so /..;/ is /../).
	{"drop params, decode, clean", func(p string) string { return path.Clean(refDecode(dropParams(p))) }},
	// A proxy that removes dot segments from the raw path (RFC 3986,
	// HAProxy's path-strip-dotdot) before an upstream that decodes.
	{"remove dots, decode", func(p string) string { return refDecode(removeDots(p)) }},
	// The same before an upstream that decodes and cleans.
	{"remove dots, decode, clean", func(p string) string { return path.Clean(refDecode(removeDots(p))) }},
	// Decoded twice (IIS's double decoding, an application that decodes
	// what its framework decoded).
	{"decode twice, clean", func(p string) string { return path.Clean(refDecode(refDecode(p))) }},
	// Windows servers: backslashes are slashes, trailing dots and spaces
	// of a name are dropped.
	{"windows", func(p string) string { return path.Clean(trimNames(strings.ReplaceAll(refDecode(p), `\`, "/"))) }},
	// WHATWG URL parsers (Node): backslashes are slashes, %2e is a dot
	// in a dot segment, then decoded by the application.
	{"whatwg", func(p string) string { return refDecode(whatwgDots(strings.ReplaceAll(p, `\`, "/"))) }},
	// A proxy that cuts the path at '#', before one that decodes and
	// cleans.
	{"cut at #, decode, clean", func(p string) string {
		p, _, _ = strings.Cut(p, "#")
		return path.Clean(refDecode(p))
	}},
}

var escape = regexp.MustCompile(`%[0-9A-Fa-f]{2}`)

// refDecode decodes every valid escape of p and leaves the rest as it is,
// as lenient upstreams do.
func refDecode(p string) string {
	return escape.ReplaceAllStringFunc(p, func(e string) string {
		b, _ := hex.DecodeString(e[1:])
		return string(b)
	})
}

// dropParams drops the parameters (";...") of each segment of p.
func dropParams(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i], _, _ = strings.Cut(s, ";")
	}
	return strings.Join(segs, "/")
}

// trimNames drops the trailing dots and spaces of each segment of p that
// has more than dots and spaces.
func trimNames(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if t := strings.TrimRight(s, ". "); t != "" {
			segs[i] = t
		}
	}
	return strings.Join(segs, "/")
}

// removeDots removes the dot segments of p as RFC 3986 section 5.2.4
// does, keeping empty segments.
func removeDots(p string) string {
	segs := strings.Split(p, "/")
	var out []string
	for i, s := range segs {
		switch {
		case s == "..":
			if len(out) > 1 {
				out = out[:len(out)-1]
			}
		case s != ".":
			out = append(out, s)
			continue
		}
		if i == len(segs)-1 {
			out = append(out, "")
		}
	}
	return strings.Join(out, "/")
}

// whatwgDots is removeDots with %2e as a dot, as the WHATWG URL standard
// reads a dot segment.
func whatwgDots(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		switch strings.ToLower(s) {
		case "%2e":
			segs[i] = "."
		case ".%2e", "%2e.", "%2e%2e":
			segs[i] = ".."
		}
	}
	return removeDots(strings.Join(segs, "/"))
}

// under reports whether the routed path p starts with prefix, cases
// ignored: Express and ASP.NET route paths so.
func under(p, prefix string) bool {
	pr, ps := []rune(prefix), []rune(p)
	if len(ps) < len(pr) {
		return false
	}
	for i, r := range pr {
		if !foldsTo(r, ps[i]) {
			return false
		}
	}
	return true
}

func foldsTo(a, b rune) bool {
	if a == b {
		return true
	}
	for r := unicode.SimpleFold(a); r != a; r = unicode.SimpleFold(r) {
		if r == b {
			return true
		}
	}
	return false
}

// speller writes paths as an attacker would, each a spelling that some
// upstream routes to the path it started from.
type speller struct{ rng *rand.Rand }

// char writes one byte c of a path, perhaps escaped, twice escaped, or
// in the other case.
func (s speller) char(c byte) string {
	hexs := func(b byte) string {
		h := fmt.Sprintf("%02X", b)
		if s.rng.IntN(2) == 0 {
			h = strings.ToLower(h)
		}
		return h
	}
	switch s.rng.IntN(10) {
	case 0, 1:
		return "%" + hexs(c)
	case 2:
		return "%25" + hexs(c)
	case 3:
		switch {
		case 'a' <= c && c <= 'z':
			return string(c - 'a' + 'A')
		case 'A' <= c && c <= 'Z':
			return string(c - 'A' + 'a')
		}
	}
	return string(c)
}

// benign are separators that no upstream reads as a dot segment: a
// repeated slash, an escaped one, a backslash, a path parameter, a
// trailing dot or space.
var benign = []string{"/", "//", "%2F", "%2f", `\`, "%5C", ";p=1/", ";/", "./", "%2E/", " /", "/;x/"}

// dotted are separators with a dot segment in some spelling.
var dotted = []string{"/./", "/%2e/", "/x/../", "/x/%2e%2e/", "/x/..;/", "/x/.%2E/", "/x/%252e%252e/", `\x\..\`, "/x/.. /", "/x/...;/", "/#/../"}

// spell writes the routed path p, each of its slashes written as one of
// seps (the first always as a slash, as the request line needs).
func (s speller) spell(p string, seps []string) string {
	var b strings.Builder
	for i := range len(p) {
		switch {
		case i == 0:
			b.WriteByte('/')
		case p[i] == '/':
			b.WriteString(seps[s.rng.IntN(len(seps))])
		default:
			b.WriteString(s.char(p[i]))
		}
	}
	switch s.rng.IntN(6) {
	case 0:
		b.WriteString("?next=/elsewhere")
	case 1:
		b.WriteString("%zz") // an escape that is no escape
	case 2:
		b.WriteString("#frag")
	}
	return b.String()
}

// TestNoSpellingEscapesARule generates spellings of paths under each
// rule's prefix, and of methods in any case, and holds the rules to the
// upstreams above: a request that one of them routes under a rule's
// prefix is charged by the rule, or refused. Spellings without a dot
// segment are never refused, and a path outside every prefix, however
// written, is charged by none.
func TestNoSpellingEscapesARule(t *testing.T) {
	rules := []Rule{
		{Limiter: "admin", Key: ByRoute, PathPrefix: "/admin/"},
		{Limiter: "login", Key: ByRoute, PathPrefix: "/login", Methods: []string{"POST"}},
		{Limiter: "api", Key: ByRoute, PathPrefix: "/api/v1/users/"},
		{Limiter: "root", Key: ByRoute, PathPrefix: "/static"},
	}
	cfg := Config{Rules: rules, DenyStatus: 429, IPv6Prefix: 64}
	tails := []string{"", "x", "x/y", "deep/er/path", "a.b", "é"}
	methods := []string{"POST", "post", "Post", "pOST", " POST", "POST "}
	rng := rand.New(rand.NewPCG(34, 4))
	sp := speller{rng}
	var routedUnder, plain int
	for range 8000 {
		r := rules[rng.IntN(len(rules))]
		target := r.PathPrefix + tails[rng.IntN(len(tails))]
		if !strings.HasSuffix(r.PathPrefix, "/") && rng.IntN(2) == 0 {
			target = r.PathPrefix + "/" + tails[rng.IntN(len(tails))]
		}
		seps, isBenign := benign, true
		if rng.IntN(3) == 0 {
			seps, isBenign = append(slices.Clone(benign), dotted...), false
		}
		written := sp.spell(target, seps)
		method := methods[rng.IntN(len(methods))]
		path, _, _ := strings.Cut(written, "?")
		req := Request{Method: method, Path: path, Client: netip.MustParseAddr("203.0.113.7"), Header: header()}
		items, err := cfg.Items(req)
		if err != nil {
			if !errors.Is(err, ErrPath) || isBenign {
				t.Errorf("%s %q: refused (%v), want it matched: it has no dot segment", method, written, err)
			}
			continue
		}
		got := slices.ContainsFunc(items, func(it limiter.Item) bool { return it.Name == r.Limiter })
		for _, u := range upstreams {
			if routed := u.route(path); under(routed, r.PathPrefix) {
				routedUnder++
				if isBenign {
					plain++
				}
				if !got {
					t.Errorf("%s %q, which %s routes to %q: rule %q does not apply, want it to", method, written, u.name, routed, r.PathPrefix)
					break
				}
			}
		}
		if t.Failed() && routedUnder > 50 {
			t.FailNow()
		}
	}
	t.Logf("%d routings of a spelling under a prefix, %d of one without a dot segment", routedUnder, plain)
	if routedUnder < 10000 || plain < 5000 {
		t.Errorf("%d routings of a spelling under a prefix, %d of one without a dot segment: too few for the test to mean anything", routedUnder, plain)
	}
	// Paths outside every prefix, escaped, are charged by no rule.
	for _, p := range []string{"/", "/adm", "/administrator", "/api/v1/user", "/log", "/stat", "/x/admin/", "/x/login"} {
		for range 20 {
			written := speller{rng}.spell(p, []string{"/", "//", "%2F", `\`, ";p/"})
			written, _, _ = strings.Cut(written, "?")
			written = strings.TrimSuffix(written, "#frag")
			items, err := cfg.Items(Request{Method: "POST", Path: written, Header: header()})
			if err != nil || len(items) > 0 {
				t.Errorf("%q: got %v (%v), want no rule to apply", written, items, err)
			}
		}
	}
}

// TestRefusedPathChargesNothing: a request whose path is refused is
// denied, with fail-open too, and charges nothing, not even the rules that
// do not match by path; a request with no rule by path is never refused.
func TestRefusedPathChargesNothing(t *testing.T) {
	ctx := t.Context()
	store := limiter.NewService(memory.New(nil, 0))
	def := limiter.Definition{Name: "per-ip", Keyed: true, Group: "g", Policy: limiter.Policy{Limit: 5, Period: limiter.MaxPeriod}.Normalize()}
	if _, err := store.Put(ctx, def); err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddr("203.0.113.7")
	byIP := Rule{Limiter: "per-ip", Key: ByClientIP, Permits: 1}
	byPath := Rule{Limiter: "per-ip", Key: ByClientIP, PathPrefix: "/login", Permits: 1}
	for _, tt := range []struct {
		name    string
		rules   []Rule
		refused bool
		left    int64
	}{
		{"a rule by path", []Rule{byIP, byPath}, true, 5},
		{"no rule by path", []Rule{byIP}, false, 4},
	} {
		cfg := Config{Rules: tt.rules, DenyStatus: 429, IPv6Prefix: 64}
		if err := cfg.Check(map[string]limiter.Definition{"per-ip": def}); err != nil {
			t.Fatal(err)
		}
		a, err := NewService(cfg, store, true).Decide(ctx, Request{Method: "POST", Path: "/x/../login", Client: client, Header: header()})
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Refused != nil; got != tt.refused || a.Allowed == tt.refused {
			t.Errorf("%s: got refused %v (%v), allowed %v; want refused %v", tt.name, got, a.Refused, a.Allowed, tt.refused)
		}
		av, err := store.AvailableKey(ctx, "per-ip", client.String())
		if err != nil {
			t.Fatal(err)
		}
		if av.Remaining != tt.left {
			t.Errorf("%s: %d left, want %d", tt.name, av.Remaining, tt.left)
		}
	}
}

// FuzzRoutePath holds RoutePath to what it promises of a path it does not
// refuse: a path from a slash, without an empty segment but the last, a
// parameter, a backslash, a control character, a valid escape or a name
// ending in a dot or a space, which it returns unchanged.
func FuzzRoutePath(f *testing.F) {
	for _, s := range []string{"/login", "/%2561dmin/x%zz", "/a;b/c", `/a\b`, "/x/../y", "/a./b /", "/%3Fq", "http://h/a", "//", "/%25252541"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		got, err := RoutePath(uri)
		if err != nil {
			if !errors.Is(err, ErrPath) {
				t.Fatalf("RoutePath(%q): %v, want ErrPath", uri, err)
			}
			return
		}
		if !strings.HasPrefix(got, "/") || strings.Contains(got, "//") || strings.ContainsAny(got, `;\`) || escape.MatchString(got) {
			t.Fatalf("RoutePath(%q) = %q", uri, got)
		}
		for i := range len(got) {
			if c := got[i]; c < 0x20 || c == 0x7f || c == '/' && i > 0 && (got[i-1] == '.' || got[i-1] == ' ') {
				t.Fatalf("RoutePath(%q) = %q", uri, got)
			}
		}
		if strings.HasSuffix(got, ".") || strings.HasSuffix(got, " ") {
			t.Fatalf("RoutePath(%q) = %q, a name ending in a dot or a space", uri, got)
		}
		if !strings.Contains(got, "?") {
			if again, err := RoutePath(got); again != got || err != nil {
				t.Fatalf("RoutePath(%q) = %q, and RoutePath of that = %q, %v", uri, got, again, err)
			}
		}
	})
}
