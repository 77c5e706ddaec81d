package forwardauth

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// header holds the headers kv, names and values in turn.
func header(kv ...string) Header {
	h := make(testHeader, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		h[kv[i]] = kv[i+1]
	}
	return h
}

type testHeader map[string]string

func (h testHeader) Get(name string) string { return h[name] }

func TestItems(t *testing.T) {
	cfg := Config{IPv6Prefix: 64, DenyStatus: 429, Rules: []Rule{
		{Limiter: "per-ip", Key: ByClientIP, Permits: 1},
		{Limiter: "api", Key: ByHeader, Header: "X-Api-Key", PathPrefix: "/api/", Permits: 2},
		{Limiter: "search", Key: ByRoute, Host: "*.example.com", PathPrefix: "/search", Methods: []string{"GET", "HEAD"}, Permits: 1},
		{Limiter: "login", Key: ByClientIP, Host: "example.com", PathPrefix: "/login", Methods: []string{"POST"}, Permits: 1},
	}}
	v4 := netip.MustParseAddr("203.0.113.7")
	tests := []struct {
		name string
		req  Request
		want []limiter.Item
	}{
		{"every request counts per IP", Request{Method: "GET", Host: "a", Path: "/", Client: v4},
			[]limiter.Item{{Name: "per-ip", Key: "203.0.113.7", Permits: 1}}},
		{"IPv6 grouped by the tenants' prefix", Request{Method: "GET", Path: "/", Client: netip.MustParseAddr("2001:db8:1:2::5")},
			[]limiter.Item{{Name: "per-ip", Key: "2001:db8:1:2::/64", Permits: 1}}},
		{"a header key", Request{Method: "POST", Path: "/api/v1", Client: v4, Header: header("X-Api-Key", "k1")},
			[]limiter.Item{{Name: "per-ip", Key: "203.0.113.7", Permits: 1}, {Name: "api", Key: "k1", Permits: 2}}},
		{"no header: the rule does not apply", Request{Method: "POST", Path: "/api/v1", Client: v4, Header: header()},
			[]limiter.Item{{Name: "per-ip", Key: "203.0.113.7", Permits: 1}}},
		{"a header that cannot be a key is digested", Request{Method: "GET", Path: "/api/", Client: v4, Header: header("X-Api-Key", "#x")},
			[]limiter.Item{{Name: "per-ip", Key: "203.0.113.7", Permits: 1}, {Name: "api", Key: limiter.DigestKey("#x"), Permits: 2}}},
		{"a subdomain, its port and case ignored", Request{Method: "HEAD", Host: "WWW.Example.com:8443", Path: "/search?q=x", Client: v4},
			[]limiter.Item{{Name: "per-ip", Key: "203.0.113.7", Permits: 1}, {Name: "search", Permits: 1}}},
		{"the domain itself is no subdomain", Request{Method: "GET", Host: "example.com", Path: "/search", Client: v4},
			[]limiter.Item{{Name: "per-ip", Key: "203.0.113.7", Permits: 1}}},
		{"another method", Request{Method: "POST", Host: "www.example.com", Path: "/search", Client: v4},
			[]limiter.Item{{Name: "per-ip", Key: "203.0.113.7", Permits: 1}}},
		{"an exact host", Request{Method: "POST", Host: "Example.COM", Path: "/login/form", Client: v4},
			[]limiter.Item{{Name: "per-ip", Key: "203.0.113.7", Permits: 1}, {Name: "login", Key: "203.0.113.7", Permits: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.req.Header == nil {
				tt.req.Header = header()
			}
			tt.req.Path, _, _ = strings.Cut(tt.req.Path, "?")
			got, err := cfg.Items(tt.req)
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("got %v (%v), want %v", got, err, tt.want)
			}
		})
	}
	if _, err := cfg.Items(Request{Method: "GET", Path: "/", Client: netip.IPv4Unspecified(), Header: header()}); err == nil {
		t.Error("an unspecified client address keyed a limit")
	}
}

func TestConfigCheck(t *testing.T) {
	defs := map[string]limiter.Definition{
		"ip":    {Name: "ip", Keyed: true, Group: "g", Policy: limiter.Policy{Limit: 5, Period: 1e9}.Normalize()},
		"plain": {Name: "plain", Group: "g", Policy: limiter.Policy{Limit: 5, Period: 1e9}.Normalize()},
		"other": {Name: "other", Keyed: true, Group: "h", Policy: limiter.Policy{Limit: 5, Period: 1e9}.Normalize()},
	}
	ok := Config{DenyStatus: 429, IPv6Prefix: 64, Rules: []Rule{{Limiter: "ip", Key: ByClientIP, Permits: 1}, {Limiter: "plain", Key: ByRoute, Permits: 5}}}
	if err := ok.Check(defs); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, want string
		edit       func(*Config)
	}{
		{"unknown limiter", `no limiter "nope"`, func(c *Config) { c.Rules[0].Limiter = "nope" }},
		{"route on a keyed limiter", "is keyed", func(c *Config) { c.Rules[0].Key = ByRoute }},
		{"client on a plain limiter", "is not keyed", func(c *Config) { c.Rules[1].Key = ByClientIP }},
		{"another group", "share a group", func(c *Config) { c.Rules[1] = Rule{Limiter: "other", Key: ByClientIP, Permits: 1} }},
		{"more than the capacity", "can ever hold, 5, got 6", func(c *Config) { c.Rules[1].Permits = 6 }},
		{"a wildcard inside", "wildcard", func(c *Config) { c.Rules[0].Host = "a.*.com" }},
		{"a lower-case method", "upper-case", func(c *Config) { c.Rules[0].Methods = []string{"get"} }},
		{"a query in a path", `write it as the upstream routes it, "/search"`, func(c *Config) { c.Rules[0].PathPrefix = "/search?q=" }},
		{"a path encoded", `"/a b"`, func(c *Config) { c.Rules[0].PathPrefix = "/a%20b" }},
		{"a path with a dot segment", "dot segment", func(c *Config) { c.Rules[0].PathPrefix = "/x/../login" }},
		{"a relative path", `"/api/"`, func(c *Config) { c.Rules[0].PathPrefix = "api/" }},
		{"a path parameter", `"/admin/"`, func(c *Config) { c.Rules[0].PathPrefix = "/admin;x/" }},
		{"a trailing dot", `"/admin/"`, func(c *Config) { c.Rules[0].PathPrefix = "/admin./" }},
		{"a backslash", `"/admin/x"`, func(c *Config) { c.Rules[0].PathPrefix = `/admin\x` }},
		{"an escape twice over", `"/admin"`, func(c *Config) { c.Rules[0].PathPrefix = "/%2561dmin" }},
		{"a % that is no escape", "no escape", func(c *Config) { c.Rules[0].PathPrefix = "/100%" }},
		{"not UTF-8", "UTF-8", func(c *Config) { c.Rules[0].PathPrefix = "/\xff" }},
		{"deny status", "429 or 403", func(c *Config) { c.DenyStatus = 500 }},
		{"both ways to trust", "not both", func(c *Config) {
			c.ClientIP = ClientIP{Hops: 1, Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			c.Rules = slices.Clone(ok.Rules)
			tt.edit(&c)
			if err := c.Check(defs); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// refMatches is the reference of a rule's match, written apart from
// Rule.matches.
func refMatches(r Rule, req Request) bool {
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
		if strings.Contains(h, ":") {
			host = "[" + h + "]"
		}
	}
	host = strings.ToLower(host)
	rh := strings.ToLower(r.Host)
	hostOK := rh == "" || host == rh || strings.HasPrefix(rh, "*.") && strings.HasSuffix(host, rh[1:]) && host != rh[2:]
	methodOK := len(r.Methods) == 0 || slices.Contains(r.Methods, req.Method)
	return hostOK && methodOK && len(req.Path) >= len(r.PathPrefix) && req.Path[:len(r.PathPrefix)] == r.PathPrefix
}

// TestDecisionsMatchModel holds random requests, decided through a Service
// on the memory backend, to a model: the rules a request matches, found by
// refMatches, each charging its limiter under the request's key, all or
// nothing, against counts that nothing refills (the periods are a year).
func TestDecisionsMatchModel(t *testing.T) {
	ctx := context.Background()
	var denied, granted int
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 3))
		store := limiter.NewService(memory.New(nil, 0))
		limits := map[string]int64{}
		defs := map[string]limiter.Definition{}
		for i, keyed := range []bool{true, true, false, true} {
			def := limiter.Definition{Name: fmt.Sprintf("l%d", i), Group: "g", Keyed: keyed,
				Policy: limiter.Policy{Limit: 3 + rng.Int64N(8), Period: limiter.MaxPeriod}.Normalize()}
			if _, err := store.Put(ctx, def); err != nil {
				t.Fatal(err)
			}
			limits[def.Name], defs[def.Name] = def.Policy.Limit, def
		}
		hosts := []string{"", "example.com", "*.example.com"}
		paths := []string{"", "/api/", "/api/v2", "/s"}
		var cfg Config
		for range 1 + rng.IntN(5) {
			name := fmt.Sprintf("l%d", rng.IntN(4))
			r := Rule{Limiter: name, Host: hosts[rng.IntN(3)], PathPrefix: paths[rng.IntN(4)], Permits: 1 + rng.Int64N(2)}
			switch {
			case !defs[name].Keyed:
				r.Key = ByRoute
			case rng.IntN(2) == 0:
				r.Key = ByClientIP
			default:
				r.Key, r.Header = ByHeader, "X-User"
			}
			if rng.IntN(3) == 0 {
				r.Methods = []string{"POST"}
			}
			cfg.Rules = append(cfg.Rules, r)
		}
		cfg.DenyStatus, cfg.IPv6Prefix, cfg.DenyUnmatched = 429, 64, rng.IntN(2) == 0
		if err := cfg.Check(defs); err != nil {
			t.Fatal(err)
		}
		svc := NewService(cfg, store, false)
		used := map[[2]string]int64{}
		reqHosts := []string{"example.com", "www.example.com:8080", "EXAMPLE.com", "other.org"}
		// Paths as a client writes them, and as the upstream routes
		// them, which the model matches.
		reqPaths := []struct{ written, routed string }{
			{"/", "/"}, {"/api/", "/api/"}, {"/api/v2/x", "/api/v2/x"}, {"/s", "/s"}, {"/search", "/search"},
			{"/%61pi/", "/api/"}, {"//api/v2/x", "/api/v2/x"}, {"/API/v2/x?y", "/api/v2/x"}, {"/s.", "/s"}, {"/%73earch", "/search"},
		}
		clients := []string{"203.0.113.7", "203.0.113.8", "2001:db8::1", "2001:db8::2:1"}
		for step := range 400 {
			path := reqPaths[rng.IntN(len(reqPaths))]
			req := Request{
				Method: []string{"GET", "POST"}[rng.IntN(2)], Host: reqHosts[rng.IntN(4)], Path: path.written,
				Client: netip.MustParseAddr(clients[rng.IntN(4)]),
			}
			user := []string{"", "alice", "bob"}[rng.IntN(3)]
			req.Header = header("X-User", user)
			// The model.
			want := map[[2]string]int64{}
			matched := false
			routed := req
			routed.Path = path.routed
			for _, r := range cfg.Rules {
				if !refMatches(r, routed) {
					continue
				}
				key := ""
				switch r.Key {
				case ByClientIP:
					key = req.Client.String()
					if req.Client.Is6() {
						key = netip.PrefixFrom(req.Client, 64).Masked().String()
					}
				case ByHeader:
					if user == "" {
						continue
					}
					key = user
				}
				matched = true
				want[[2]string{r.Limiter, key}] += r.Permits
			}
			allowed := !cfg.DenyUnmatched || matched
			if matched {
				for k, n := range want {
					allowed = allowed && used[k]+n <= limits[k[0]]
				}
			}
			a, err := svc.Decide(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if a.Allowed != allowed {
				t.Fatalf("seed %d, step %d: %+v (user %q): allowed %v, want %v; charged %v, used %v", seed, step, req, user, a.Allowed, allowed, want, used)
			}
			if allowed {
				for k, n := range want {
					used[k] += n
				}
				granted++
			} else {
				denied++
			}
		}
		// What the limiters hold is what the model charged.
		for k, n := range used {
			var remaining int64
			if k[1] == "" {
				av, err := store.Available(ctx, k[0])
				if err != nil {
					t.Fatal(err)
				}
				remaining = av.Remaining
			} else {
				av, err := store.AvailableKey(ctx, k[0], k[1])
				if err != nil {
					t.Fatal(err)
				}
				remaining = av.Remaining
			}
			if remaining != limits[k[0]]-n {
				t.Errorf("seed %d: %v has %d left, want %d", seed, k, remaining, limits[k[0]]-n)
			}
		}
	}
	if denied < 100 || granted < 100 {
		t.Errorf("%d requests granted and %d denied: too few of one for the test to mean anything", granted, denied)
	}
}

// A path is matched as upstreams route it, however the client wrote it,
// or refused when they route it differently.
func TestRoutePath(t *testing.T) {
	for uri, want := range map[string]string{
		"/login":                     "/login",
		"/login?next=/admin":         "/login",
		"/%6Cogin":                   "/login",
		"/%6cogin/form":              "/login/form",
		"/%2561dmin/":                "/admin/", // decoded twice
		"/%61dmin/x%zz":              "/admin/x%zz",
		"/%zz/%61":                   "/%zz/a",
		"/100%":                      "/100%",
		"//login":                    "/login",
		`/admin\x`:                   "/admin/x",
		"/admin%5Cx":                 "/admin/x",
		"/admin;jsessionid=1/x":      "/admin/x",
		"/admin/;x":                  "/admin/",
		"/admin./x. ":                "/admin/x",
		"/api/":                      "/api/",
		"/api//v1/":                  "/api/v1/",
		"/Login":                     "/Login",
		"/":                          "/",
		"":                           "/",
		"login":                      "/login",
		"http://example.com/login?x": "/login",
		"https://example.com":        "/",
		"/a%2Fb":                     "/a/b",
		"/a#b":                       "/a#b",
	} {
		if got, err := RoutePath(uri); got != want || err != nil {
			t.Errorf("RoutePath(%q) = %q, %v; want %q", uri, got, err, want)
		}
	}
	for _, uri := range []string{
		"/x/../login", "/./login", "/%2e%2e/login", "/x/.%2E/login", "/x/%252e%252e/login",
		"/x/..;/login", "/x/.. /login", "/x/.../login", `/x\..\login`, "/admin/.",
		"/admin%00.html", "/a%0d%0ab", "/%25252525252561",
	} {
		if got, err := RoutePath(uri); !errors.Is(err, ErrPath) {
			t.Errorf("RoutePath(%q) = %q, %v; want ErrPath", uri, got, err)
		}
	}
}
