package redis

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
	"github.com/ratelimiter/ratelimiter/internal/tenant/tenanttest"
)

var _ tenanttest.Tenants = (*Tenants)(nil)

// TestStandalone runs everything that needs one Redis server on one
// container: the behavioural suite, the exactness properties against the
// in-memory Registry, and the index and expiry mechanics.
func TestStandalone(t *testing.T) {
	c := newClient(t, redistest.Standalone(t))
	t.Run("Suite", func(t *testing.T) { runSuite(t, c) })
	t.Run("Spans", func(t *testing.T) {
		tenanttest.RunSpans(t, func(t *testing.T, cfg tenant.Config) tenanttest.Tenants { return newTenants(t, c, cfg) })
	})
	t.Run("GCRAMatchesRegistry", func(t *testing.T) { testMatchesRegistry(t, c, gcraConfigs) })
	t.Run("SlidingLogMatchesRegistry", func(t *testing.T) { testMatchesRegistry(t, c, logConfigs) })
	t.Run("BoundMatchesRegistry", func(t *testing.T) { testBoundMatchesRegistry(t, c) })
	t.Run("LowestMatchesRegistryAtScale", func(t *testing.T) { testLowestAtScale(t, c) })
	t.Run("LoweredBounds", func(t *testing.T) { testLoweredBounds(t, c) })
	t.Run("WalkBudget", func(t *testing.T) { testWalkBudget(t, c) })
	t.Run("TrimsFullTenants", func(t *testing.T) { testTrim(t, c) })
	t.Run("StaleIndexMembers", func(t *testing.T) { testStaleMembers(t, c) })
	t.Run("NoScriptFallback", func(t *testing.T) { testNoScript(t, c) })
	t.Run("Expiry", func(t *testing.T) { testExpiry(t, c) })
}

// TestCluster runs the behavioural suite on a three-master Redis Cluster and
// checks that the shards land on every master.
func TestCluster(t *testing.T) {
	c := newClient(t, redistest.Cluster(t)...)
	if n := len(c.Nodes()); n != 3 {
		t.Fatalf("the client sees %d nodes, want 3", n)
	}
	t.Run("Suite", func(t *testing.T) { runSuite(t, c) })
	t.Run("ShardsOnEveryMaster", func(t *testing.T) { testShardsOnEveryMaster(t, c) })
}

func runSuite(t *testing.T, c rueidis.Client) {
	tenanttest.Run(t, func(t *testing.T, cfg tenant.Config) tenanttest.Tenants { return newTenants(t, c, cfg) })
}

func testShardsOnEveryMaster(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		ts := newTenants(t, c, tenant.Config{Policy: limiter.Policy{Limit: 5, Period: time.Hour, Algorithm: alg}})
		// A shard's keys share a slot: its scripts may touch them all.
		for i := range ts.shards {
			sh := &ts.shards[i]
			want := slot(t, c, sh.Idx)
			for _, key := range []string{sh.Exp, sh.Base + hexKey(uint64(i))} {
				if got := slot(t, c, key); got != want {
					t.Errorf("shard %d: %s in slot %d, its index in %d", i, key, got, want)
				}
			}
		}
		seen := map[int]bool{}
		for i := 0; len(seen) < numShards; i++ {
			ip := fmt.Sprintf("10.9.%d.%d", i/256, i%256)
			key, _, _ := tenant.Key(ip, 64)
			seen[shardOf(key)] = true
			if d, err := ts.Acquire(ctx, ip, 1+int64(i%5)); err != nil || !d.Allowed {
				t.Fatalf("Acquire(%q): got %+v, %v", ip, d, err)
			}
		}
		perMaster := map[string]int64{}
		for addr, node := range c.Nodes() {
			n, err := node.Do(ctx, node.B().Dbsize().Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			perMaster[addr] = n
		}
		for addr, n := range perMaster {
			if n < 4 {
				t.Errorf("%s: master %s holds %d keys, want several shards there: %v", alg, addr, n, perMaster)
			}
		}
		// Lowest merges every master's shards.
		es, err := ts.Lowest(ctx, 3)
		if err != nil || len(es) != 3 || es[0].Remaining != 0 {
			t.Errorf("%s: Lowest(3) across the cluster: got %+v, %v, want 3 tenants, the first with nothing left", alg, es, err)
		}
		flush(t, c)
	}
}

func slot(t *testing.T, c rueidis.Client, key string) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().ClusterKeyslot().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
	}
	return n
}

// flush empties every master, so that the next count starts from zero.
func flush(t *testing.T, c rueidis.Client) {
	t.Helper()
	for _, node := range c.Nodes() {
		if err := node.Do(context.Background(), node.B().Flushall().Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

func newClient(t testing.TB, addrs ...string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatalf("connect to %v: %v", addrs, err)
	}
	t.Cleanup(c.Close)
	return c
}

var prefixes atomic.Int64

// newTenants returns Tenants under a prefix of their own, so that tests on
// one server do not see each other's tenants.
func newTenants(t testing.TB, c rueidis.Client, cfg tenant.Config) *Tenants {
	t.Helper()
	ts, err := New(c, fmt.Sprintf("t%d:", prefixes.Add(1)), cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return ts
}

func TestNewValidates(t *testing.T) {
	valid := limiter.Policy{Limit: 9, Period: time.Minute}
	tests := []struct {
		name   string
		client rueidis.Client
		prefix string
		cfg    tenant.Config
		want   error // nil: any error
	}{
		{"nil client", nil, "p:", tenant.Config{Policy: valid}, nil},
		{"brace in prefix", rueidisStub{}, "a{", tenant.Config{Policy: valid}, nil},
		{"closing brace", rueidisStub{}, "}", tenant.Config{Policy: valid}, nil},
		{"zero policy", rueidisStub{}, "p:", tenant.Config{}, limiter.ErrInvalidPolicy},
		{"bad burst", rueidisStub{}, "p:", tenant.Config{Policy: limiter.Policy{Limit: 9, Period: time.Minute, Burst: 10}}, limiter.ErrInvalidPolicy},
		{"prefix 65", rueidisStub{}, "p:", tenant.Config{Policy: valid, IPv6Prefix: 65}, tenant.ErrInvalidConfig},
		{"negative prefix", rueidisStub{}, "p:", tenant.Config{Policy: valid, IPv6Prefix: -1}, tenant.ErrInvalidConfig},
		{"negative max tenants", rueidisStub{}, "p:", tenant.Config{Policy: valid, MaxTenants: -1}, tenant.ErrInvalidConfig},
		{"max bytes below one tenant", rueidisStub{}, "p:", tenant.Config{Policy: valid, MaxBytes: 383}, tenant.ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.client, tt.prefix, tt.cfg)
			if err == nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("New: got error %v, want one wrapping %v", err, tt.want)
			}
		})
	}
	for _, cfg := range []tenant.Config{
		{Policy: valid},
		{Policy: valid, IPv6Prefix: 1, MaxTenants: 1},
		{Policy: limiter.Policy{Limit: 9, Period: time.Minute, Algorithm: limiter.SlidingLog}, IPv6Prefix: 64},
	} {
		if _, err := New(rueidisStub{}, "", cfg); err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
		}
	}
}

// rueidisStub is a non-nil client for tests that never reach Redis.
type rueidisStub struct{ rueidis.Client }

// TestInvalidInputNeverReachesRedis: bad addresses, permit counts and k are
// refused before any command is sent (the stub client would panic).
func TestInvalidInputNeverReachesRedis(t *testing.T) {
	ts, err := New(rueidisStub{}, "p:", tenant.Config{Policy: limiter.Policy{Limit: 9, Period: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := ts.Acquire(ctx, "bad", 1); !errors.Is(err, tenant.ErrInvalidIP) {
		t.Errorf("Acquire(bad): got %v, want ErrInvalidIP", err)
	}
	if _, err := ts.Acquire(ctx, "192.0.2.1", 0); !errors.Is(err, limiter.ErrInvalidPermits) {
		t.Errorf("Acquire(0 permits): got %v, want ErrInvalidPermits", err)
	}
	if _, err := ts.Available(ctx, "::"); !errors.Is(err, tenant.ErrInvalidIP) {
		t.Errorf("Available(::): got %v, want ErrInvalidIP", err)
	}
	if _, err := ts.Lowest(ctx, 0); !errors.Is(err, tenant.ErrInvalidK) {
		t.Errorf("Lowest(0): got %v, want ErrInvalidK", err)
	}
	if got, err := ts.Tenant("::ffff:192.0.2.1"); err != nil || got != "192.0.2.1" {
		t.Errorf("Tenant(::ffff:192.0.2.1): got %q, %v", got, err)
	}
}
