package config

import (
	"fmt"
	"math"
	"net/http"
	"os"
	"strings"

	"github.com/goccy/go-yaml"

	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// maxFileBytes bounds the config file read, far above any real one.
const maxFileBytes = 16 << 20

// file is the config file's schema; see the package documentation.
type file struct {
	Limiters    []fileLimiter    `yaml:"limiters"`
	Tenants     fileTenants      `yaml:"tenants"`
	ForwardAuth *fileForwardAuth `yaml:"forward_auth"`
}

// fileForwardAuth is the forward_auth section: the rules of the endpoint
// proxies ask (see forwardauth.Config).
type fileForwardAuth struct {
	DenyStatus *int       `yaml:"deny_status"`
	Unmatched  string     `yaml:"unmatched"`
	Rules      []fileRule `yaml:"rules"`
}

// fileRule is one rule of the forward_auth section. Permits is a pointer
// so that 0 written is refused rather than read as left out.
type fileRule struct {
	Limiter    string   `yaml:"limiter"`
	Key        string   `yaml:"key"`
	Host       string   `yaml:"host"`
	PathPrefix string   `yaml:"path_prefix"`
	Methods    []string `yaml:"methods"`
	Permits    *int64   `yaml:"permits"`
}

// forwardAuth returns the forward_auth section as a configuration, before
// its check against the limiters; path names the file in errors.
func (f *fileForwardAuth) forwardAuth(path string) (*forwardauth.Config, error) {
	if f == nil {
		return nil, nil
	}
	c := &forwardauth.Config{DenyStatus: 429}
	if f.DenyStatus != nil {
		c.DenyStatus = *f.DenyStatus
	}
	switch f.Unmatched {
	case "", "allow":
	case "deny":
		c.DenyUnmatched = true
	default:
		return nil, fmt.Errorf("config: config file %s: forward_auth: unmatched must be allow or deny, got %q", path, f.Unmatched)
	}
	if len(f.Rules) == 0 {
		return nil, fmt.Errorf("config: config file %s: forward_auth: no rules", path)
	}
	for i, r := range f.Rules {
		rule := forwardauth.Rule{Limiter: r.Limiter, Host: r.Host, PathPrefix: r.PathPrefix, Methods: r.Methods, Permits: 1}
		if r.Permits != nil {
			rule.Permits = *r.Permits
		}
		switch name, header, _ := strings.Cut(r.Key, ":"); {
		case r.Key == "client_ip":
			rule.Key = forwardauth.ByClientIP
		case r.Key == "route":
			rule.Key = forwardauth.ByRoute
		case name == "header" && header != "" && validHeaderName(header):
			rule.Key, rule.Header = forwardauth.ByHeader, http.CanonicalHeaderKey(header)
		default:
			return nil, fmt.Errorf("config: config file %s: forward_auth: rule %d: key must be client_ip, route or header:<name>, got %q", path, i+1, r.Key)
		}
		c.Rules = append(c.Rules, rule)
	}
	return c, nil
}

// validHeaderName reports whether h is an HTTP field name: a token.
func validHeaderName(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return h != ""
}

// fileLimiter is one entry of the limiters section. Group is a pointer so
// that a group written empty is refused, as the API refuses it, rather than
// read as left out. MaxKeys is decoded as it is written, nil when left out,
// and checked by definitions: the decoder would read 1.5 as 1 and '3' as 3
// into an integer.
type fileLimiter struct {
	Name      string  `yaml:"name"`
	Limit     int64   `yaml:"limit"`
	Period    string  `yaml:"period"`
	Algorithm string  `yaml:"algorithm"`
	Burst     int64   `yaml:"burst"`
	Group     *string `yaml:"group"`
	Keyed     bool    `yaml:"keyed"`
	MaxKeys   any     `yaml:"max_keys"`
}

// fileTenants holds pointers so that a key left out keeps the lower
// precedence value, while a key written as 0 is checked like any value.
type fileTenants struct {
	Limit      *int64  `yaml:"limit"`
	Period     *string `yaml:"period"`
	Algorithm  *string `yaml:"algorithm"`
	Burst      *int64  `yaml:"burst"`
	IPv6Prefix *int64  `yaml:"ipv6_prefix"`
	MaxTenants *int64  `yaml:"max_tenants"`
	MaxBytes   *string `yaml:"max_bytes"` // a number of bytes, or with a KiB, MiB or GiB suffix
}

// readFile reads and strictly decodes the config file at path.
func readFile(path string) (file, error) {
	info, err := os.Stat(path)
	if err != nil {
		return file{}, fmt.Errorf("config: config file: %w", err)
	}
	if !info.Mode().IsRegular() || info.Size() > maxFileBytes {
		return file{}, fmt.Errorf("config: config file %s: not a regular file of at most %d bytes", path, maxFileBytes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return file{}, fmt.Errorf("config: config file: %w", err)
	}
	var f file
	if err := yaml.UnmarshalWithOptions(data, &f, yaml.Strict()); err != nil {
		// The formatted error points at the line and column, with the
		// surrounding lines of the file.
		return file{}, fmt.Errorf("config: config file %s:\n%s", path, strings.TrimRight(yaml.FormatError(err, false, true), "\n"))
	}
	return f, nil
}

// values returns the tenants section as setting values keyed by their file
// key, the way their flags would carry them.
func (t fileTenants) values() map[string]string {
	v := make(map[string]string)
	if t.Limit != nil {
		v["tenants.limit"] = itoa(*t.Limit)
	}
	if t.Period != nil {
		v["tenants.period"] = *t.Period
	}
	if t.Algorithm != nil {
		v["tenants.algorithm"] = *t.Algorithm
	}
	if t.Burst != nil {
		v["tenants.burst"] = itoa(*t.Burst)
	}
	if t.IPv6Prefix != nil {
		v["tenants.ipv6_prefix"] = itoa(*t.IPv6Prefix)
	}
	if t.MaxTenants != nil {
		v["tenants.max_tenants"] = itoa(*t.MaxTenants)
	}
	if t.MaxBytes != nil {
		v["tenants.max_bytes"] = *t.MaxBytes
	}
	return v
}

// definitions checks the limiters section of the file at path and returns its
// definitions, normalized (see limiter.Definition.Normalize), by the rules
// of PUT /v1/limiters/{name}.
func (f file) definitions(path string) ([]limiter.Definition, error) {
	defs := make([]limiter.Definition, 0, len(f.Limiters))
	first := make(map[string]int, len(f.Limiters))
	for i, l := range f.Limiters {
		invalid := func(err error) error {
			if l.Name == "" {
				return fmt.Errorf("config: config file %s: limiters[%d]: %w", path, i, err)
			}
			return fmt.Errorf("config: config file %s: limiters[%d] (%s): %w", path, i, l.Name, err)
		}
		if l.Name == "" {
			return nil, invalid(fmt.Errorf("name is required"))
		}
		if err := limiter.CheckName(l.Name); err != nil {
			return nil, invalid(err)
		}
		if j, dup := first[l.Name]; dup {
			return nil, invalid(fmt.Errorf("duplicate name %q, first declared at limiters[%d]", l.Name, j))
		}
		first[l.Name] = i
		if l.Limit == 0 {
			return nil, invalid(fmt.Errorf("limit is required"))
		}
		if l.Period == "" {
			return nil, invalid(fmt.Errorf("period is required, such as 1s, 1m or 1h"))
		}
		period, err := limiter.ParsePeriod(l.Period)
		if err != nil {
			return nil, invalid(err)
		}
		p := limiter.Policy{Limit: l.Limit, Period: period, Burst: l.Burst}
		if l.Algorithm != "" {
			if p.Algorithm, err = algorithm(l.Algorithm); err != nil {
				return nil, invalid(err)
			}
		}
		if err := p.Validate(); err != nil {
			return nil, invalid(err)
		}
		def := limiter.Definition{Name: l.Name, Policy: p, Keyed: l.Keyed}
		if l.Group != nil {
			if *l.Group == "" {
				return nil, invalid(fmt.Errorf("%w: group is empty; leave it out for a limiter in no group", limiter.ErrInvalidGroup))
			}
			if err := limiter.CheckGroup(*l.Group); err != nil {
				return nil, invalid(err)
			}
			def.Group = *l.Group
		}
		if l.MaxKeys != nil {
			n, err := checkMaxKeys(l.Keyed, l.MaxKeys)
			if err != nil {
				return nil, invalid(err)
			}
			def.MaxKeys = n
		}
		defs = append(defs, def.Normalize())
	}
	return defs, nil
}

// checkMaxKeys checks a max_keys written in the file, v as decoded, by the
// rules of limiter.CheckKeyed and in its words, except that 0 is refused
// too: in the file, as in the API, the default is had by leaving the key
// out.
func checkMaxKeys(keyed bool, v any) (int, error) {
	if !keyed {
		return 0, fmt.Errorf("%w: max_keys applies to keyed limiters only", limiter.ErrInvalidPolicy)
	}
	var n int64
	switch v := v.(type) {
	case int64:
		n = v
	case uint64:
		n = int64(min(v, math.MaxInt64))
	default:
		return 0, fmt.Errorf("%w: max_keys must be an integer, got %v", limiter.ErrInvalidPolicy, yamlText(v))
	}
	if n < 1 || n > limiter.MaxMaxKeys {
		return 0, fmt.Errorf("%w: max_keys must be between 1 and %d, got %s", limiter.ErrInvalidPolicy, limiter.MaxMaxKeys, yamlText(v))
	}
	return int(n), nil
}

// yamlText writes a decoded YAML value back as YAML, on one line.
func yamlText(v any) string {
	b, err := yaml.MarshalWithOptions(v, yaml.Flow(true))
	if err != nil {
		return fmt.Sprint(v)
	}
	return strings.TrimSpace(string(b))
}
