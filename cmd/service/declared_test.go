package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// groupedKeyed declares a keyed limiter and a plain one in one group: 5
// permits an hour for each of at most 2 users, 8 for all of them.
const groupedKeyed = `limiters:
  - name: per-user
    limit: 5
    period: 1h
    group: search
    keyed: true
    max_keys: 2
  - name: total
    limit: 8
    period: 1h
    group: search
`

// configFile writes content to a config file of the test and returns its
// path.
func configFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// decide makes a joint decision on the items, each a limiter, a key ("" for
// none) and permits, and returns the verdict.
func decide(t *testing.T, c *client.ClientWithResponses, items ...client.DecideItem) client.Verdict {
	t.Helper()
	res, err := c.DecideWithResponse(t.Context(), nil, client.DecideRequest{Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if res.JSON200 == nil {
		t.Fatalf("decide: got %s %s, want 200", res.Status(), res.Body)
	}
	return *res.JSON200
}

func item(limiter, key string, permits int64) client.DecideItem {
	it := client.DecideItem{Limiter: limiter, Permits: &permits}
	if key != "" {
		it.Key = &key
	}
	return it
}

// checkGroupedKeyed checks, through c, the limiters groupedKeyed declares:
// their definitions, and joint decisions over the two of them, all or
// nothing, with the keyed one's bound of keys. Both start full.
func checkGroupedKeyed(t *testing.T, c *client.ClientWithResponses) {
	t.Helper()
	res, err := c.GetLimiterWithResponse(t.Context(), "per-user")
	if err != nil {
		t.Fatal(err)
	}
	if l := res.JSON200; l == nil || l.Group == nil || *l.Group != "search" || l.Keyed == nil || !*l.Keyed || l.MaxKeys == nil || *l.MaxKeys != 2 {
		t.Fatalf("get per-user: got %s %s, want it in group search, keyed, with max_keys 2", res.Status(), res.Body)
	}
	res, err = c.GetLimiterWithResponse(t.Context(), "total")
	if err != nil {
		t.Fatal(err)
	}
	if l := res.JSON200; l == nil || l.Group == nil || *l.Group != "search" || l.Keyed != nil || l.MaxKeys != nil {
		t.Fatalf("get total: got %s %s, want it in group search, not keyed", res.Status(), res.Body)
	}

	steps := []struct {
		name      string
		items     []client.DecideItem
		allowed   bool
		remaining []int64
		keysFull  bool // of the first item
	}{
		{name: "both fit", items: []client.DecideItem{item("per-user", "u1", 3), item("total", "", 3)}, allowed: true, remaining: []int64{2, 5}},
		{name: "total does not fit", items: []client.DecideItem{item("per-user", "u2", 4), item("total", "", 6)}, remaining: []int64{5, 5}},
		{name: "u1 does not fit", items: []client.DecideItem{item("per-user", "u1", 3), item("total", "", 1)}, remaining: []int64{2, 5}},
		{name: "u2 fits", items: []client.DecideItem{item("per-user", "u2", 5), item("total", "", 1)}, allowed: true, remaining: []int64{0, 4}},
		{name: "u1 takes the rest", items: []client.DecideItem{item("per-user", "u1", 2), item("total", "", 1)}, allowed: true, remaining: []int64{0, 3}},
		{name: "no room for a third key", items: []client.DecideItem{item("per-user", "u3", 1), item("total", "", 1)}, remaining: []int64{0, 3}, keysFull: true},
	}
	for _, s := range steps {
		v := decide(t, c, s.items...)
		if v.Degraded != nil || v.Allowed != s.allowed || len(v.Items) != len(s.items) {
			t.Fatalf("%s: got %+v, want allowed=%v", s.name, v, s.allowed)
		}
		for i, want := range s.remaining {
			if got := v.Items[i].Remaining; got != want {
				t.Errorf("%s: item %d (%s): got %d remaining, want %d", s.name, i, v.Items[i].Limiter, got, want)
			}
		}
		if full := v.Items[0].KeysFull != nil && *v.Items[0].KeysFull; full != s.keysFull {
			t.Errorf("%s: keys_full of per-user: got %v, want %v", s.name, full, s.keysFull)
		}
	}

	// A plain acquisition names no key of a keyed limiter.
	permits := int64(1)
	acq, err := c.AcquireWithResponse(t.Context(), "per-user", client.AcquireRequest{Permits: &permits})
	if err != nil {
		t.Fatal(err)
	}
	if acq.StatusCode() != http.StatusBadRequest {
		t.Errorf("acquire per-user without a key: got %s %s, want 400", acq.Status(), acq.Body)
	}
}

// A config file declaring a keyed limiter and a plain one in one group
// starts the service on the memory backend, and a joint decision over them
// works.
func TestDeclaredGroupedKeyedLimiters(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	env := map[string]string{"RATELIMITER_CONFIG": configFile(t, groupedKeyed)}
	base, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0"}, env)
	c, err := client.NewClientWithResponses(base)
	if err != nil {
		t.Fatal(err)
	}
	checkGroupedKeyed(t, c)
}

// The same on Redis, and again after Redis restarted empty: the declared
// limiters come back in their group, keyed as declared.
func TestRedisDeclaredGroupedKeyedLimiters(t *testing.T) {
	addr := redistest.Standalone(t)
	// Without the denial cache: an emptied Redis grants at once what the
	// cache would go on denying for up to a second (see the README).
	c := replica(t, addr, map[string]string{"RATELIMITER_CONFIG": configFile(t, groupedKeyed), "RATELIMITER_REDIS_DENY_CACHE": "0"})
	checkGroupedKeyed(t, c)

	// A decision that finds them missing creates them, and is made again.
	emptyRedis(t, addr)
	v := decide(t, c, item("per-user", "u1", 1), item("total", "", 1))
	if !v.Allowed || v.Degraded != nil || v.Items[0].Remaining != 4 || v.Items[1].Remaining != 7 {
		t.Errorf("decide after Redis emptied: got %+v, want allowed from full limiters, 4 and 7 remaining", v)
	}
	emptyRedis(t, addr)
	checkGroupedKeyed(t, c)
}

// Keyed limiters whose max_keys add up past the budget of keys stop the
// service at start-up, as a configuration error.
func TestDeclaredKeysBeyondBudget(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	path := configFile(t, `limiters:
  - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 999999}
  - {name: b, limit: 1, period: 1s, keyed: true, max_keys: 2}
`)
	var stderr bytes.Buffer
	err := run(t.Context(), []string{"--config", path, "--listen", "127.0.0.1:0", "--grpc-listen", ""}, func(string) string { return "" }, io.Discard, io.Discard)
	if code := exitCode(err, &stderr); code != 2 {
		t.Fatalf("got exit code %d (error %v), want 2", code, err)
	}
	for _, want := range []string{path, "max_keys add up to 1000001", "1000000 keys", "lower max_keys"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr %q lacks %q", stderr.String(), want)
		}
	}
}
