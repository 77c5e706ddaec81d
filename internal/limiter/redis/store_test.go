package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/storetest"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// TestStandalone runs everything that needs one Redis server on one
// container: the behavioural suite, the exactness properties, and the
// script and expiry mechanics.
func TestStandalone(t *testing.T) {
	c := newClient(t, redistest.Standalone(t))
	t.Run("Suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) limiter.Store { return newStore(t, c) })
	})
	t.Run("MulDivMod", func(t *testing.T) { testMulDivMod(t, c) })
	t.Run("GCRARemaining", func(t *testing.T) { testGCRARemaining(t, c) })
	t.Run("GCRAMatchesGo", func(t *testing.T) { testGCRAMatchesGo(t, c) })
	t.Run("SlidingLogMatchesGo", func(t *testing.T) { testSlidingLogMatchesGo(t, c) })
	t.Run("SlidingLogMergesLikeGo", func(t *testing.T) { testSlidingLogMerges(t, c) })
	t.Run("SlidingLogRebase", func(t *testing.T) { testSlidingLogRebase(t, c) })
	t.Run("NoScriptFallback", func(t *testing.T) { testNoScript(t, c) })
	t.Run("Expiry", func(t *testing.T) { testExpiry(t, c) })
	t.Run("ListSkipsStaleNames", func(t *testing.T) { testListSkipsStaleNames(t, c) })
	t.Run("AcquireCall", func(t *testing.T) { testAcquireCall(t, c) })
	t.Run("Batch", func(t *testing.T) { testBatch(t, c) })
	t.Run("Create", func(t *testing.T) { testCreate(t, c) })
	t.Run("CreateWithinBound", func(t *testing.T) { testCreateWithinBound(t, c) })
	t.Run("LazyDeclared", func(t *testing.T) { testLazyDeclared(t, c) })
	t.Run("RestoreBatchKeepsOrder", func(t *testing.T) { testRestoreBatchKeepsOrder(t, c) })
	t.Run("Keep", func(t *testing.T) { testKeep(t, c) })
	runJoint(t, c)
	t.Run("Bound", func(t *testing.T) {
		storetest.RunBound(t, func(t *testing.T, maxLimiters int) (limiter.Store, limiter.Store) {
			// Two replicas: two Stores over the same prefix.
			prefix := fmt.Sprintf("t%d:", prefixes.Add(1))
			a, err := New(c, prefix, maxLimiters)
			if err != nil {
				t.Fatal(err)
			}
			b, err := New(c, prefix, maxLimiters)
			if err != nil {
				t.Fatal(err)
			}
			return a, b
		})
	})
}

// AcquireCall replayed as a plain EVALSHA takes permits from the limiter
// the Store sees, as Store.Acquire does.
func testAcquireCall(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	put(t, s, "replay", limiter.Policy{Limit: 10, Period: time.Hour})
	script, keys, args := AcquireCall(s.prefix, "replay", 3)
	// The Store's own call, on a server that held no script, leaves the
	// very script AcquireCall returns.
	if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	if d, err := s.Acquire(ctx, "replay", 1); err != nil || !d.Allowed {
		t.Fatalf("Acquire(1): got %+v, %v, want allowed", d, err)
	}
	sum := sha1.Sum([]byte(script))
	sha := hex.EncodeToString(sum[:])
	if exists, err := c.Do(ctx, c.B().ScriptExists().Sha1(sha).Build()).AsIntSlice(); err != nil || len(exists) != 1 || exists[0] != 1 {
		t.Fatalf("SCRIPT EXISTS for AcquireCall's script after Store.Acquire: got %v, %v, want [1]", exists, err)
	}
	for i := range 2 {
		v, err := c.Do(ctx, c.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
		if err != nil {
			t.Fatalf("EVALSHA: %v", err)
		}
		if len(v) != 9 || v[1] != 1 || v[2] != int64(6-3*i) {
			t.Errorf("EVALSHA reply %d: got %v, want allowed with %d remaining", i, v, 6-3*i)
		}
	}
	a, err := s.Available(ctx, "replay")
	if err != nil || a.Remaining != 3 {
		t.Errorf("Available after acquiring 1 and replaying two acquisitions of 3: got %+v, %v, want 3 remaining", a, err)
	}
}

func TestKeys(t *testing.T) {
	s, err := New(rueidisStub{}, "app:", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ got, want string }{
		{s.defKey("a.b"), "app:{a.b}:def"},
		{s.stateKey("a.b"), "app:{a.b}:st"},
		{s.names, "app:names"},
	} {
		if tc.got != tc.want {
			t.Errorf("key: got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestCluster runs the behavioural suite on a three-master Redis Cluster and
// checks that limiters land on every master.
func TestCluster(t *testing.T) {
	addrs := redistest.Cluster(t)
	c := newClient(t, addrs...)
	if n := len(c.Nodes()); n != 3 {
		t.Fatalf("the client sees %d nodes, want 3", n)
	}
	t.Run("Suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) limiter.Store { return newStore(t, c) })
	})
	t.Run("KeysOnEveryMaster", func(t *testing.T) {
		s := newStore(t, c)
		ctx := context.Background()
		// A limiter's keys share a slot: its scripts may touch both.
		slot := func(key string) int64 {
			n, err := c.Do(ctx, c.B().ClusterKeyslot().Key(key).Build()).AsInt64()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
			}
			return n
		}
		if a, b := slot(s.defKey("x-1")), slot(s.stateKey("x-1")); a != b {
			t.Errorf("slots of a limiter's keys: %d and %d, want one", a, b)
		}
		for i := range 30 {
			name := fmt.Sprintf("spread-%d", i)
			put(t, s, name, limiter.Policy{Limit: 5, Period: time.Hour, Algorithm: []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog}[i%2]})
			if d, err := s.Acquire(ctx, name, 1); err != nil || !d.Allowed {
				t.Fatalf("Acquire(%q): got %+v, %v", name, d, err)
			}
		}
		for addr, node := range c.Nodes() {
			// A definition and its state share a node.
			n, err := node.Do(ctx, node.B().Dbsize().Build()).AsInt64()
			if err != nil || n < 2 {
				t.Errorf("master %s holds %d keys (%v), want limiters there too", addr, n, err)
			}
		}
		defs, err := s.List(ctx, "", 100)
		if err != nil || len(defs) != 30 {
			t.Errorf("List across the cluster: got %d definitions, %v, want 30", len(defs), err)
		}
	})
	t.Run("Batch", func(t *testing.T) { testBatch(t, c) })
	t.Run("Create", func(t *testing.T) { testCreate(t, c) })
	t.Run("CreateWithinBound", func(t *testing.T) { testCreateWithinBound(t, c) })
	t.Run("LazyDeclared", func(t *testing.T) { testLazyDeclared(t, c) })
	runJoint(t, c)
	t.Run("GroupInOneSlot", func(t *testing.T) { testGroupInOneSlot(t, c) })
}

// runJoint runs the joint-decision tests that need a Redis of their own:
// against the Go code, across replicas, and after a limiter moved.
func runJoint(t *testing.T, c rueidis.Client) {
	for _, tt := range []struct {
		name string
		run  func(*testing.T, rueidis.Client)
	}{
		{"DecideMatchesGo", testDecideMatchesGo},
		{"DecideBatch", testDecideBatch},
		{"DecideBatchFailsAlone", testDecideBatchFailsAlone},
		{"DecideReplicas", testDecideReplicas},
		{"ChargeRefundReplicas", testChargeRefundReplicas},
		{"OnceReplicas", testOnceReplicas},
		{"SettleReplicas", testSettleReplicas},
		{"Relocation", testRelocation},
	} {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, c) })
	}
}

// testGroupInOneSlot: every key of a group's limiters hashes to one slot,
// and groups spread over the masters as limiters do.
func testGroupInOneSlot(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	slot := func(key string) int64 {
		n, err := c.Do(ctx, c.B().ClusterKeyslot().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
		}
		return n
	}
	want := slot(s.keysIn("a", "team")[0])
	for _, name := range []string{"a", "b", "zz-9"} {
		for _, key := range s.keysIn(name, "team") {
			if got := slot(key); got != want {
				t.Errorf("key %s: slot %d, want the group's %d", key, got, want)
			}
		}
	}
	if got := slot(s.keysIn("a", "other")[0]); got == want {
		t.Errorf("groups team and other share slot %d; choose other names for this test", got)
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

// newStore returns a Store under a prefix of its own, so that stores on one
// server do not see each other's limiters.
func newStore(t testing.TB, c rueidis.Client) *Store {
	t.Helper()
	s, err := New(c, fmt.Sprintf("t%d:", prefixes.Add(1)), 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func put(t testing.TB, s *Store, name string, p limiter.Policy) {
	t.Helper()
	if _, err := s.Put(context.Background(), limiter.Definition{Name: name, Policy: p}); err != nil {
		t.Fatalf("Put(%q, %+v): %v", name, p, err)
	}
}

func TestNewRejectsBraces(t *testing.T) {
	for _, prefix := range []string{"a{", "}", "{x}:"} {
		if _, err := New(rueidisStub{}, prefix, 0); err == nil {
			t.Errorf("New(prefix %q): got no error, want one", prefix)
		}
	}
	if _, err := New(nil, "p:", 0); err == nil {
		t.Error("New(nil client): got no error, want one")
	}
}

// rueidisStub is a non-nil client for constructor tests; it is never called.
type rueidisStub struct{ rueidis.Client }
