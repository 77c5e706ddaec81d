// Package forwardauth decides the requests a reverse proxy asks about
// before forwarding them (nginx auth_request, Traefik ForwardAuth, Caddy
// forward_auth, HAProxy): which limiters a request is charged against, by
// the rules of the configuration, and under which keys, the client's
// address among them, found so that no client can choose it (see
// ClientIP). A request becomes one decision of limiter.Service.Decide, all
// or nothing, as an Envoy descriptor or a call of the HTTP API does.
package forwardauth

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// KeyKind says what a rule keys its limiter by.
type KeyKind uint8

const (
	// ByClientIP keys a keyed limiter by the client's address: IPv4, or
	// IPv6 grouped by the per-IP tenants' prefix, as a tenant is.
	ByClientIP KeyKind = iota + 1
	// ByHeader keys a keyed limiter by the value of a request header (an
	// API key, a user id set by an earlier authentication step). A request
	// without the header is not matched by the rule.
	ByHeader
	// ByRoute charges a limiter that is not keyed: every request the rule
	// matches counts against it.
	ByRoute
)

// Rule charges Permits of Limiter for each request it matches: one whose
// host, path and method match (an empty field matches any), under the key
// Key says.
type Rule struct {
	Limiter string
	Key     KeyKind
	// Header is the header ByHeader reads, in canonical form.
	Header string
	// Host is a host name, matched without its port and case-insensitively,
	// or "*." and a domain, matching its subdomains (not the domain
	// itself).
	Host string
	// PathPrefix matches paths that start with it, cases ignored, as
	// upstreams route them (see RoutePath); it must be written so.
	PathPrefix string
	// Methods are upper-case HTTP methods, matched ignoring case and
	// surrounding spaces: Django and werkzeug upper-case a method before
	// routing it.
	Methods []string
	Permits int64
}

// Request is what a proxy tells of the request it asks about.
type Request struct {
	Method, Host, Path string
	// Client is the client's address (see ClientIP).
	Client netip.Addr
	// Header holds the headers of the original request.
	Header Header
}

// Header gives the first value of a header, or "", as http.Header does.
type Header interface {
	Get(name string) string
}

// MaxRules bounds the rules of a configuration; a request is matched
// against each, in order.
const MaxRules = limiter.MaxItems

// Config is what the forward-auth endpoint decides by.
type Config struct {
	Rules []Rule
	// DenyUnmatched denies a request that no rule matches; otherwise it is
	// allowed.
	DenyUnmatched bool
	// DenyStatus is the HTTP status of a denial: 429, or 403 for nginx,
	// whose auth_request turns any other into a 500.
	DenyStatus int
	// IPv6Prefix groups IPv6 clients, as the per-IP tenants do.
	IPv6Prefix int
	// ClientIP finds the client's address.
	ClientIP ClientIP
}

// Check reports why c cannot be used with the limiters defs, by name:
// every rule must name one of them, keyed as its key needs, and the
// limiters of all the rules must share a group when there are several,
// so that a request's limits are decided together.
func (c Config) Check(defs map[string]limiter.Definition) error {
	if len(c.Rules) > MaxRules {
		return fmt.Errorf("forward_auth: %d rules, at most %d", len(c.Rules), MaxRules)
	}
	if c.DenyStatus != 429 && c.DenyStatus != 403 {
		return fmt.Errorf("forward_auth: deny_status must be 429 or 403, got %d", c.DenyStatus)
	}
	group, first := "", ""
	for i, r := range c.Rules {
		def, ok := defs[r.Limiter]
		switch {
		case !ok:
			return fmt.Errorf("forward_auth: rule %d: no limiter %q in the configuration", i+1, r.Limiter)
		case r.Key == ByRoute && def.Keyed:
			return fmt.Errorf("forward_auth: rule %d: limiter %q is keyed: key it by client_ip or a header", i+1, r.Limiter)
		case r.Key != ByRoute && !def.Keyed:
			return fmt.Errorf("forward_auth: rule %d: limiter %q is not keyed: key it by route, or make it keyed", i+1, r.Limiter)
		case r.Permits < 1 || r.Permits > capacity(def.Policy):
			return fmt.Errorf("forward_auth: rule %d: permits must be between 1 and what limiter %q can ever hold, %d, got %d", i+1, r.Limiter, capacity(def.Policy), r.Permits)
		case r.Key == ByHeader && r.Header == "":
			return fmt.Errorf("forward_auth: rule %d: no header to key by", i+1)
		case r.Host != "" && strings.Contains(strings.TrimPrefix(r.Host, "*."), "*"):
			return fmt.Errorf("forward_auth: rule %d: host %q: a wildcard only as a leading \"*.\"", i+1, r.Host)
		}
		if r.PathPrefix != "" {
			// A path is matched as upstreams route it: a prefix written
			// otherwise would never match.
			if err := checkPrefix(r.PathPrefix); err != nil {
				return fmt.Errorf("forward_auth: rule %d: %w", i+1, err)
			}
		}
		for _, m := range r.Methods {
			if m == "" || strings.ToUpper(m) != m || strings.ContainsAny(m, " \t/") {
				return fmt.Errorf("forward_auth: rule %d: method %q must be an upper-case token such as GET", i+1, m)
			}
		}
		if first == "" {
			group, first = def.Group, r.Limiter
		} else if r.Limiter != first && (def.Group == "" || def.Group != group) {
			return fmt.Errorf("forward_auth: rule %d: limiter %q must share a group with limiter %q of an earlier rule, so that a request's limits are decided together", i+1, r.Limiter, first)
		}
	}
	if _, err := tenant.Normalize("2001:db8::1", c.IPv6Prefix); err != nil {
		return fmt.Errorf("forward_auth: %w", err)
	}
	return c.ClientIP.Check()
}

// capacity is the most permits one decision under p can take.
func capacity(p limiter.Policy) int64 {
	if p = p.Normalize(); p.Algorithm == limiter.GCRA {
		return p.Burst
	}
	return p.Limit
}

// ErrNoClient reports a request whose client has no usable address for a
// rule keyed by it: the unspecified or a multicast address.
var ErrNoClient = errors.New("forwardauth: no usable client address")

// Items returns what req is charged: one item per rule it matches, in rule
// order (empty when it matches none). The error wraps ErrNoClient, or
// ErrPath when some rule has a PathPrefix and req's path is refused (see
// RoutePath).
func (c Config) Items(req Request) ([]limiter.Item, error) {
	var items []limiter.Item
	host, method := hostOnly(req.Host), strings.TrimSpace(req.Method)
	path, routed := "", false
	client := ""
	for _, r := range c.Rules {
		if r.PathPrefix != "" && !routed {
			p, err := RoutePath(req.Path)
			if err != nil {
				return nil, err
			}
			path, routed = p, true
		}
		if !r.matches(method, host, path) {
			continue
		}
		it := limiter.Item{Name: r.Limiter, Permits: r.Permits}
		switch r.Key {
		case ByClientIP:
			if client == "" {
				k, err := tenant.NormalizeAddr(req.Client, c.IPv6Prefix)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", ErrNoClient, err)
				}
				client = k
			}
			it.Key = client
		case ByHeader:
			v := req.Header.Get(r.Header)
			if v == "" {
				continue
			}
			it.Key = headerKey(v)
		}
		items = append(items, it)
	}
	return items, nil
}

func (r Rule) matches(method, host, path string) bool {
	if len(r.Methods) > 0 && !slices.ContainsFunc(r.Methods, func(m string) bool { return strings.EqualFold(m, method) }) {
		return false
	}
	if !hasPrefixFold(path, r.PathPrefix) {
		return false
	}
	switch {
	case r.Host == "":
		return true
	case strings.HasPrefix(r.Host, "*."):
		d := r.Host[1:] // ".example.com"
		return len(host) > len(d) && strings.EqualFold(host[len(host)-len(d):], d)
	}
	return strings.EqualFold(host, r.Host)
}

// hostOnly is host without its port, IPv6 literals without their brackets
// kept bracketed as a Host header writes them.
func hostOnly(host string) string {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		return host[:i]
	}
	return host
}

// headerKey is the key of a header's value: itself when it is a valid key
// that does not start with '#', otherwise its digest.
func headerKey(v string) string {
	if !strings.HasPrefix(v, "#") && limiter.CheckKey(v) == nil {
		return v
	}
	return limiter.DigestKey(v)
}
