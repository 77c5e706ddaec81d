package keystest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// JointBackend is a store that RunJoint drives at the instants it
// chooses, in whole microseconds since the Unix epoch (which every
// backend resolves), never running backwards.
type JointBackend interface {
	// Start is the first instant the backend can decide at.
	Start() int64
	Put(def limiter.Definition) error
	Decide(items []limiter.Item, mode limiter.Mode, nowUS int64) (limiter.Verdict, error)
	Available(name string, nowUS int64) (limiter.Availability, error)
	AvailableKey(name, key string, nowUS int64) (limiter.KeyAvailability, error)
}

// jointLimiter is one limiter of RunJoint and its model: a keyed limiter
// is a Model of its keys; a plain one is a model of one key that is never
// evicted.
type jointLimiter struct {
	name    string
	p       limiter.Policy
	keyed   bool
	maxKeys int
	m       *Model
}

// modelKey is the key of an item in its limiter's model.
func modelKey(it limiter.Item) string {
	if it.Key == "" {
		return "plain"
	}
	return it.Key
}

// Capacity is the most permits one acquisition under p can ever take.
func Capacity(p limiter.Policy) int64 {
	if p = p.Normalize(); p.Algorithm == limiter.GCRA {
		return p.Burst
	}
	return p.Limit
}

// RunJoint makes steps random joint decisions (Take and Peek) on b over
// plain and keyed limiters of one group, both algorithms, keys of a keyed
// limiter possibly repeated, and holds every verdict to the models:
// allowed exactly when every (limiter, key) fits the sum asked of it,
// then every one charged at that instant and otherwise none; each check's
// Fits, ExceedsCapacity, Remaining, Limit, ResetAfter and, when it does
// not fit, RetryAfter as the model has them; a key with no room reported
// KeysFull, with RetryAfter and ResetAfter the wait for room, unless more
// than its capacity is asked of it: then ExceedsCapacity, as an
// acquisition reports it. With a bound of keys small enough to be reached (bounded), a
// decision names one key per keyed limiter, and the models evict as the
// tables do. Every so often every key's availability is read too. The
// policies' periods are whole microseconds, so that every backend agrees
// with the model to the nanosecond.
func RunJoint(t *testing.T, b JointBackend, bounded bool, seed uint64, steps int) {
	maxKeys := 100_000
	if bounded {
		maxKeys = 3
	}
	ls := []*jointLimiter{
		{name: "plain-gcra", p: limiter.Policy{Limit: 10, Period: 10 * time.Second}},
		{name: "plain-log", p: limiter.Policy{Limit: 7, Period: 3 * time.Second, Algorithm: limiter.SlidingLog}},
		{name: "per-user", p: limiter.Policy{Limit: 5, Period: 5 * time.Second, Burst: 4}, keyed: true, maxKeys: maxKeys},
		{name: "per-ip", p: limiter.Policy{Limit: 4, Period: 2 * time.Second, Algorithm: limiter.SlidingLog}, keyed: true, maxKeys: maxKeys},
	}
	byName := map[string]*jointLimiter{}
	for _, l := range ls {
		def := limiter.Definition{Name: l.name, Policy: l.p, Group: "g"}
		l.m = NewModel(l.p, 1)
		if l.keyed {
			def.Keyed, def.MaxKeys = true, l.maxKeys
			l.m = NewModel(l.p, l.maxKeys)
		}
		if err := b.Put(def); err != nil {
			t.Fatalf("Put(%+v): %v", def, err)
		}
		byName[l.name] = l
	}
	keys := []string{"a", "user:{b}", "ключ", "}{", strings.Repeat("k", limiter.MaxKeyLen), "鍵🙂"}
	rng := rand.New(rand.NewPCG(seed, 0xbee))
	now := b.Start() + rng.Int64N(1e12)
	var allowedTakes, denied, keysFull, keysFullExceeding, evictions int
	var history []string
	defer func() {
		if t.Failed() {
			for _, h := range history {
				t.Log(h)
			}
		}
	}()
	for step := range steps {
		if rng.IntN(6) == 0 {
			now += rng.Int64N(2_000_000)
			continue
		}
		var items []limiter.Item
		used := map[string]string{} // keyed limiter -> its one key, when bounded
		for range 1 + rng.IntN(4) {
			l := ls[rng.IntN(len(ls))]
			it := limiter.Item{Name: l.name, Permits: 1 + rng.Int64N(Capacity(l.p))}
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
		v, err := b.Decide(items, mode, now)
		if err != nil {
			t.Fatalf("step %d: Decide(%+v): %v", step, items, err)
		}
		history = append(history, fmt.Sprintf("%d at %dµs: %s %+v -> %v %+v", step, now, mode, items, v.Allowed, v.Checks))
		if len(history) > 40 {
			history = history[1:]
		}
		parts, index := limiter.Parts(items)
		allowed := true
		fits := make([]bool, len(parts))
		for j, p := range parts {
			l := byName[p.Name]
			av, full := l.m.Available(modelKey(p), now*1000)
			fits[j] = !full && p.Permits <= Capacity(l.p) && av.Remaining >= p.Permits
			allowed = allowed && fits[j]
		}
		if v.Allowed != allowed {
			t.Fatalf("step %d at %dµs: %s %+v: allowed %v, model %v\n%+v", step, now, mode, items, v.Allowed, allowed, v.Checks)
		}
		if !allowed {
			denied++
		}
		if allowed && mode == limiter.Take {
			allowedTakes++
			for _, p := range parts {
				l := byName[p.Name]
				if bounded && l.keyed {
					// A key the model did not hold, granted while it held
					// its bound, evicts one.
					held := l.m.Lowest(now*1000, l.maxKeys)
					if len(held) == l.maxKeys && !slices.ContainsFunc(held, func(e Entry) bool { return e.Key == p.Key }) {
						evictions++
					}
				}
				if d, _ := l.m.Acquire(modelKey(p), now*1000, p.Permits); !d.Allowed {
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
			av, full := l.m.Available(modelKey(p), now*1000)
			if ch.Limit != l.p.Limit {
				t.Fatalf("step %d: %+v: limit %d, want %d", step, p, ch.Limit, l.p.Limit)
			}
			if full && p.Permits > Capacity(l.p) {
				// Told it exceeds the capacity, as an acquisition is, not
				// that its key has no room, and as a key not held: full.
				if ch.Fits || ch.KeysFull || !ch.ExceedsCapacity || ch.Remaining != Capacity(l.p) || ch.ResetAfter != 0 {
					t.Fatalf("step %d at %dµs: %s %+v above capacity, of a key with no room: got %+v", step, now, mode, p, ch)
				}
				keysFullExceeding++
				continue
			}
			if full {
				if ch.Fits || !ch.KeysFull {
					t.Fatalf("step %d at %dµs: %s %+v of a key with no room: got %+v", step, now, mode, p, ch)
				}
				if ch.KeysFull && (ch.Remaining != 0 || ch.RetryAfter != av.ResetAfter || ch.ResetAfter != av.ResetAfter) {
					t.Fatalf("step %d at %dµs: %s %+v of a key with no room: got %+v, want the wait for room %v", step, now, mode, p, ch, av.ResetAfter)
				}
				keysFull++
				continue
			}
			if ch.KeysFull {
				t.Fatalf("step %d at %dµs: %s %+v: keys full, but the model has room: %+v", step, now, mode, p, ch)
			}
			if ch.Fits != fits[index[i]] || ch.ExceedsCapacity != (p.Permits > Capacity(l.p)) || ch.Remaining != av.Remaining || ch.ResetAfter != av.ResetAfter {
				t.Fatalf("step %d at %dµs: %s %+v (allowed %v): check %+v, model fits %v, %+v", step, now, mode, p, allowed, ch, fits[index[i]], av)
			}
			var retry time.Duration
			if !ch.Fits && !ch.ExceedsCapacity {
				// The model's answer to the part alone, which does not fit:
				// a denial changes nothing.
				d, _ := l.m.Acquire(modelKey(p), now*1000, p.Permits)
				if d.Allowed {
					t.Fatalf("step %d: the model grants %+v, which did not fit", step, p)
				}
				retry = d.RetryAfter
			}
			if ch.RetryAfter != retry {
				t.Fatalf("step %d at %dµs: %s %+v: retry after %v, model %v", step, now, mode, p, ch.RetryAfter, retry)
			}
		}
		// Now and then every key's availability, through the Store.
		if step%50 == 0 {
			for _, l := range ls {
				for _, k := range keys {
					if !l.keyed {
						k = ""
					}
					want, full := l.m.Available(modelKey(limiter.Item{Key: k}), now*1000)
					if l.keyed {
						got, err := b.AvailableKey(l.name, k, now)
						if w := (limiter.KeyAvailability{Availability: want, KeysFull: full}); err != nil || got != w {
							t.Fatalf("step %d at %dµs: %s/%q: got %+v, %v, model %+v", step, now, l.name, k, got, err, w)
						}
						continue
					}
					got, err := b.Available(l.name, now)
					if err != nil || got != want {
						t.Fatalf("step %d at %dµs: %s: got %+v, %v, model %+v", step, now, l.name, got, err, want)
					}
					break
				}
			}
		}
	}
	t.Logf("%d steps: %d takes allowed (%d evicting a key), %d decisions denied, %d checks of keys with no room (and %d more above capacity)", steps, allowedTakes, evictions, denied, keysFull, keysFullExceeding)
	if allowedTakes < steps/10 || denied < steps/10 {
		t.Errorf("%d takes allowed and %d decisions denied in %d steps: the sequence does not exercise both", allowedTakes, denied, steps)
	}
	if bounded && (keysFull == 0 || evictions == 0) {
		t.Errorf("%d checks of keys with no room, %d evictions: the bound was not exercised", keysFull, evictions)
	}
}
