// Package rls serves Envoy's rate limit service protocol
// (envoy.service.ratelimit.v3.RateLimitService) from envoyproxy/ratelimit's
// configuration files.
//
// A file declares a domain and a tree of descriptors; each descriptor that
// carries a rate_limit is a Rule. A Rule is decided by a keyed limiter of
// the service: one limiter per rule, one key per distinct set of values
// the rule counts (see Key), every limiter of a domain in one group. A
// request's descriptors thus become the items of one joint decision,
// exactly as a POST /v1/decide of the same items would be.
package rls

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Unit is a rate limit's unit of time, as the protocol numbers it.
type Unit int32

// The units, numbered as RateLimitResponse.RateLimit.Unit numbers them.
const (
	Second Unit = 1
	Minute Unit = 2
	Hour   Unit = 3
	Day    Unit = 4
	Month  Unit = 5
	Year   Unit = 6
	Week   Unit = 7
)

var unitNames = map[string]Unit{
	"SECOND": Second, "MINUTE": Minute, "HOUR": Hour, "DAY": Day,
	"WEEK": Week, "MONTH": Month, "YEAR": Year,
}

// Period is the length of a unit, as envoyproxy/ratelimit counts it: a
// month is 30 days and a year 365.
func (u Unit) Period() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

// DefaultMaxKeys is the bound of keys of a rule that counts per value and
// sets no max_keys. A rule whose values are all fixed counts one key.
const DefaultMaxKeys = 10_000

// MaxFileBytes bounds one configuration file.
const MaxFileBytes = 4 << 20

// Rule is a descriptor of the configuration that carries a rate_limit.
type Rule struct {
	// Domain is the domain the rule belongs to.
	Domain string
	// Path is the rule's place in the tree, as envoyproxy/ratelimit names
	// it in its statistics: the domain, then each level's key, or
	// key_value when the level fixes a value, separated by dots.
	Path string
	// Name, Replaces: the rate_limit's name, and the names of the rules it
	// replaces in a request that matches both.
	Name     string
	Replaces []string
	// Unit and RequestsPerUnit are the limit, as configured; a limit that
	// a request sets may also have a Multiplier of its unit (0 or 1: one).
	Unit            Unit
	Multiplier      uint32
	RequestsPerUnit uint32
	// Unlimited rules limit nothing; a limit of 0 denies every hit; the
	// others are decided by Limiter.
	Unlimited bool
	// ShadowMode rules are decided and reported, but never deny; only an
	// allowed request charges them.
	ShadowMode bool
	// QuotaMode rules deny a request only when every quota rule it
	// matches is over its limit.
	QuotaMode bool
	// DetailedMetric labels the rule's metrics with the request's values.
	DetailedMetric bool
	// Limiter is the keyed limiter that decides the rule; its Name is
	// empty for an unlimited rule or a limit of 0.
	Limiter limiter.Definition

	// override tells a limit set by a request (see Service.override).
	override bool
}

// period is the length of the rule's period: Multiplier units.
func (r *Rule) period() time.Duration {
	return time.Duration(max(1, r.Multiplier)) * r.Unit.Period()
}

// Config is a loaded configuration: its domains and their rules. It is
// read-only once loaded.
type Config struct {
	domains map[string]*node
	// Rules are every rule, by file and then in the order of the file.
	Rules []*Rule
	// Digest sums up the files the configuration was loaded from, as
	// Digest(path) does; empty for one from Parse.
	Digest string
}

// node is one level of a domain's tree.
type node struct {
	children  map[string]*node // by key, or key_value
	wildcards []wildcard       // children whose key_value holds a '*', in file order
	rule      *Rule
	share     string // the value pattern of a share_threshold wildcard level
}

// wildcard is a child whose key_value is a pattern: '*' matches any run of
// characters, empty or not.
type wildcard struct {
	key   string   // key_value, the child's key in children
	parts []string // key split at each '*'
}

// match reports whether key_value s matches the pattern.
func (w wildcard) match(s string) bool {
	p := w.parts
	if !strings.HasPrefix(s, p[0]) {
		return false
	}
	s = s[len(p[0]):]
	last := p[len(p)-1]
	for _, mid := range p[1 : len(p)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return strings.HasSuffix(s, last)
}

// The YAML of a file, as envoyproxy/ratelimit reads it, with this
// service's extensions in rate_limit.
type (
	yamlRoot struct {
		Domain      string           `yaml:"domain"`
		Descriptors []yamlDescriptor `yaml:"descriptors"`
	}
	yamlDescriptor struct {
		Key            string           `yaml:"key"`
		Value          string           `yaml:"value"`
		RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
		Descriptors    []yamlDescriptor `yaml:"descriptors"`
		ShadowMode     bool             `yaml:"shadow_mode"`
		QuotaMode      bool             `yaml:"quota_mode"`
		DetailedMetric bool             `yaml:"detailed_metric"`
		ValueToMetric  bool             `yaml:"value_to_metric"`
		ShareThreshold bool             `yaml:"share_threshold"`
		Metadata       map[string]any   `yaml:"metadata"`
	}
	yamlRateLimit struct {
		RequestsPerUnit *int64 `yaml:"requests_per_unit"`
		Unit            string `yaml:"unit"`
		Unlimited       bool   `yaml:"unlimited"`
		Name            string `yaml:"name"`
		Replaces        []struct {
			Name string `yaml:"name"`
		} `yaml:"replaces"`
		// Extensions: none of them changes what a file without them means.
		Algorithm string `yaml:"algorithm"`
		Burst     *int64 `yaml:"burst"`
		MaxKeys   *int   `yaml:"max_keys"`
	}
)

// Load reads the configuration at path: one YAML file, or every *.yaml
// file of a directory (not its subdirectories), in name order. A file
// holds one domain per YAML document. It refuses the whole configuration
// at its first error, with the file and line.
func Load(path string) (*Config, error) {
	files, err := read(path)
	if err != nil {
		return nil, err
	}
	c := &Config{domains: make(map[string]*node), Digest: sum(files)}
	for _, f := range files {
		if err := c.add(f.name, f.data); err != nil {
			return nil, err
		}
	}
	if err := c.checkKeys(); err != nil {
		return nil, err
	}
	return c, nil
}

// Digest sums up the files of the configuration at path as they are now:
// their names and contents. It equals the Digest of the configuration
// Load would read from them, and differs once a file is added, removed or
// changed, however quickly and whatever its modification time.
func Digest(path string) (string, error) {
	files, err := read(path)
	if err != nil {
		return "", err
	}
	return sum(files), nil
}

// file is one file of a configuration, as read.
type file struct {
	name string
	data []byte
}

// read reads the files of the configuration at path (see Files).
func read(path string) ([]file, error) {
	names, err := Files(path)
	if err != nil {
		return nil, err
	}
	files := make([]file, len(names))
	for i, name := range names {
		data, err := readFile(name)
		if err != nil {
			return nil, err
		}
		files[i] = file{name, data}
	}
	return files, nil
}

// sum sums up files, each one's name and content preceded by its
// length so that no two sets of files sum alike.
func sum(files []file) string {
	d := sha256.New()
	var n [8]byte
	for _, f := range files {
		binary.BigEndian.PutUint64(n[:], uint64(len(f.name)))
		d.Write(n[:])
		d.Write([]byte(f.name))
		binary.BigEndian.PutUint64(n[:], uint64(len(f.data)))
		d.Write(n[:])
		d.Write(f.data)
	}
	return hex.EncodeToString(d.Sum(nil))
}

// Files returns the files of the configuration at path: path itself, or
// the *.yaml files of the directory path, in name order (links followed,
// as a Kubernetes ConfigMap volume needs).
func Files(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".yaml") {
			files = append(files, filepath.Join(path, e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no *.yaml file", path)
	}
	return files, nil
}

// Parse reads one file's content, named name in errors.
func Parse(name string, data []byte) (*Config, error) {
	c := &Config{domains: make(map[string]*node)}
	if err := c.add(name, data); err != nil {
		return nil, err
	}
	if err := c.checkKeys(); err != nil {
		return nil, err
	}
	return c, nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, MaxFileBytes)
	}
	return data, nil
}

// add loads the domains of one file.
func (c *Config) add(name string, data []byte) error {
	file, err := parser.ParseBytes(data, 0)
	if err != nil {
		return fmt.Errorf("%s:\n%s", name, strings.TrimRight(yaml.FormatError(err, false, true), "\n"))
	}
	domains := 0
	for _, doc := range file.Docs {
		if doc.Body == nil {
			continue // an empty document, as before a leading ---
		}
		domains++
		var root yamlRoot
		if err := yaml.NodeToValue(doc.Body, &root, yaml.Strict()); err != nil {
			return fmt.Errorf("%s:\n%s", name, strings.TrimRight(yaml.FormatError(err, false, true), "\n"))
		}
		at := func(path string) string { return where(name, doc, path) }
		if root.Domain == "" {
			return fmt.Errorf("%s: the domain is empty", at("$"))
		}
		if _, dup := c.domains[root.Domain]; dup {
			return fmt.Errorf("%s: domain %q is declared twice", at("$.domain"), root.Domain)
		}
		top := &node{children: make(map[string]*node)}
		c.domains[root.Domain] = top
		if err := c.load(at, root.Domain, top, root.Domain, "$.descriptors", true, root.Descriptors); err != nil {
			return err
		}
	}
	if domains == 0 {
		// An empty file is a mistake, not a configuration without rules:
		// envoyproxy/ratelimit refuses it too (its domain is empty).
		return fmt.Errorf("%s: declares no domain", name)
	}
	return nil
}

// where names the place of the YAML path in a document: the file and the
// line.
func where(name string, doc *ast.DocumentNode, path string) string {
	p, err := yaml.PathString(path)
	if err != nil {
		return name
	}
	n, err := p.FilterNode(doc.Body)
	if err != nil || n == nil || n.GetToken() == nil {
		return name
	}
	return fmt.Sprintf("%s:%d", name, n.GetToken().Position.Line)
}

// load adds the descriptors ds, found at the YAML path at, under parent,
// whose statistics name is prefix. fixed tells whether every level above
// fixes its value.
func (c *Config) load(at func(string) string, domain string, parent *node, prefix, path string, fixed bool, ds []yamlDescriptor) error {
	for i, d := range ds {
		here := fmt.Sprintf("%s[%d]", path, i)
		if d.Key == "" {
			return fmt.Errorf("%s: a descriptor has an empty key", at(here))
		}
		key := d.Key
		if d.Value != "" {
			key += "_" + d.Value
		}
		full := prefix + "." + key
		if _, dup := parent.children[key]; dup {
			return fmt.Errorf("%s: descriptor %s is declared twice", at(here+".key"), full)
		}
		n := &node{children: make(map[string]*node)}
		if d.ShareThreshold {
			if !strings.Contains(key, "*") {
				return fmt.Errorf("%s: share_threshold needs a wildcard value (one holding '*'), and %s has none", at(here+".share_threshold"), full)
			}
			n.share = d.Value
		}
		// A level fixes its value when it names one without a wildcard.
		fixed := fixed && d.Value != "" && !strings.Contains(d.Value, "*")
		if d.RateLimit != nil {
			r, err := newRule(at, here+".rate_limit", domain, full, fixed, d)
			if err != nil {
				return err
			}
			n.rule = r
			c.Rules = append(c.Rules, r)
		}
		if strings.Contains(key, "*") {
			parent.wildcards = append(parent.wildcards, wildcard{key: key, parts: strings.Split(key, "*")})
		}
		parent.children[key] = n
		if err := c.load(at, domain, n, full, here+".descriptors", fixed, d.Descriptors); err != nil {
			return err
		}
	}
	return nil
}

// newRule reads the rate_limit of descriptor d, at the YAML path here;
// fixed tells whether every level of its path fixes a value, so that the
// rule counts one key.
func newRule(at func(string) string, here, domain, full string, fixed bool, d yamlDescriptor) (*Rule, error) {
	rl := d.RateLimit
	r := &Rule{
		Domain: domain, Path: full, Name: rl.Name, Unlimited: rl.Unlimited,
		ShadowMode: d.ShadowMode, QuotaMode: d.QuotaMode, DetailedMetric: d.DetailedMetric,
	}
	unit, known := unitNames[strings.ToUpper(rl.Unit)]
	switch {
	case rl.Unlimited && known:
		return nil, fmt.Errorf("%s: an unlimited rate_limit takes no unit", at(here+".unit"))
	case rl.Unlimited:
		if rl.RequestsPerUnit != nil || rl.Algorithm != "" || rl.Burst != nil || rl.MaxKeys != nil {
			return nil, fmt.Errorf("%s: an unlimited rate_limit takes no requests_per_unit, algorithm, burst or max_keys", at(here))
		}
	case !known:
		return nil, fmt.Errorf("%s: invalid rate limit unit %q: want second, minute, hour, day, week, month or year", at(here+".unit"), rl.Unit)
	}
	r.Unit = unit
	for i, rep := range rl.Replaces {
		switch rep.Name {
		case "":
			return nil, fmt.Errorf("%s: a replaces entry has no name", at(fmt.Sprintf("%s.replaces[%d]", here, i)))
		case rl.Name:
			return nil, fmt.Errorf("%s: a rate_limit cannot replace itself (%q)", at(fmt.Sprintf("%s.replaces[%d]", here, i)), rep.Name)
		}
		r.Replaces = append(r.Replaces, rep.Name)
	}
	if rl.Unlimited {
		return r, nil
	}
	if rl.RequestsPerUnit != nil {
		if n := *rl.RequestsPerUnit; n < 0 || n > 1<<32-1 {
			return nil, fmt.Errorf("%s: requests_per_unit must be from 0 to 4294967295", at(here+".requests_per_unit"))
		}
		r.RequestsPerUnit = uint32(*rl.RequestsPerUnit)
	}
	if r.RequestsPerUnit == 0 {
		if rl.Algorithm != "" || rl.Burst != nil || rl.MaxKeys != nil {
			return nil, fmt.Errorf("%s: a limit of 0 denies every hit and takes no algorithm, burst or max_keys", at(here))
		}
		return r, nil
	}
	p := limiter.Policy{Limit: int64(r.RequestsPerUnit), Period: unit.Period(), Algorithm: limiter.Algorithm(rl.Algorithm)}
	if rl.Burst != nil {
		p.Burst = *rl.Burst
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %v", at(here), err)
	}
	maxKeys := DefaultMaxKeys
	switch {
	case rl.MaxKeys != nil:
		maxKeys = *rl.MaxKeys
	case fixed:
		maxKeys = 1
	}
	r.Limiter = limiter.Definition{
		Name: limiterName(domain, full), Group: groupName(domain),
		Policy: p.Normalize(), Keyed: true, MaxKeys: maxKeys,
	}
	if err := limiter.CheckKeyed(r.Limiter); err != nil {
		return nil, fmt.Errorf("%s: %v", at(here+".max_keys"), err)
	}
	return r, nil
}

// checkKeys refuses a configuration whose limiters would hold more keys
// than the keyed limiters may hold together (limiter.KeyBudget).
func (c *Config) checkKeys() error {
	total := 0
	for _, r := range c.Rules {
		total += r.Limiter.MaxKeys
	}
	if total > limiter.KeyBudget {
		return fmt.Errorf("the rules' limiters would hold up to %d keys together (max_keys: %d for a rule that counts per value and sets none, 1 for one whose values are all fixed), more than the %d keys the keyed limiters may hold; lower max_keys", total, DefaultMaxKeys, limiter.KeyBudget)
	}
	return nil
}

// known reports whether domain is one of the configuration's.
func (c *Config) known(domain string) bool {
	if c == nil {
		return false
	}
	_, ok := c.domains[domain]
	return ok
}

// Domains returns the names of the configuration's domains, sorted; none
// for a nil Config.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Limiters returns the definitions of the rules' limiters, in rule order;
// none for a nil Config.
func (c *Config) Limiters() []limiter.Definition {
	if c == nil {
		return nil
	}
	var out []limiter.Definition
	for _, r := range c.Rules {
		if r.Limiter.Name != "" {
			out = append(out, r.Limiter)
		}
	}
	return out
}

// groupName is the group of a domain's limiters: a name by the rule of
// limiter names, readable and unique to the domain.
func groupName(domain string) string {
	return "envoy." + readable(domain, 40) + "." + digest(domain)
}

// limiterName is the name of the limiter of the rule at full.
func limiterName(domain, full string) string {
	return "envoy." + readable(full, 80) + "." + digest(domain+"\x00"+full)
}

// overrideName is the name of the limiter of a limit set by a request,
// at full (see Service.override): apart from the rules' (see Sweep).
func overrideName(domain, full string) string {
	return OverridePrefix + readable(full, 80) + "." + digest(domain+"\x00"+full)
}

// readable keeps the letters, digits, '.', '_' and '-' of s, at most n of
// them, so that a name says what it is for; the digest makes it unique.
func readable(s string, n int) string {
	b := make([]byte, 0, min(len(s), n))
	for i := 0; i < len(s) && len(b) < n; i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' {
			b = append(b, c)
		} else {
			b = append(b, '_')
		}
	}
	return string(b)
}

// digest is 12 hex digits of the SHA-256 of s.
func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}
