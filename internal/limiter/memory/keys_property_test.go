package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/keystest"
)

// propertyKeys are opaque keys of many shapes: empty-adjacent lengths,
// keys that are prefixes of others (bytewise order must put "a" before
// "a\x00" before "ab"), bytes above 0x7f, and long keys that fill arenas
// quickly so that they are compacted.
func propertyKeys(rng *rand.Rand, n int) []string {
	keys := []string{"a", "a\x00", "ab", "b", "\xff", "\xff\xff", "user-1", "user-10", "user-2", strings.Repeat("k", 256)}
	seen := map[string]bool{}
	for _, k := range keys {
		seen[k] = true
	}
	for len(keys) < n {
		var k string
		switch rng.IntN(3) {
		case 0:
			k = fmt.Sprintf("user-%d", rng.IntN(n*4))
		case 1:
			k = strings.Repeat("x", 1+rng.IntN(255)) + fmt.Sprint(rng.IntN(10))
		default:
			b := make([]byte, 1+rng.IntN(16))
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			k = string(b)
		}
		if len(k) <= 256 && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys
}

var keysPolicies = []struct {
	p   limiter.Policy
	max int
}{
	{limiter.Policy{Limit: 5, Period: time.Second}, 1_000_000},
	{limiter.Policy{Limit: 7, Period: time.Second}, 1_000_000},                      // fractional TATs
	{limiter.Policy{Limit: 3, Period: 100 * time.Millisecond, Burst: 2}, 1_000_000}, // burst below limit
	{limiter.Policy{Limit: 1_000_000_000, Period: time.Millisecond}, 1_000_000},     // sub-nanosecond interval
	{limiter.Policy{Limit: 4, Period: time.Second}, 5},                              // eviction
	{limiter.Policy{Limit: 7, Period: time.Second, Burst: 3}, 1},                    // a single key
	{limiter.Policy{Limit: 5, Period: time.Second, Algorithm: limiter.SlidingLog}, 1_000_000},
	{limiter.Policy{Limit: 3, Period: 250 * time.Millisecond, Algorithm: limiter.SlidingLog}, 1_000_000},
	{limiter.Policy{Limit: 4, Period: time.Second, Algorithm: limiter.SlidingLog}, 5},
	{limiter.Policy{Limit: 2, Period: time.Second, Algorithm: limiter.SlidingLog}, 1},
}

// TestKeysMatchReference holds Keys to the reference model under random
// sequences of acquisitions, availability queries, Lowest and time steps,
// over opaque keys: every answer must be the model's, and the table's
// invariants (index bounds, arena accounting, counts) must hold throughout.
func TestKeysMatchReference(t *testing.T) {
	for pi, tc := range keysPolicies {
		for _, nkeys := range []int{24, 3000} {
			for seed := range uint64(2) {
				steps := 4000
				if nkeys > 100 {
					steps = 20_000
					if raceEnabled {
						steps /= 4
					}
				}
				name := fmt.Sprintf("%d/%s/max=%d/keys=%d/seed=%d", pi, tc.p.Normalize().Algorithm, tc.max, nkeys, seed)
				t.Run(name, func(t *testing.T) { runKeysAgainstModel(t, tc.p, tc.max, nkeys, seed, steps) })
			}
		}
	}
}

func runKeysAgainstModel(t *testing.T, p limiter.Policy, maxKeys, nkeys int, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, uint64(nkeys)))
	keys := propertyKeys(rng, nkeys)
	ks := NewKeys(p, maxKeys)
	m := keystest.NewModel(p, maxKeys)
	p = p.Normalize()
	capacity := p.Burst
	if p.Algorithm == limiter.SlidingLog {
		capacity = p.Limit
	}
	now := int64(1_700_000_000) * int64(time.Second)
	interval := int64(p.Period) / p.Limit
	for i := range steps {
		key := keys[rng.IntN(len(keys))]
		switch x := rng.IntN(100); {
		case x < 10:
			switch y := rng.IntN(100); {
			case y < 40:
			case y < 50:
				now++
			case y < 75:
				now += rng.Int64N(interval + 1)
			case y < 97:
				now += rng.Int64N(int64(p.Period))
			default:
				now += int64(p.Period) + rng.Int64N(int64(p.Period))
			}
		case x < 20:
			k := 1 + rng.IntN(40)
			got, err := ks.Lowest(context.Background(), now, k)
			if err != nil {
				t.Fatal(err)
			}
			want := m.Lowest(now, k)
			if len(got) != len(want) {
				t.Fatalf("step %d: Lowest(%d) has %d entries, want %d\n got %+v\nwant %+v", i, k, len(got), len(want), got, want)
			}
			for j := range want {
				if got[j].Key != want[j].Key || got[j].Availability != want[j].Availability {
					t.Fatalf("step %d: Lowest(%d)[%d] = %+v, want %+v", i, k, j, got[j], want[j])
				}
			}
		case x < 35:
			got, gotFull := ks.Available(key, now)
			want, wantFull := m.Available(key, now)
			if got != want || gotFull != wantFull {
				t.Fatalf("step %d: Available(%q) = %+v, %v; want %+v, %v", i, key, got, gotFull, want, wantFull)
			}
		default:
			n := 1 + rng.Int64N(min(capacity, int64(1)<<rng.IntN(31)))
			if rng.IntN(20) == 0 && capacity < limiter.MaxLimit {
				n = capacity + 1
			}
			got, gotFull := ks.Acquire(key, now, n)
			want, wantFull := m.Acquire(key, now, n)
			if got != want || gotFull != wantFull {
				t.Fatalf("step %d: Acquire(%q, %d) = %+v, %v; want %+v, %v", i, key, n, got, gotFull, want, wantFull)
			}
		}
		s := ks.Stats()
		if s.Keys > maxKeys || s.IndexEntries < s.Keys {
			t.Fatalf("step %d: Stats() = %+v, want keys <= %d <= index entries", i, s, maxKeys)
		}
		if i%(5+len(keys)/20) == 0 || i == steps-1 {
			if err := ks.Check(); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if live := ks.Live(); live != s.Keys {
				t.Fatalf("step %d: Stats().Keys = %d, but the shards hold %d", i, s.Keys, live)
			}
			m.Prune(now)
			if s.Keys < m.Size() {
				t.Fatalf("step %d: Stats().Keys = %d, want at least the %d keys with permits taken", i, s.Keys, m.Size())
			}
		}
	}
}

// TestArenaCompacts cycles long keys between used and dropped, so that
// each comes back into the deleted slot it left (its home slot) and the
// table neither grows nor shrinks: only the arena records the churn, and it
// must be compacted to stay within the live keys' bytes plus as many again
// and minGarbage a shard.
func TestArenaCompacts(t *testing.T) {
	p := limiter.Policy{Limit: 1, Period: time.Second}
	ks := NewKeys(p, 1_000_000)
	now := int64(1_700_000_000) * int64(time.Second)
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("%0250d", i)
	}
	for range 5000 {
		for _, k := range keys {
			if d, _ := ks.Acquire(k, now, 1); !d.Allowed {
				t.Fatalf("Acquire(%q) denied a full bucket", k)
			}
		}
		now += int64(p.Period)
		for _, k := range keys {
			ks.Available(k, now) // drops the full buckets of its shard
		}
	}
	if err := ks.Check(); err != nil {
		t.Fatal(err)
	}
	st := ks.table.(*gcraTable)
	total := 0
	for i := range st.shards {
		total += len(st.shards[i].arena)
	}
	if limit := 2*len(keys)*250 + maxShards*(minGarbage+250); total > limit {
		t.Errorf("arenas hold %d bytes after 5000 cycles of %d keys of 250 bytes, want at most %d", total, len(keys), limit)
	}
}
