package helmtest

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
)

// TestForwardAuth checks that config.forward_auth reaches the service's
// configuration file and forwardAuth its client-address settings, by
// loading what the chart renders with the service's own loader; that no
// rules write no forward_auth section (which the service would refuse);
// and that the schema refuses what the service would.
func TestForwardAuth(t *testing.T) {
	t.Parallel()
	const limiters = `config:
  limiters:
    - {name: per-ip, limit: 5, period: 1m, keyed: true, group: edge}
    - {name: per-key, limit: 1000, period: 1h, keyed: true, group: edge}
    - {name: login, limit: 3, period: 1m, keyed: true, group: edge}
`
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		m := render(t, valueSet{name: "defaults"})
		if strings.Contains(m.ConfigMap.Data["config.yaml"], "forward_auth") {
			t.Errorf("config file without rules:\n%s\nwant no forward_auth section", m.ConfigMap.Data["config.yaml"])
		}
		cfg, _ := serviceConfig(t, m)
		if cfg.ForwardAuth != nil {
			t.Errorf("forward-auth configuration without rules: got %+v, want none", cfg.ForwardAuth)
		}
		if c := cfg.ClientIP; len(c.Trusted) != 0 || c.Hops != 0 || c.Header != forwardauth.XForwardedFor {
			t.Errorf("client address by default: got %+v, want only the peer, by X-Forwarded-For", c)
		}
	})
	t.Run("rules behind an ingress", func(t *testing.T) {
		t.Parallel()
		m := render(t, valueSet{name: "rules", extra: limiters + `  forward_auth:
    deny_status: 403
    unmatched: deny
    rules:
      - {limiter: per-ip, key: client_ip}
      - {limiter: per-key, key: "header:x-api-key", path_prefix: /api/, host: "*.example.com"}
      - {limiter: login, key: client_ip, path_prefix: /login, methods: [POST, PUT], permits: 2}
forwardAuth:
  trustedProxies: [10.0.0.0/8, "fd00::/8"]
  forwardedHeader: forwarded
`})
		cfg, _ := serviceConfig(t, m)
		fa := cfg.ForwardAuth
		if fa == nil {
			t.Fatalf("the service loads no forward-auth rules from:\n%s", m.ConfigMap.Data["config.yaml"])
		}
		if fa.DenyStatus != 403 || !fa.DenyUnmatched {
			t.Errorf("deny status and unmatched: got %d and %v, want 403 and deny", fa.DenyStatus, fa.DenyUnmatched)
		}
		want := []forwardauth.Rule{
			{Limiter: "per-ip", Key: forwardauth.ByClientIP, Permits: 1},
			{Limiter: "per-key", Key: forwardauth.ByHeader, Header: "X-Api-Key", Host: "*.example.com", PathPrefix: "/api/", Permits: 1},
			{Limiter: "login", Key: forwardauth.ByClientIP, PathPrefix: "/login", Methods: []string{"POST", "PUT"}, Permits: 2},
		}
		if !slices.EqualFunc(fa.Rules, want, func(a, b forwardauth.Rule) bool {
			return a.Limiter == b.Limiter && a.Key == b.Key && a.Header == b.Header && a.Host == b.Host &&
				a.PathPrefix == b.PathPrefix && slices.Equal(a.Methods, b.Methods) && a.Permits == b.Permits
		}) {
			t.Errorf("rules: got %+v, want %+v", fa.Rules, want)
		}
		wantTrusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
		if c := fa.ClientIP; !slices.Equal(c.Trusted, wantTrusted) || c.Hops != 0 || c.Header != forwardauth.Forwarded {
			t.Errorf("client address: got %+v, want trusted %v by Forwarded", c, wantTrusted)
		}
	})
	t.Run("hops", func(t *testing.T) {
		t.Parallel()
		cfg, _ := serviceConfig(t, render(t, valueSet{name: "hops", extra: "forwardAuth: {trustedHops: 2}\n"}))
		if c := cfg.ClientIP; c.Hops != 2 || len(c.Trusted) != 0 {
			t.Errorf("client address: got %+v, want 2 hops", c)
		}
	})

	for _, tt := range []struct {
		name, values string
		want         []string
	}{
		{"deny status 500", "config: {forward_auth: {deny_status: 500}}\n", []string{"at '/config/forward_auth/deny_status'", "value must be one of 429, 403"}},
		{"unmatched pass", "config: {forward_auth: {unmatched: pass}}\n", []string{"at '/config/forward_auth/unmatched'", "value must be one of 'allow', 'deny'"}},
		{"rule without a key", limiters + "  forward_auth: {rules: [{limiter: per-ip}]}\n", []string{"at '/config/forward_auth/rules/0'", "missing property 'key'"}},
		{"rule keyed by a cookie", limiters + "  forward_auth: {rules: [{limiter: per-ip, key: 'cookie:id'}]}\n", []string{"at '/config/forward_auth/rules/0/key'", "does not match pattern"}},
		{"rule with a relative path", limiters + "  forward_auth: {rules: [{limiter: per-ip, key: client_ip, path_prefix: api}]}\n", []string{"at '/config/forward_auth/rules/0/path_prefix'", "does not match pattern"}},
		{"rule with an unknown field", limiters + "  forward_auth: {rules: [{limiter: per-ip, key: client_ip, path: /}]}\n", []string{"at '/config/forward_auth/rules/0'", "'path' not allowed"}},
		{"proxies and hops", "forwardAuth: {trustedProxies: [10.0.0.0/8], trustedHops: 1}\n", []string{"at '/forwardAuth'", "'not' failed"}},
		{"a proxy without a prefix length", "forwardAuth: {trustedProxies: [10.0.0.1]}\n", []string{"at '/forwardAuth/trustedProxies/0'", "does not match pattern"}},
		{"too many hops", "forwardAuth: {trustedHops: 33}\n", []string{"at '/forwardAuth/trustedHops'", "maximum: got 33, want 32"}},
		{"unknown header", "forwardAuth: {forwardedHeader: x-real-ip}\n", []string{"at '/forwardAuth/forwardedHeader'", "value must be one of"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg := mustFail(t, valueSet{name: tt.name, extra: tt.values})
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}
