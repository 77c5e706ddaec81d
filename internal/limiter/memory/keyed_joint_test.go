package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/keystest"
)

// jointLimiter is one limiter of the joint property test and its model: a
// keyed limiter is a keystest.Model of its keys; a plain one is a model
// of one key that is never evicted.
type jointLimiter struct {
	name    string
	p       limiter.Policy
	keyed   bool
	maxKeys int
	m       *keystest.Model
}

func (l *jointLimiter) capacity() int64 {
	if p := l.p.Normalize(); p.Algorithm == limiter.GCRA {
		return p.Burst
	}
	return l.p.Limit
}

// modelKey is the key of an item in its limiter's model.
func modelKey(it limiter.Item) string {
	if it.Key == "" {
		return "plain"
	}
	return it.Key
}

// TestKeyedDecideMatchesModel makes random joint decisions (Take and Peek)
// over plain and keyed limiters of one group, keys of a keyed limiter
// possibly repeated, and holds every verdict to the models: allowed
// exactly when every (limiter, key) fits the sum asked of it, then every
// one charged at that instant and otherwise none; each item's Fits,
// ExceedsCapacity and Remaining as the model has them. With a bound of
// keys small enough to be reached, a decision names one key per keyed
// limiter, and the models evict as the tables do.
func TestKeyedDecideMatchesModel(t *testing.T) {
	for _, bounded := range []bool{false, true} {
		for seed := range uint64(6) {
			t.Run(fmt.Sprintf("bounded=%v/seed=%d", bounded, seed), func(t *testing.T) { runKeyedJoint(t, bounded, seed) })
		}
	}
}

func runKeyedJoint(t *testing.T, bounded bool, seed uint64) {
	ctx := context.Background()
	s, c := newStore(t)
	maxKeys := 100_000 // 64 shards: keys of one limiter in several
	if bounded {
		maxKeys = 3
	}
	ls := []*jointLimiter{
		{name: "plain-gcra", p: limiter.Policy{Limit: 10, Period: 10 * time.Second}},
		{name: "plain-log", p: limiter.Policy{Limit: 7, Period: 3 * time.Second, Algorithm: limiter.SlidingLog}},
		{name: "per-user", p: limiter.Policy{Limit: 5, Period: 5 * time.Second, Burst: 4}, keyed: true, maxKeys: maxKeys},
		{name: "per-ip", p: limiter.Policy{Limit: 4, Period: 2 * time.Second, Algorithm: limiter.SlidingLog}, keyed: true, maxKeys: maxKeys},
	}
	for _, l := range ls {
		putDef(t, s, limiter.Definition{Name: l.name, Policy: l.p, Group: "g", Keyed: l.keyed, MaxKeys: l.maxKeys})
		if l.keyed {
			l.m = keystest.NewModel(l.p, l.maxKeys)
		} else {
			l.m = keystest.NewModel(l.p, 1)
		}
	}
	keys := []string{"a", "b", "c", "d", "e", "f"}
	rng := rand.New(rand.NewPCG(seed, 0xbee))
	allowedTakes := 0
	var history []string
	defer func() {
		if t.Failed() {
			for _, h := range history {
				t.Log(h)
			}
		}
	}()
	for step := range 3000 {
		if rng.IntN(6) == 0 {
			c.Advance(time.Duration(rng.Int64N(int64(2 * time.Second))))
			continue
		}
		now := limiter.Nanos(c.Wall())
		var items []limiter.Item
		used := map[string]string{} // keyed limiter -> its one key, when bounded
		for range 1 + rng.IntN(4) {
			l := ls[rng.IntN(len(ls))]
			it := limiter.Item{Name: l.name, Permits: 1 + rng.Int64N(l.capacity())}
			if l.keyed {
				it.Key = keys[rng.IntN(len(keys))]
				if k, ok := used[l.name]; ok && bounded {
					it.Key = k
				}
				used[l.name] = it.Key
			}
			items = append(items, it)
		}
		mode := limiter.Take
		if rng.IntN(4) == 0 {
			mode = limiter.Peek
		}
		v, err := s.Decide(ctx, items, mode, "")
		if err != nil {
			t.Fatalf("step %d: Decide(%+v): %v", step, items, err)
		}
		history = append(history, fmt.Sprintf("%d %s %+v -> %v %+v", step, mode, items, v.Allowed, v.Checks))
		if len(history) > 40 {
			history = history[1:]
		}
		parts, index := limiter.Parts(items)
		byName := map[string]*jointLimiter{}
		for _, l := range ls {
			byName[l.name] = l
		}
		allowed := true
		fits := make([]bool, len(parts))
		for j, p := range parts {
			l := byName[p.Name]
			av, full := l.m.Available(modelKey(p), now)
			fits[j] = !full && p.Permits <= l.capacity() && av.Remaining >= p.Permits
			allowed = allowed && fits[j]
		}
		if v.Allowed != allowed {
			t.Fatalf("step %d: %s %+v: allowed %v, model %v\n%+v", step, mode, items, v.Allowed, allowed, v.Checks)
		}
		if allowed && mode == limiter.Take {
			allowedTakes++
			for _, p := range parts {
				if d, _ := byName[p.Name].m.Acquire(modelKey(p), now, p.Permits); !d.Allowed {
					t.Fatalf("step %d: the model denies %+v, which fit", step, p)
				}
			}
		}
		for i, ch := range v.Checks {
			p := parts[index[i]]
			l := byName[p.Name]
			if ch.Name != items[i].Name || ch.Key != items[i].Key || ch.Permits != items[i].Permits {
				t.Fatalf("step %d: check %d is %+v, want item %+v", step, i, ch, items[i])
			}
			av, full := l.m.Available(modelKey(p), now)
			if full {
				if ch.Fits || !ch.KeysFull && !ch.ExceedsCapacity {
					t.Fatalf("step %d: %+v of a key with no room: got %+v", step, p, ch)
				}
				continue
			}
			if ch.Fits != fits[index[i]] || ch.ExceedsCapacity != (p.Permits > l.capacity()) || ch.Remaining != av.Remaining {
				t.Fatalf("step %d: %s %+v (allowed %v): check %+v, model fits %v, remaining %d", step, mode, p, allowed, ch, fits[index[i]], av.Remaining)
			}
		}
		// Now and then every remembered key's availability, through the API.
		if step%50 == 0 {
			for _, l := range ls {
				for _, k := range keys {
					if !l.keyed {
						k = ""
					}
					want, full := l.m.Available(modelKey(limiter.Item{Key: k}), now)
					var got limiter.Availability
					if l.keyed {
						ka, err := s.AvailableKey(ctx, l.name, k)
						if err != nil {
							t.Fatal(err)
						}
						got = ka.Availability
						if ka.KeysFull != full {
							t.Fatalf("step %d: %s/%s: keys full %v, model %v", step, l.name, k, ka.KeysFull, full)
						}
					} else {
						got, _ = s.Available(ctx, l.name)
					}
					if got.Remaining != want.Remaining {
						t.Fatalf("step %d: %s/%q: %d left, model %d", step, l.name, k, got.Remaining, want.Remaining)
					}
				}
			}
		}
	}
	if allowedTakes < 300 {
		t.Errorf("only %d decisions were allowed: the sequence does not exercise grants", allowedTakes)
	}
}

// TestKeyedDecideConcurrent runs joint decisions over a plain limiter and
// keys of two keyed limiters from many goroutines, in every order (keys of
// one limiter share shards, and both limiters' shards are locked in one
// decision), and checks that what each bucket holds is exactly what
// the allowed decisions took: nothing over a limit, nothing taken by a
// denied decision. Periods are long enough that nothing refills.
func TestKeyedDecideConcurrent(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	const limit = 150
	p := limiter.Policy{Limit: limit, Period: 8784 * time.Hour, Algorithm: limiter.SlidingLog}
	putDef(t, s, limiter.Definition{Name: "global", Policy: limiter.Policy{Limit: 100_000, Period: 8784 * time.Hour}, Group: "g"})
	putDef(t, s, limiter.Definition{Name: "per-user", Policy: p, Group: "g", Keyed: true, MaxKeys: 100_000}) // 64 shards
	putDef(t, s, limiter.Definition{Name: "per-ip", Policy: p, Group: "g", Keyed: true, MaxKeys: 1000})
	users, ips := []string{"u1", "u2", "u3"}, []string{"10.0.0.1", "10.0.0.2"}
	var (
		mu      sync.Mutex
		granted = map[string]int64{}
		wg      sync.WaitGroup
	)
	for w := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 300 {
				u, ip := users[rng.IntN(len(users))], ips[rng.IntN(len(ips))]
				items := []limiter.Item{{Name: "per-ip", Key: ip, Permits: 1}, {Name: "global", Permits: 1}, {Name: "per-user", Key: u, Permits: 1}}
				rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
				v, err := s.Decide(ctx, items, limiter.Take, "")
				if err != nil {
					t.Error(err)
					return
				}
				if v.Allowed {
					mu.Lock()
					granted["per-user/"+u]++
					granted["per-ip/"+ip]++
					granted["global"]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, u := range users {
		a, _ := s.AvailableKey(ctx, "per-user", u)
		if used := limit - a.Remaining; used != granted["per-user/"+u] {
			t.Errorf("per-user/%s: %d taken, %d granted by allowed decisions", u, used, granted["per-user/"+u])
		}
	}
	for _, ip := range ips {
		a, _ := s.AvailableKey(ctx, "per-ip", ip)
		if used := limit - a.Remaining; used != granted["per-ip/"+ip] || used > limit {
			t.Errorf("per-ip/%s: %d taken, %d granted by allowed decisions (limit %d)", ip, used, granted["per-ip/"+ip], limit)
		}
	}
	a, _ := s.Available(ctx, "global")
	if used := 100_000 - a.Remaining; used != granted["global"] {
		t.Errorf("global: %d taken, %d granted", used, granted["global"])
	}
	if granted["global"] != 2*limit {
		t.Errorf("%d decisions allowed, want %d: the two IPs' limits bind first", granted["global"], 2*limit)
	}
}
