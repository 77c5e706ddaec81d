package memory_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/keystest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

func putDef(t *testing.T, s *memory.Store, def limiter.Definition) bool {
	t.Helper()
	created, err := s.Put(context.Background(), def)
	if err != nil {
		t.Fatalf("Put(%+v): %v", def, err)
	}
	return created
}

// TestKeyedLifecycle: a keyed limiter keeps one bucket per key, forgets a
// key once its bucket is full again, keeps its state across an identical
// Put and starts afresh on a changed one, and refuses calls without a key
// (and unkeyed limiters calls with one) without changing anything.
func TestKeyedLifecycle(t *testing.T) {
	ctx := context.Background()
	s, c := newStore(t)
	p := limiter.Policy{Limit: 9, Period: time.Minute}
	def := limiter.Definition{Name: "per-user", Policy: p, Keyed: true}
	if !putDef(t, s, def) {
		t.Fatal("first Put: got created=false, want true")
	}
	got, err := s.Get(ctx, "per-user")
	if want := (limiter.Definition{Name: "per-user", Policy: p.Normalize(), Keyed: true, MaxKeys: limiter.DefaultMaxKeys}); err != nil || got != want {
		t.Errorf("Get: got %+v, %v, want %+v", got, err, want)
	}
	if d, err := s.AcquireKey(ctx, "per-user", "alice", 5); err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("AcquireKey(alice, 5): got %+v, %v, want allowed with 4 left", d, err)
	}
	// 0/9 used and a request for 10: denied, still 0/9 used.
	if d, _ := s.AcquireKey(ctx, "per-user", "bob", 10); d.Allowed || !d.ExceedsCapacity {
		t.Errorf("AcquireKey(bob, 10): got %+v, want denied, exceeds capacity", d)
	}
	if a, _ := s.AvailableKey(ctx, "per-user", "bob"); a.Remaining != 9 {
		t.Errorf("AvailableKey(bob): got %d, want 9", a.Remaining)
	}
	if a, _ := s.AvailableKey(ctx, "per-user", "alice"); a.Remaining != 4 {
		t.Errorf("AvailableKey(alice): got %d, want 4", a.Remaining)
	}
	es, err := s.Lowest(ctx, "per-user", 10)
	if err != nil || len(es) != 1 || es[0].Key != "alice" || es[0].Remaining != 4 {
		t.Errorf("Lowest: got %+v, %v, want alice alone with 4 left", es, err)
	}
	// An identical Put keeps the state.
	if putDef(t, s, def) {
		t.Error("identical Put: got created=true")
	}
	if a, _ := s.AvailableKey(ctx, "per-user", "alice"); a.Remaining != 4 {
		t.Errorf("after identical Put: alice has %d, want 4", a.Remaining)
	}
	// Calls that do not fit the definition change nothing.
	for name, err := range map[string]error{
		"Acquire":   func() error { _, err := s.Acquire(ctx, "per-user", 1); return err }(),
		"Available": func() error { _, err := s.Available(ctx, "per-user"); return err }(),
		"Decide": func() error {
			_, err := s.Decide(ctx, []limiter.Item{{Name: "per-user", Permits: 1}}, limiter.Take, "")
			return err
		}(),
	} {
		if !errors.Is(err, limiter.ErrKeyMismatch) {
			t.Errorf("%s on a keyed limiter: got %v, want ErrKeyMismatch", name, err)
		}
	}
	out := make([]limiter.Result, 1)
	s.AcquireBatch(ctx, []limiter.Request{{Name: "per-user", Permits: 1}}, out)
	if !errors.Is(out[0].Err, limiter.ErrKeyMismatch) {
		t.Errorf("AcquireBatch on a keyed limiter: got %v, want ErrKeyMismatch", out[0].Err)
	}
	if a, _ := s.AvailableKey(ctx, "per-user", "alice"); a.Remaining != 4 {
		t.Errorf("after refused calls: alice has %d, want 4", a.Remaining)
	}
	put(t, s, "plain", p)
	for name, err := range map[string]error{
		"AcquireKey":   func() error { _, err := s.AcquireKey(ctx, "plain", "alice", 1); return err }(),
		"AvailableKey": func() error { _, err := s.AvailableKey(ctx, "plain", "alice"); return err }(),
		"Lowest":       func() error { _, err := s.Lowest(ctx, "plain", 1); return err }(),
	} {
		if !errors.Is(err, limiter.ErrKeyMismatch) {
			t.Errorf("%s on a limiter that is not keyed: got %v, want ErrKeyMismatch", name, err)
		}
	}
	if a, _ := s.Available(ctx, "plain"); a.Remaining != 9 {
		t.Errorf("plain after refused calls: %d left, want 9", a.Remaining)
	}
	for name, err := range map[string]error{
		"AcquireKey":   func() error { _, err := s.AcquireKey(ctx, "missing", "alice", 1); return err }(),
		"AvailableKey": func() error { _, err := s.AvailableKey(ctx, "missing", "alice"); return err }(),
		"Lowest":       func() error { _, err := s.Lowest(ctx, "missing", 1); return err }(),
	} {
		if !errors.Is(err, limiter.ErrNotFound) {
			t.Errorf("%s on an unknown limiter: got %v, want ErrNotFound", name, err)
		}
	}
	// A full bucket is forgotten.
	c.Advance(time.Minute)
	if es, _ := s.Lowest(ctx, "per-user", 10); len(es) != 0 {
		t.Errorf("Lowest a period later: got %+v, want none", es)
	}
	// A changed definition starts afresh.
	s.AcquireKey(ctx, "per-user", "alice", 9)
	def.MaxKeys = 5
	putDef(t, s, def)
	if a, _ := s.AvailableKey(ctx, "per-user", "alice"); a.Remaining != 9 {
		t.Errorf("after a new max_keys: alice has %d, want 9", a.Remaining)
	}
}

// TestKeyedMatchesReference holds a keyed limiter of the Store, through
// AcquireKey, AvailableKey and Lowest at the store's clock, to the
// reference model of a bounded table of keys.
func TestKeyedMatchesReference(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		p       limiter.Policy
		maxKeys int
	}{
		{limiter.Policy{Limit: 5, Period: time.Second}, 1000},
		{limiter.Policy{Limit: 7, Period: time.Second, Burst: 3}, 4},
		{limiter.Policy{Limit: 4, Period: time.Second, Algorithm: limiter.SlidingLog}, 1000},
		{limiter.Policy{Limit: 3, Period: time.Second, Algorithm: limiter.SlidingLog}, 4},
	} {
		t.Run(fmt.Sprintf("%s/max=%d", tc.p.Normalize().Algorithm, tc.maxKeys), func(t *testing.T) {
			s, c := newStore(t)
			putDef(t, s, limiter.Definition{Name: "k", Policy: tc.p, Keyed: true, MaxKeys: tc.maxKeys})
			m := keystest.NewModel(tc.p, tc.maxKeys)
			keys := []string{"alice", "bob", "carol", "dave", "eve", "frank", "user/1", "ünïcode"}
			rng := rand.New(rand.NewPCG(7, uint64(tc.maxKeys)))
			for i := range 5000 {
				now := limiter.Nanos(c.Wall())
				key := keys[rng.IntN(len(keys))]
				switch x := rng.IntN(100); {
				case x < 10:
					c.Advance(time.Duration(rng.Int64N(int64(tc.p.Period) / 2)))
				case x < 20:
					k := 1 + rng.IntN(10)
					got, err := s.Lowest(ctx, "k", k)
					if err != nil {
						t.Fatal(err)
					}
					want := m.Lowest(now, k)
					if len(got) != len(want) {
						t.Fatalf("step %d: Lowest: got %+v, want %+v", i, got, want)
					}
					for j := range got {
						if got[j].Key != want[j].Key || got[j].Availability != want[j].Availability {
							t.Fatalf("step %d: Lowest[%d]: got %+v, want %+v", i, j, got[j], want[j])
						}
					}
				case x < 35:
					got, err := s.AvailableKey(ctx, "k", key)
					av, full := m.Available(key, now)
					if want := (limiter.KeyAvailability{Availability: av, KeysFull: full}); err != nil || got != want {
						t.Fatalf("step %d: AvailableKey(%q): got %+v, %v, want %+v", i, key, got, err, want)
					}
				default:
					n := 1 + rng.Int64N(4)
					got, err := s.AcquireKey(ctx, "k", key, n)
					d, full := m.Acquire(key, now, n)
					if want := (limiter.KeyDecision{Decision: d, KeysFull: full}); err != nil || got != want {
						t.Fatalf("step %d: AcquireKey(%q, %d): got %+v, %v, want %+v", i, key, n, got, err, want)
					}
				}
			}
		})
	}
}

// TestKeyedLimiterCost: a keyed limiter's tables grow with its max_keys,
// one shard per 1,024 keys up to 64, so that many small keyed limiters
// stay cheap: 1,000 of them with max_keys 10 take under 2 KB each
// (measured: about 1 KB, tables, definition and the store's entry) before
// any key is used.
func TestKeyedLimiterCost(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		t.Run(string(alg), func(t *testing.T) {
			const n = 1000
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("per-user-%04d", i)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s := memory.New(nil, 0)
			for _, name := range names {
				putDef(t, s, limiter.Definition{Name: name, Policy: limiter.Policy{Limit: 10, Period: time.Minute, Algorithm: alg}, Keyed: true, MaxKeys: 10})
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
			t.Logf("%d bytes per keyed limiter of max_keys 10", per)
			if per > 2048 {
				t.Errorf("a keyed limiter of max_keys 10 takes %d bytes, want at most 2048", per)
			}
			runtime.KeepAlive(s)
		})
	}
}

// TestKeyedSettlementWithoutRoom: a settlement that must charge a key its
// limiter has since forgotten, while the limiter holds max_keys limited
// keys, settles nothing and keeps the reservation; once room can be made
// it settles.
func TestKeyedSettlementWithoutRoom(t *testing.T) {
	ctx := context.Background()
	s, c := newStore(t)
	putDef(t, s, limiter.Definition{Name: "tokens", Policy: limiter.Policy{Limit: 2, Period: time.Second}, Keyed: true, MaxKeys: 1})
	v, err := s.Reserve(ctx, []limiter.Item{{Name: "tokens", Key: "a", Permits: 1}}, time.Minute, "")
	if err != nil || !v.Allowed {
		t.Fatalf("reserve: %+v, %v", v, err)
	}
	id := v.Reservation
	c.Advance(time.Second) // a's bucket is full again: forgotten
	if d, err := s.AcquireKey(ctx, "tokens", "b", 2); err != nil || !d.Allowed {
		t.Fatalf("b takes the one room: %+v, %v", d, err)
	}
	settle := []limiter.Item{{Name: "tokens", Key: "a", Permits: 2}}
	v, err = s.Settle(ctx, id, settle, "")
	if err != nil || v.Allowed || !v.Checks[0].KeysFull || v.Checks[0].RetryAfter <= 0 {
		t.Fatalf("settle charging a forgotten key with no room: %+v, %v, want keys full", v, err)
	}
	c.Advance(time.Second / 2) // b regains a permit: it can be evicted
	v2, err := s.Settle(ctx, id, settle, "")
	if err != nil || !v2.Allowed || v2.Checks[0].Remaining != 1 {
		t.Fatalf("settle once b has a permit: %+v, %v, want the charge of 1 made, 1 left", v2, err)
	}
	if _, err := s.Settle(ctx, id, settle, ""); !errors.Is(err, limiter.ErrReservationNotFound) {
		t.Errorf("settle again: %v, want ErrReservationNotFound", err)
	}
}
