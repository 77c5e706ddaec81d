package rls

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

func entries(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// TestMatch holds Match to envoyproxy/ratelimit's lookup, on its own test
// configurations.
func TestMatch(t *testing.T) {
	dir := filepath.Join(envoySource(t), "test", "config")
	basic, err := Load(filepath.Join(dir, "basic_config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	wild, err := Load(filepath.Join(dir, "wildcard.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg     *Config
		domain  string
		entries []Entry
		rule    string // "" for none
		key     string
	}{
		{basic, "test-domain", entries("key1", "value1", "subkey1", "x"), "test-domain.key1_value1.subkey1", "key1=value1|subkey1=x"},
		{basic, "test-domain", entries("key1", "value1", "subkey1", "subvalue1"), "test-domain.key1_value1.subkey1_subvalue1", "key1=value1|subkey1=subvalue1"},
		{basic, "test-domain", entries("key1", "value1"), "", ""},                              // a level without a limit
		{basic, "test-domain", entries("key1", "value2", "subkey1", "x"), "", ""},              // no such value, no default
		{basic, "test-domain", entries("key1", "value1", "subkey1", "x", "more", "y"), "", ""}, // deeper than the tree
		{basic, "test-domain", entries("key2", "anything"), "test-domain.key2", "key2=anything"},
		{basic, "test-domain", entries("key2", "value2"), "test-domain.key2_value2", "key2=value2"},
		{basic, "test-domain", entries("key2", "value3"), "", ""}, // a value without a limit: let through
		{basic, "test-domain", entries("key5", "value5", "subkey5", "subvalue5"), "test-domain.key5_value5.subkey5_subvalue5", "key5=value5|subkey5=subvalue5"},
		{basic, "other-domain", entries("key2", "value2"), "", ""},
		{wild, "test-domain", entries("wild", "foo123"), "test-domain.wild_foo*", "wild=foo123"},
		{wild, "test-domain", entries("wild", "fo"), "", ""},
		{wild, "test-domain", entries("midWild", "barXXb"), "test-domain.midWild_bar*b", "midWild=barXXb"},
		{wild, "test-domain", entries("midWild", "barXXc"), "", ""},
		{wild, "test-domain", entries("nestedWild", "val1", "wild", "goober"), "test-domain.nestedWild_val1.wild_goo*", "nestedWild=val1|wild=goober"},
		{wild, "test-domain", entries("noVal", "x"), "test-domain.noVal", "noVal=x"},
	} {
		r, key := tc.cfg.Match(tc.domain, tc.entries)
		got := ""
		if r != nil {
			got = r.Path
		}
		if got != tc.rule || key != tc.key {
			t.Errorf("%s %v: rule %q key %q, want %q %q", tc.domain, tc.entries, got, key, tc.rule, tc.key)
		}
	}
}

// A wildcard may stand anywhere in a value, several times.
func TestWildcards(t *testing.T) {
	cfg, err := Parse("f.yaml", []byte(`domain: d
descriptors:
  - key: m
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: e
    value: "*"
    rate_limit: {unit: minute, requests_per_unit: 10}
`))
	if err != nil {
		t.Fatal(err)
	}
	for value, want := range map[string]bool{
		"fooAbarBbaz": true, "foobarbaz": true, "foobaz": false, "fooAbaz": false, "fooXbarYbazZ": false, "foo-bar-bar-baz": true,
	} {
		if r, _ := cfg.Match("d", entries("m", value)); (r != nil) != want {
			t.Errorf("m=%s: matched %v, want %v", value, r != nil, want)
		}
	}
	if r, _ := cfg.Match("d", entries("e", "")); r == nil {
		t.Error("e=: * matches the empty value")
	}
}

// A share_threshold wildcard counts every value it matches as one key.
func TestShareThreshold(t *testing.T) {
	cfg, err := Parse("f.yaml", []byte(`domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 100}
`))
	if err != nil {
		t.Fatal(err)
	}
	_, a := cfg.Match("d", entries("files", "files/a.txt"))
	_, b := cfg.Match("d", entries("files", "files/b.txt"))
	if a != b || a != "files=files/*" {
		t.Errorf("shared keys %q and %q, want both files=files/*", a, b)
	}
	_, a = cfg.Match("d", entries("path", "/api/a"))
	_, b = cfg.Match("d", entries("path", "/api/b"))
	if a == b {
		t.Errorf("a wildcard without share_threshold counts per value: both %q", a)
	}
}

// Keys are readable when they can be, and otherwise a digest; distinct
// entries never share a key.
func TestKey(t *testing.T) {
	long := strings.Repeat("v", limiter.MaxKeyLen)
	seen := make(map[string][]Entry)
	for _, es := range [][]Entry{
		entries("a", "b"), entries("a", "b", "c", "d"), entries("a", "b|c=d"), entries("a=b", ""), entries("a", "b="),
		entries("a", ""), entries("", "a"), entries("a", "b\\"), entries("a", "\x00"), entries("a", long), entries("#a", "b"),
		entries("a", "b", "c", ""), entries("a", "b|c"), entries("a", "é"), entries("a", "\xff"),
	} {
		values := make([]string, len(es))
		for i, e := range es {
			values[i] = e.Value
		}
		k := Key(es, values)
		if err := limiter.CheckKey(k); err != nil {
			t.Errorf("%q: key %q: %v", es, k, err)
		}
		if prev, dup := seen[k]; dup {
			t.Errorf("%q and %q share the key %q", prev, es, k)
		}
		seen[k] = es
	}
	if k := Key(entries("remote_address", "203.0.113.7"), []string{"203.0.113.7"}); k != "remote_address=203.0.113.7" {
		t.Errorf("readable key: %q", k)
	}
}
