package rls

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// envoyModule is envoyproxy/ratelimit at the version the benchmark
// harness runs (bench/peers.go): its own example and test configurations
// are loaded here as they are.
const envoyModule = "github.com/envoyproxy/ratelimit@v1.4.1-0.20260122083618-3fb702589d36"

// envoySource returns the directory of envoyModule's source, downloaded
// through the Go module proxy (or found in the module cache). It fails the
// test when it cannot.
func envoySource(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", envoyModule)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GO111MODULE=on")
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	if err != nil || json.Unmarshal(out, &mod) != nil || mod.Dir == "" {
		t.Fatalf("FAIL: envoyproxy/ratelimit's source is needed to test its configurations: go mod download %s: %v %s %s", envoyModule, err, mod.Error, out)
	}
	return mod.Dir
}

func TestEnvoyExampleConfigs(t *testing.T) {
	src := envoySource(t)
	cfg, err := Load(filepath.Join(src, "examples", "ratelimit", "config"))
	if err != nil {
		t.Fatalf("envoyproxy/ratelimit's example configuration: %v", err)
	}
	if got, want := cfg.Domains(), []string{"mongo_cps", "rl"}; !slices.Equal(got, want) {
		t.Errorf("domains %v, want %v", got, want)
	}
	rules := make(map[string]*Rule)
	for _, r := range cfg.Rules {
		rules[r.Path] = r
	}
	for path, want := range map[string]Rule{
		"mongo_cps.database_users": {Unit: Second, RequestsPerUnit: 500},
		"rl.foo.bar":               {Unit: Minute, RequestsPerUnit: 3},
		"rl.foo.bar_banned":        {Unit: Minute, Name: "banned_limit"},
		"rl.foo.baz_shady":         {Unit: Minute, RequestsPerUnit: 3, ShadowMode: true},
		"rl.foo.bay":               {Unlimited: true},
		"rl.unspec":                {Unit: Minute, RequestsPerUnit: 2, DetailedMetric: true},
		"rl.source_cluster_proxy.destination_cluster_fake": {Unit: Minute, RequestsPerUnit: 2, Name: "fake_name"},
	} {
		r := rules[path]
		if r == nil {
			t.Errorf("no rule %s", path)
			continue
		}
		if r.Unit != want.Unit || r.RequestsPerUnit != want.RequestsPerUnit || r.Name != want.Name || r.Unlimited != want.Unlimited ||
			r.ShadowMode != want.ShadowMode || r.QuotaMode != want.QuotaMode || r.DetailedMetric != want.DetailedMetric {
			t.Errorf("rule %s: got %+v, want %+v", path, *r, want)
		}
	}
	if r := rules["rl.category_account"]; r == nil || !slices.Equal(r.Replaces, []string{"bkthomps", "fake_name"}) {
		t.Errorf("rl.category_account replaces: got %+v", r)
	}
	// A rule is a keyed limiter of its domain's group; one whose levels
	// all fix a value counts one key, the others per value.
	users := rules["mongo_cps.database_users"].Limiter
	if !users.Keyed || users.MaxKeys != 1 || users.Group == "" || users.Policy.Limit != 500 || users.Policy.Period != time.Second || users.Policy.Algorithm != limiter.GCRA {
		t.Errorf("mongo_cps.database_users limiter: %+v", users)
	}
	if bar := rules["rl.foo.bar"].Limiter; bar.MaxKeys != DefaultMaxKeys || bar.Group != rules["rl.unspec"].Limiter.Group {
		t.Errorf("rl.foo.bar limiter: %+v", bar)
	}
	for _, r := range cfg.Rules {
		if (r.Limiter.Name == "") != (r.Unlimited || r.RequestsPerUnit == 0) {
			t.Errorf("rule %s: limiter %q", r.Path, r.Limiter.Name)
		}
		if r.Limiter.Name != "" {
			if err := limiter.CheckName(r.Limiter.Name); err != nil {
				t.Errorf("rule %s: %v", r.Path, err)
			}
		}
	}
}

// TestEnvoyTestConfigs loads each configuration of envoyproxy/ratelimit's
// own tests: the ones it refuses are refused here too.
func TestEnvoyTestConfigs(t *testing.T) {
	dir := filepath.Join(envoySource(t), "test", "config")
	bad := map[string]bool{
		"bad_limit_unit.yaml": true, "bad_yaml.yaml": true, "duplicate_key.yaml": true, "empty_domain.yaml": true,
		"empty_key.yaml": true, "misspelled_key.yaml": true, "misspelled_key2.yaml": true, "non_map_list.yaml": true,
		"non_string_key.yaml": true, "replaces_empty.yaml": true, "replaces_self.yaml": true, "unlimited_with_unit.yaml": true,
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) < 15 {
		t.Fatalf("configurations in %s: %v %v", dir, files, err)
	}
	for _, f := range files {
		_, err := Load(f)
		switch name := filepath.Base(f); {
		case bad[name] && err == nil:
			t.Errorf("%s: loaded, want refused", name)
		case !bad[name] && err != nil:
			t.Errorf("%s: %v", name, err)
		case err != nil && !strings.Contains(err.Error(), f):
			t.Errorf("%s: the error does not name the file: %v", name, err)
		}
	}
	// Two files of one domain are refused (envoyproxy/ratelimit merges
	// them only when told to).
	both := t.TempDir()
	for _, name := range []string{"basic_config.yaml", "duplicate_domain.yaml"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(both, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Load(both); err == nil || !strings.Contains(err.Error(), `domain "test-domain" is declared twice`) {
		t.Errorf("two files of one domain: %v", err)
	}
}

// Digest tells the configuration at a path from the one that was loaded:
// it is Load's Digest while the files stay, and differs after any change
// to them, even one that keeps a file's size and modification time.
func TestDigest(t *testing.T) {
	dir := t.TempDir()
	write := func(name, yaml string, mtime time.Time) {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	rule := func(domain string, limit int) string {
		return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: " + strconv.Itoa(limit) + "}\n"
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	write("a.yaml", rule("a", 2), at)
	digest := func() string {
		t.Helper()
		d, err := Digest(dir)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	cfg, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{cfg.Digest: "loaded"}
	if d := digest(); d != cfg.Digest {
		t.Fatalf("Digest %s, want Load's %s", d, cfg.Digest)
	}
	for _, change := range []struct {
		name string
		do   func()
		same bool // the change is not to the configuration's files
	}{
		{"one digit, same size and time", func() { write("a.yaml", rule("a", 5), at) }, false},
		{"a file added", func() { write("b.yaml", rule("b", 5), at) }, false},
		{"a file that is not *.yaml", func() { write("c.yml", rule("c", 5), at) }, true},
		{"a file renamed", func() {
			if err := os.Rename(filepath.Join(dir, "b.yaml"), filepath.Join(dir, "c.yaml")); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"a file removed", func() {
			if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		before := digest()
		change.do()
		d := digest()
		if change.same {
			if d != before {
				t.Errorf("%s: the digest changed", change.name)
			}
			continue
		}
		if prev, ok := seen[d]; ok {
			t.Errorf("%s: digest %s, as %s", change.name, d, prev)
		}
		seen[d] = change.name
		if cfg, err := Load(dir); err != nil {
			t.Errorf("%s: %v", change.name, err)
		} else if cfg.Digest != d {
			t.Errorf("%s: Load's digest %s, want Digest's %s", change.name, cfg.Digest, d)
		}
	}
	if _, err := Digest(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("Digest of a missing file: no error")
	}
}

// A broken file is refused with its line.
func TestErrorsNameTheLine(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", `f.yaml:5: invalid rate limit unit "fortnight"`},
		{"domain: d\ndescriptors:\n  - key: a\n  - key: a\n", "f.yaml:4: descriptor d.a is declared twice"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      unlimited: true\n", "f.yaml:5: an unlimited rate_limit takes no unit"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_units: 1\n", "[6:7] unknown field"},
		{"domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n", "f.yaml:5: share_threshold needs a wildcard value"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1000000001\n", "f.yaml:5: invalid policy"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      algorithm: leaky\n", "f.yaml:5: invalid policy"},
		{"domain: d\n  descriptors: [\n", "f.yaml:\n"},
		{"", "f.yaml: declares no domain"},
		{"# only a comment\n---\n", "f.yaml: declares no domain"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, max_keys: 600000}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 5, max_keys: 600000}\n", "up to 1200000 keys"},
	} {
		_, err := Parse("f.yaml", []byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error with %q", tc.yaml, err, tc.want)
		}
	}
}

// The extensions: an algorithm, a burst and a bound of keys per rule.
func TestExtensions(t *testing.T) {
	cfg, err := Parse("f.yaml", []byte(`domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_log, max_keys: 5}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 100, burst: 20}
`))
	if err != nil {
		t.Fatal(err)
	}
	user, ip := cfg.Rules[0].Limiter, cfg.Rules[1].Limiter
	if user.Policy.Algorithm != limiter.SlidingLog || user.MaxKeys != 5 || user.Policy.Period != time.Minute {
		t.Errorf("user: %+v", user)
	}
	if ip.Policy.Burst != 20 || ip.Policy.Limit != 100 || ip.MaxKeys != DefaultMaxKeys {
		t.Errorf("ip: %+v", ip)
	}
	if !regexp.MustCompile(`^envoy\.d\.user\.[0-9a-f]{12}$`).MatchString(user.Name) || user.Group != ip.Group {
		t.Errorf("names: %q %q, groups %q %q", user.Name, ip.Name, user.Group, ip.Group)
	}
}

// Each unit is as long as envoyproxy/ratelimit counts it, WEEK included,
// and the rule's limiter and its answers say so.
func TestUnitPeriod(t *testing.T) {
	for _, tc := range []struct {
		unit string
		want time.Duration
		code rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{"second", time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
		{"minute", time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{"hour", time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{"day", 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{"week", 7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
		{"month", 30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
		{"year", 365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
	} {
		t.Run(tc.unit, func(t *testing.T) {
			cfg, err := Parse("f.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+tc.unit+", requests_per_unit: 10}\n"))
			if err != nil {
				t.Fatal(err)
			}
			r := cfg.Rules[0]
			if got := r.Unit.Period(); got != tc.want {
				t.Errorf("period: got %s, want %s", got, tc.want)
			}
			if got := r.Limiter.Policy.Period; got != tc.want {
				t.Errorf("limiter period: got %s, want %s", got, tc.want)
			}
			if got := currentLimit(r).GetUnit(); got != tc.code {
				t.Errorf("unit answered: got %v, want %v", got, tc.code)
			}
		})
	}
}
