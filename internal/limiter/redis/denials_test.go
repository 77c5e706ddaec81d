package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// refLimiter is the brute-force reference of one plain limiter, in whole
// microseconds: GCRA as a TAT, or a sliding log as one instant per permit
// granted.
type refLimiter struct {
	gcra     bool
	capacity int64 // GCRA: burst; log: permits per window
	interval int64 // GCRA: µs per permit
	window   int64 // log: µs
	tat      int64
	grants   []int64 // log, oldest first
}

// avail is how many permits fit at now.
func (r *refLimiter) avail(now int64) int64 {
	if r.gcra {
		return max(0, r.capacity*r.interval-max(r.tat-now, 0)) / r.interval
	}
	n := int64(0)
	for _, g := range r.grants {
		if g > now-r.window {
			n++
		}
	}
	return max(0, r.capacity-n)
}

// until is how long from now until n permits fit, if nobody takes any,
// found by trying every instant at which the answer can change; -1 when
// they never fit.
func (r *refLimiter) until(now, n int64) int64 {
	if n > r.capacity {
		return -1
	}
	if r.gcra {
		return max(0, r.tat-now-(r.capacity-n)*r.interval)
	}
	if r.avail(now) >= n {
		return 0
	}
	for _, g := range r.grants {
		if at := g + r.window; at > now && r.avail(at) >= n {
			return at - now
		}
	}
	return -1
}

func (r *refLimiter) take(now, n int64) {
	if r.gcra {
		r.tat = max(r.tat, now) + n*r.interval
		return
	}
	for range n {
		r.grants = append(r.grants, now)
	}
}

// refund gives n permits back, never beyond full: a log gives back its
// newest grants.
func (r *refLimiter) refund(now, n int64) {
	if r.gcra {
		r.tat = max(now, r.tat-n*r.interval)
		return
	}
	r.grants = r.grants[:max(0, len(r.grants)-int(n))]
}

// next is decide.lua's next: how long until one permit more than what fits
// at now fits, for a GCRA bucket that is not full; for a sliding log
// with nothing left, until its oldest grant in the window leaves it. -1
// otherwise.
func (r *refLimiter) next(now int64) int64 {
	rem := r.avail(now)
	if r.gcra {
		if rem >= r.capacity {
			return -1
		}
		return r.until(now, rem+1)
	}
	if rem > 0 {
		return -1
	}
	for _, g := range r.grants {
		if g > now-r.window {
			return g + r.window - now
		}
	}
	return -1
}

// denialsModel drives a denial cache with the replies a reference store
// gives, at instants it chooses, and holds every verdict the cache makes
// alone to the reference.
type denialsModel struct {
	t     testing.TB
	now   int64 // µs
	d     *denials
	ref   map[string]*refLimiter
	names []string
	local int
}

func newDenialsModel(t testing.TB, size int) *denialsModel {
	m := &denialsModel{t: t, now: 1_000_000, ref: map[string]*refLimiter{}, names: []string{"g", "l"}}
	m.d = newDenials(size, func() time.Time { return time.UnixMicro(m.now) })
	m.reset()
	return m
}

func (m *denialsModel) reset(names ...string) {
	if len(names) == 0 {
		names = m.names
	}
	for _, name := range names {
		if name == "g" {
			m.ref[name] = &refLimiter{gcra: true, capacity: 3, interval: 1000}
		} else {
			m.ref[name] = &refLimiter{capacity: 3, window: 5000}
		}
	}
}

// decide makes a decision through the cache, asking the reference when
// the cache does not answer: the request is sent at the current instant
// and decided lat microseconds later.
func (m *denialsModel) decide(items []limiter.Item, mode limiter.Mode, lat int64) {
	m.t.Helper()
	parts, index := limiter.Parts(items)
	v, wait, done, gen := m.d.decide(items, parts, index)
	if wait != nil {
		m.t.Fatalf("at %d µs: a decision waits for a flight, with none in flight", m.now)
	}
	if v != nil {
		m.local++
		if v.Allowed || !v.Local {
			m.t.Fatalf("at %d µs: the cache answered %+v, want a local denial", m.now, *v)
		}
		denied := false
		for j, p := range parts {
			c := v.Checks[slices.Index(index, j)]
			if c.Fits {
				continue
			}
			denied = true
			if a := m.ref[p.Name].avail(m.now); a >= p.Permits {
				m.t.Fatalf("at %d µs: the cache denied %d permits of %q, which has %d: the reference grants them", m.now, p.Permits, p.Name, a)
			}
			if c.RetryAfter <= 0 {
				m.t.Fatalf("at %d µs: a local denial of %q says retry after %v", m.now, p.Name, c.RetryAfter)
			}
		}
		if !denied {
			m.t.Fatalf("at %d µs: a local denial names no check that does not fit: %+v", m.now, *v)
		}
		return
	}
	sent := time.UnixMicro(m.now)
	m.now += lat
	found := make([]limiter.Check, len(parts))
	next := make([]time.Duration, len(parts))
	all := true
	for j, p := range parts {
		r := m.ref[p.Name]
		c := limiter.Check{Fits: r.avail(m.now) >= p.Permits, ExceedsCapacity: p.Permits > r.capacity, Limit: 3}
		if !c.Fits && !c.ExceedsCapacity {
			c.RetryAfter = time.Duration(r.until(m.now, p.Permits)) * time.Microsecond
		}
		all = all && c.Fits
		found[j] = c
	}
	for j, p := range parts {
		r := m.ref[p.Name]
		if all && mode == limiter.Take {
			r.take(m.now, p.Permits)
		}
		found[j].Remaining = r.avail(m.now)
		next[j] = time.Duration(r.next(m.now)) * time.Microsecond
	}
	m.d.learn(parts, found, next, sent, gen)
	done(nil)
}

// run makes steps random moves, drawn from src.
func (m *denialsModel) run(src func(n int) int, steps int) {
	for range steps {
		switch op := src(20); {
		case op < 4:
			m.now += int64(src(3000))
		case op < 6:
			// To just before, at and after the instant an entry stops
			// proving a denial.
			for _, keys := range m.d.byName {
				for _, e := range keys {
					if e.n > 0 {
						m.now = max(m.now, e.sent.UnixMicro()+e.wait.Microseconds()+int64(src(5))-2)
					}
				}
			}
		case op < 14:
			items := []limiter.Item{{Name: m.names[src(2)], Permits: 1 + int64(src(4))}}
			if src(3) == 0 {
				items = append(items, limiter.Item{Name: m.names[src(2)], Permits: 1 + int64(src(2))})
			}
			mode := limiter.Take
			if src(5) == 0 {
				mode = limiter.Peek
			}
			m.decide(items, mode, int64(src(3)*src(200)))
		case op < 17:
			// Another replica takes permits: the cache never hears of it.
			name := m.names[src(2)]
			if r := m.ref[name]; r.avail(m.now) > 0 {
				r.take(m.now, 1)
			}
		case op < 19:
			// A refund through this replica, while a decision that was sent
			// before it returns after it.
			name := m.names[src(2)]
			items := []limiter.Item{{Name: name, Permits: 1}}
			parts, _ := limiter.Parts(items)
			_, _, done, gen := m.d.decide(items, parts, []int{0})
			m.ref[name].refund(m.now, 1+int64(src(3)))
			m.d.forget(items)
			if done != nil {
				found := []limiter.Check{{Limit: 3, Fits: false, Remaining: 0}}
				m.d.learn(parts, found, []time.Duration{time.Hour}, time.UnixMicro(m.now), gen)
				done(nil)
			}
		default:
			// A new policy through this replica starts the limiter full.
			name := m.names[src(2)]
			m.reset(name)
			m.d.forget(nil, name)
		}
	}
}

// TestDenialsMatchReference holds the denial cache to the reference: every
// decision it answers alone, the reference denies too, under traffic it
// does not see, refunds and new policies, with a cache that is often full.
func TestDenialsMatchReference(t *testing.T) {
	local := 0
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		m := newDenialsModel(t, 1+int(seed%3))
		m.run(rng.IntN, 2000)
		local += m.local
	}
	if local < 1000 {
		t.Errorf("the cache answered %d decisions alone in 40,000 steps: too few for the test to mean anything", local)
	}
	t.Logf("%d decisions answered by the cache alone", local)
}

// FuzzDenials is TestDenialsMatchReference driven by the fuzzer's bytes.
func FuzzDenials(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19})
	f.Add([]byte("\x0a\x01\x00\x03\x0a\x01\x00\x03\x05\x0b\x01\x00\x00\x02\x0c\x00\x01\x00\x04"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := newDenialsModel(t, 1+len(b)%3)
		i := 0
		src := func(n int) int {
			if i >= len(b) {
				return 0
			}
			i++
			return int(b[i-1]) % n
		}
		m.run(src, len(b))
	})
}

// TestDenialsAgainstRedis holds the denial cache to Redis itself: random
// decisions at explicit instants through a Store with the cache, over
// plain and keyed limiters of both algorithms, with keys evicted, while
// another Store on the same prefix takes permits the cache never sees;
// every decision the cache answers alone is asked of Redis too, through
// the other Store, as a Peek at the same instant, which must deny it and
// find short every item the cache found short.
func TestDenialsAgainstRedis(t *testing.T) {
	c := newClient(t, redistest.Standalone(t))
	ctx := context.Background()
	local, asked := 0, 0
	for seed := range uint64(6) {
		s := newStore(t, c)
		other, err := New(c, s.prefix, 0)
		if err != nil {
			t.Fatal(err)
		}
		now := int64(epochUS)
		s.denials = newDenials(1+int(seed%3)*8, func() time.Time { return time.UnixMicro(now) })
		defs := []limiter.Definition{
			{Name: "pg", Group: "d", Policy: limiter.Policy{Limit: 3, Period: 3 * time.Millisecond}},
			{Name: "pl", Group: "d", Policy: limiter.Policy{Limit: 3, Period: 5 * time.Millisecond, Algorithm: limiter.SlidingLog}},
			{Name: "kg", Group: "d", Keyed: true, MaxKeys: 2, Policy: limiter.Policy{Limit: 3, Period: 4 * time.Millisecond, Burst: 2}},
			{Name: "kl", Group: "d", Keyed: true, MaxKeys: 2, Policy: limiter.Policy{Limit: 2, Period: 4 * time.Millisecond, Algorithm: limiter.SlidingLog}},
		}
		for _, def := range defs {
			if _, err := s.Put(ctx, def); err != nil {
				t.Fatal(err)
			}
		}
		rng := rand.New(rand.NewPCG(seed, 11))
		item := func() limiter.Item {
			def := defs[rng.IntN(len(defs))]
			it := limiter.Item{Name: def.Name, Permits: 1 + rng.Int64N(3)}
			if def.Keyed {
				it.Key = string(rune('a' + rng.IntN(3)))
			}
			return it
		}
		for step := range 1500 {
			switch op := rng.IntN(20); {
			case op < 5:
				now += rng.Int64N(2500)
			case op < 15:
				items := []limiter.Item{item()}
				if rng.IntN(3) == 0 {
					items = append(items, item())
				}
				mode := limiter.Take
				if rng.IntN(5) == 0 {
					mode = limiter.Peek
				}
				v, err := s.decideMode(ctx, items, mode, "", us(now))
				if err != nil {
					t.Fatalf("seed %d, step %d: %v", seed, step, err)
				}
				if !v.Local {
					asked++
					continue
				}
				local++
				peek, err := other.decideAt(ctx, items, call{mode: "peek"}, us(now))
				if err != nil {
					t.Fatal(err)
				}
				if v.Allowed || peek.Allowed {
					t.Fatalf("seed %d, step %d: %v: the cache answered %+v, Redis %+v", seed, step, items, v, peek)
				}
				for i, ch := range v.Checks {
					if !ch.Fits && peek.Checks[i].Fits {
						t.Fatalf("seed %d, step %d: item %d of %v: the cache found it short, Redis finds it fits: %+v", seed, step, i, items, peek.Checks[i])
					}
				}
			case op < 18:
				if _, err := other.decideAt(ctx, []limiter.Item{item()}, call{mode: "take"}, us(now)); err != nil {
					t.Fatal(err)
				}
			case op < 19:
				if _, err := s.decideMode(ctx, []limiter.Item{item()}, limiter.Refund, "", us(now)); err != nil {
					t.Fatal(err)
				}
			default:
				def := defs[rng.IntN(len(defs))]
				def.Policy.Limit = 2 + rng.Int64N(2)
				if def.Policy.Burst > 0 {
					def.Policy.Burst = def.Policy.Limit
				}
				if _, err := s.Put(ctx, def); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if local < 500 {
		t.Errorf("the cache answered %d decisions alone (%d asked of Redis): too few for the test to mean anything", local, asked)
	}
	t.Logf("%d decisions answered by the cache alone and confirmed by Redis; %d asked of Redis", local, asked)
}

// TestDenialsAcrossReplicas: three Stores with the cache on one prefix, on
// one Redis server and on a three-master Cluster, take from a plain
// limiter and a key of a keyed one that nothing refills while the test
// runs, far more often than their limits allow. Exactly the limit is
// granted on each, so the cache denied nothing that Redis would have
// granted and nothing was taken twice, and most denials never reached
// Redis.
func TestDenialsAcrossReplicas(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) { testDenialsAcrossReplicas(t, newClient(t, redistest.Standalone(t))) })
	t.Run("Cluster", func(t *testing.T) { testDenialsAcrossReplicas(t, newClient(t, redistest.Cluster(t)...)) })
}

func testDenialsAcrossReplicas(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	stores := newReplicas(t, c, 3)
	for _, s := range stores {
		s.CacheDenials(100)
	}
	const limit = 40
	slow := limiter.Policy{Limit: limit, Period: limiter.MaxPeriod}
	for _, def := range []limiter.Definition{
		{Name: "plain", Group: "r", Policy: slow},
		{Name: "keyed", Group: "r", Keyed: true, Policy: slow},
	} {
		if _, err := stores[0].Put(ctx, def); err != nil {
			t.Fatal(err)
		}
	}
	cases := [][]limiter.Item{
		{{Name: "plain", Permits: 1}},
		{{Name: "keyed", Key: "abuser", Permits: 1}},
		{{Name: "plain", Permits: 1}, {Name: "keyed", Key: "other", Permits: 1}},
	}
	var granted [3]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for _, s := range stores {
		for w := range 4 {
			wg.Go(func() {
				for n := range 500 {
					k := (n + w) % len(cases)
					v, err := s.Decide(ctx, cases[k], limiter.Take, "")
					if err != nil {
						errs <- err
						return
					}
					if v.Allowed {
						granted[k].Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := granted[0].Load() + granted[2].Load(); got != limit {
		t.Errorf("the plain limiter granted %d, want exactly its limit %d", got, limit)
	}
	if got := granted[1].Load(); got != limit {
		t.Errorf("key abuser granted %d, want exactly its limit %d", got, limit)
	}
	a, err := stores[1].Available(ctx, "plain")
	if err != nil || a.Remaining != 0 {
		t.Errorf("plain has %d left (%v), want 0", a.Remaining, err)
	}
	for key, want := range map[string]int64{"abuser": 0, "other": limit - granted[2].Load()} {
		ka, err := stores[2].AvailableKey(ctx, "keyed", key)
		if err != nil || ka.Remaining != want {
			t.Errorf("key %s has %d left (%v), want %d: a denied decision took permits, or a granted one did not", key, ka.Remaining, err, want)
		}
	}
	local := uint64(0)
	for _, s := range stores {
		local += s.LocalDenials()
	}
	if local < 3000 {
		t.Errorf("the caches answered %d of 6,000 decisions alone, want most of them", local)
	}
	t.Logf("granted %d, %d, %d; %d decisions answered by the caches alone", granted[0].Load(), granted[1].Load(), granted[2].Load(), local)
}

// BenchmarkDenialsEntry reports the heap one entry of the denial cache
// takes: a key of a keyed limiter of 16 bytes, learnt from a Take.
func BenchmarkDenialsEntry(b *testing.B) {
	const n = 100_000
	keys := make([]limiter.Item, n)
	for i := range keys {
		keys[i] = limiter.Item{Name: "envoy.remote_address.0123456789ab", Key: fmt.Sprintf("10.%03d.%03d.%03d:1", i>>16, i>>8&255, i&255), Permits: 1}
	}
	found := []limiter.Check{{Limit: 10}}
	next := []time.Duration{time.Second}
	var before, after runtime.MemStats
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&before)
		d := newDenials(n, time.Now)
		now := time.Now()
		for i := range keys {
			d.learn(keys[i:i+1], found, next, now, 0)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/entry")
		runtime.KeepAlive(d)
	}
}
