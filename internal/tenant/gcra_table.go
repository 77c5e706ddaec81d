package tenant

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The GCRA table keeps, per shard, an open-addressed hash table (linear
// probing, deleted slots marked and reclaimed by rebuilds) of slots
// {key, TAT} and, over the slots, a tree of bounds (see gcra_index.go): for
// every block of 8 slots, and every 8 nodes above, the earliest and latest
// TAT below. An acquisition rewrites its slot and the few bounds that change;
// Lowest walks the latest bounds down to the k latest TATs, and eviction and
// expiry walk the earliest ones. Nothing in the table is a pointer, so the
// garbage collector never scans it. A tenant costs a 24-byte slot plus
// 16 bytes of bounds per 8 slots (and 1/7 more above), divided by the load
// factor, which stays between 9/16 and 4/5: 33 to 47 bytes.

const (
	shardBits = 6
	numShards = 1 << shardBits

	// expirePerOp is how many tenants with a full bucket an operation drops
	// at most, so that none costs more than O(expirePerOp·log n).
	expirePerOp = 2

	// A shard's table is rebuilt when live plus deleted slots would
	// exceed 4/5 of it, or live ones fall below 1/5, and sized so that live
	// ones then fill 9/16 of it: probes stay short and memory stays
	// proportional to the tenants.
	maxLoadNum, maxLoadDen = 4, 5
	minLoadDen             = 5
	rebuiltNum, rebuiltDen = 9, 16
	minSlots               = fanout
)

const (
	slotEmpty uint32 = iota
	slotLive
	slotDeleted
)

// slot is one tenant's state: 24 bytes, its TAT kept as two fields so that
// the state fits in what would otherwise be padding.
type slot struct {
	key   uint64
	ns    int64
	frac  uint32
	state uint32
}

func (sl *slot) tat() limiter.TAT { return limiter.TAT{NS: sl.ns, Frac: sl.frac} }

type gcraShard struct {
	mu     sync.Mutex
	blocks []block // the slots, 8 to a block, and level 0 of the index
	nslots int     // len(blocks) * fanout
	live   int     // slots holding a tenant
	used   int     // live plus deleted slots: a probe ends only at an empty slot
	levels [][]span

	// rootLo and rootHi copy the root bounds so that eviction and Lowest
	// pick shards without taking every lock.
	rootLo, rootHi atomic.Int64

	_ [64]byte // keeps neighbouring shards' locks off one cache line
}

type gcraStore struct {
	rate     limiter.Rate
	limit    int64
	interval time.Duration // see refillInterval
	seed     maphash.Seed
	admission
	shards [numShards]gcraShard
}

func newGCRAStore(p limiter.Policy, maxTenants int64) *gcraStore {
	st := &gcraStore{
		rate:     limiter.NewRate(p),
		limit:    p.Limit,
		interval: refillInterval(p),
		seed:     maphash.MakeSeed(),
	}
	st.max = maxTenants
	for i := range st.shards {
		st.shards[i].resize(minSlots)
	}
	return st
}

// hash is keyed with a per-registry random seed, so that nobody can choose
// addresses that pile up in one shard or one probe sequence.
func (st *gcraStore) hash(key uint64) uint64 { return maphash.Comparable(st.seed, key) }

// shard picks a shard from the low bits of h; home uses the high bits.
func (st *gcraStore) shard(h uint64) *gcraShard { return &st.shards[h&(numShards-1)] }

func (s *gcraShard) home(h uint64) int {
	i, _ := bits.Mul64(h, uint64(s.nslots))
	return int(i)
}

// resize replaces the table by an empty one of at least n slots; the index
// is left to buildLevels.
func (s *gcraShard) resize(n int) {
	s.blocks = make([]block, blocksFor(n))
	s.nslots = len(s.blocks) * fanout
	s.live, s.used = 0, 0
	s.buildLevels()
}

// find returns the slot holding key and true, or the slot where key would be
// inserted (the first deleted or empty slot of its probe sequence) and
// false. A probe ends at an empty slot; there always is one.
func (s *gcraShard) find(key, h uint64) (int, bool) { return s.findFrom(key, s.home(h)) }

func (s *gcraShard) findFrom(key uint64, home int) (int, bool) {
	free := -1
	for i := home; ; {
		sl := s.slot(i)
		switch sl.state {
		case slotEmpty:
			if free < 0 {
				free = i
			}
			return free, false
		case slotLive:
			if sl.key == key {
				return i, true
			}
		case slotDeleted:
			if free < 0 {
				free = i
			}
		}
		if i++; i == s.nslots {
			i = 0
		}
	}
}

func (st *gcraStore) acquire(key uint64, now, n int64) (limiter.Decision, bool) {
	h := st.hash(key)
	s := st.shard(h)
	s.mu.Lock()
	home := s.home(h)
	// Load the home block's span before probing: the load does not depend
	// on the probe, so the two cache misses overlap.
	bounds := s.blocks[home/fanout].span
	i, found := s.findFrom(key, home)
	if found {
		if i/fanout != home/fanout {
			bounds = s.blocks[i/fanout].span
		}
		d := s.takeWith(st, i, now, n, bounds)
		s.expire(st, now)
		s.mu.Unlock()
		return d, false
	}
	tat, d := st.rate.Acquire(limiter.TAT{}, now, n)
	if !d.Allowed {
		// Nothing to remember: a denial records nothing.
		s.mu.Unlock()
		return d, false
	}
	if st.reserve() {
		s.insert(st, key, h, i, tat, now)
		s.expire(st, now)
		s.mu.Unlock()
		return d, false
	}
	s.mu.Unlock()
	return st.admitAtBound(key, h, now, n)
}

// take acquires n permits from the tenant in slot i.
func (s *gcraShard) take(st *gcraStore, i int, now, n int64) limiter.Decision {
	return s.takeWith(st, i, now, n, s.blocks[i/fanout].span)
}

// takeWith is take given the span of slot i's block.
func (s *gcraShard) takeWith(st *gcraStore, i int, now, n int64, bounds span) limiter.Decision {
	sl := s.slot(i)
	old := sl.tat()
	tat, d := st.rate.Acquire(old, now, n)
	if d.Allowed {
		sl.ns, sl.frac = tat.NS, tat.Frac
		s.raised(i, old, tat, bounds)
	}
	return d
}

// insert remembers a new tenant in slot i (from find), for which room has
// been reserved. It rebuilds the table first when it would become too full.
func (s *gcraShard) insert(st *gcraStore, key, h uint64, i int, tat limiter.TAT, now int64) {
	if s.slot(i).state == slotEmpty && (s.used+1)*maxLoadDen > s.nslots*maxLoadNum {
		s.rebuild(st, now, s.live+1)
		i, _ = s.find(key, h)
	}
	if s.slot(i).state == slotEmpty {
		s.used++
	}
	*s.slot(i) = slot{key: key, ns: tat.NS, frac: tat.Frac, state: slotLive}
	s.live++
	s.added(i, tat)
}

// remove forgets the tenant in slot i. The caller accounts for the room it
// frees.
func (s *gcraShard) remove(i int) {
	s.slot(i).state = slotDeleted
	s.live--
	s.refresh(i / fanout)
}

// expire drops up to expirePerOp tenants whose bucket is full at now,
// earliest TAT first, and shrinks the table when it has become mostly
// empty.
func (s *gcraShard) expire(st *gcraStore, now int64) {
	dropped := 0
	for range expirePerOp {
		if s.root().lo > now {
			break // no TAT is at or before now
		}
		i := s.earliest()
		if i < 0 || !s.slot(i).tat().FullAt(now) {
			break
		}
		s.remove(i)
		dropped++
	}
	st.release(dropped)
	if dropped > 0 && s.nslots > minSlots && s.live*minLoadDen < s.nslots {
		s.rebuild(st, now, s.live)
	}
}

// rebuild rehashes the live tenants whose bucket is not full at now into a
// table sized for max(them, want), dropping deleted slots and full buckets.
func (s *gcraShard) rebuild(st *gcraStore, now int64, want int) {
	old := s.blocks
	keep := func(sl *slot) bool { return sl.state == slotLive && !sl.tat().FullAt(now) }
	kept := 0
	for b := range old {
		for i := range old[b].slots {
			if keep(&old[b].slots[i]) {
				kept++
			}
		}
	}
	st.release(s.live - kept)
	n := max(kept, want)
	s.blocks = make([]block, blocksFor(max(n*rebuiltDen/rebuiltNum+1, minSlots)))
	s.nslots = len(s.blocks) * fanout
	for b := range old {
		for i := range old[b].slots {
			sl := &old[b].slots[i]
			if keep(sl) {
				j, _ := s.find(sl.key, st.hash(sl.key))
				*s.slot(j) = *sl
			}
		}
	}
	s.live, s.used = kept, kept
	s.buildLevels()
}

// admitAtBound remembers a newcomer while the registry holds MaxTenants
// tenants, making room as Config.MaxTenants describes, or denies it. The
// room a victim frees passes straight to the newcomer, so the bound holds at
// every instant. When concurrent acquisitions keep changing the candidate,
// it gives up after maxVictimAttempts and denies with a RetryAfter of one
// permit's refill.
func (st *gcraStore) admitAtBound(key, h uint64, now, n int64) (limiter.Decision, bool) {
	for range maxVictimAttempts {
		vs, vkey, vtat, ok := st.victim()
		if !ok {
			continue // every unit of room is an insertion under way
		}
		vs.mu.Lock()
		i, found := vs.find(vkey, st.hash(vkey))
		if !found || vs.slot(i).tat() != vtat {
			vs.mu.Unlock() // it acquired meanwhile: look again
			continue
		}
		// A full bucket has permits left, so it is dropped here too.
		if st.rate.Available(vtat, now).Remaining == 0 {
			vs.mu.Unlock()
			_, vd := st.rate.Acquire(vtat, now, 1)
			return registryFull(n, st.limit, vd.RetryAfter), true
		}
		// The victim's unit of room passes to the newcomer.
		vs.remove(i)
		vs.mu.Unlock()

		s := st.shard(h)
		s.mu.Lock()
		i, found = s.find(key, h)
		if found {
			// Remembered meanwhile by a concurrent acquisition.
			st.release(1)
			d := s.take(st, i, now, n)
			s.mu.Unlock()
			return d, false
		}
		tat, d := st.rate.Acquire(limiter.TAT{}, now, n)
		s.insert(st, key, h, i, tat, now)
		s.mu.Unlock()
		return d, false
	}
	return registryFull(n, st.limit, st.interval), true
}

// victim finds the tenant Config.MaxTenants evicts first: the earliest TAT,
// and among equal TATs the largest key. Only shards whose earliest bound is
// the smallest can hold it.
func (st *gcraStore) victim() (s *gcraShard, key uint64, tat limiter.TAT, ok bool) {
	lo := int64(math.MaxInt64)
	empty := true
	for i := range st.shards {
		sh := &st.shards[i]
		if sh.rootHi.Load() == math.MinInt64 {
			continue
		}
		empty = false
		lo = min(lo, sh.rootLo.Load())
	}
	if empty {
		return nil, 0, limiter.TAT{}, false
	}
	for i := range st.shards {
		sh := &st.shards[i]
		if sh.rootHi.Load() == math.MinInt64 || sh.rootLo.Load() != lo {
			continue
		}
		sh.mu.Lock()
		if j := sh.earliest(); j >= 0 {
			sl := sh.slot(j)
			if !ok || evictsBefore(sl.tat(), sl.key, tat, key) {
				s, key, tat, ok = sh, sl.key, sl.tat(), true
			}
		}
		sh.mu.Unlock()
	}
	return s, key, tat, ok
}

// evictsBefore orders tenants for eviction: earliest TAT first, then largest
// key, the reverse of Lowest's order.
func evictsBefore(t limiter.TAT, k uint64, u limiter.TAT, l uint64) bool {
	if c := t.Compare(u); c != 0 {
		return c < 0
	}
	return k > l
}

func (st *gcraStore) available(key uint64, now int64) (limiter.Availability, bool) {
	h := st.hash(key)
	s := st.shard(h)
	s.mu.Lock()
	tat := limiter.TAT{}
	i, found := s.find(key, h)
	if found {
		tat = s.slot(i).tat()
	}
	s.expire(st, now)
	s.mu.Unlock()
	if found || st.count.Load() < st.max {
		return st.rate.Available(tat, now), false
	}
	return st.availableAtBound(now)
}

// availableAtBound is what admitAtBound would answer a newcomer asking for
// one permit, changing nothing: a full bucket when the tenant it would
// evict has a permit left, otherwise no permit until that tenant regains
// one. The victim is looked for without holding any shard's lock, as
// admitAtBound does.
func (st *gcraStore) availableAtBound(now int64) (limiter.Availability, bool) {
	_, _, vtat, ok := st.victim()
	if !ok || st.rate.Available(vtat, now).Remaining > 0 {
		return st.rate.Available(limiter.TAT{}, now), false
	}
	_, vd := st.rate.Acquire(vtat, now, 1)
	return registryFullAvailability(st.limit, vd.RetryAfter), true
}

// gcraRanked is a Lowest candidate.
type gcraRanked struct {
	tat limiter.TAT
	key uint64
}

// ranksBefore is Lowest's order: latest TAT first, then smallest key.
func ranksBefore(a, b gcraRanked) bool {
	if c := a.tat.Compare(b.tat); c != 0 {
		return c > 0
	}
	return a.key < b.key
}

func (st *gcraStore) lowest(_ context.Context, now int64, k int) ([]ranked, error) {
	// Visit shards latest bound first, so that the k-th best rises quickly
	// and prunes the other shards at their root: pop them from a max-heap.
	var roots rootHeap
	for i := range st.shards {
		if hi := st.shards[i].rootHi.Load(); hi > now {
			roots.items[roots.n] = shardRoot{hi, &st.shards[i]}
			roots.n++
		}
	}
	c := collector{now: now, floor: now + 1, top: newTopK(k, ranksBefore)}
	if roots.n >= k {
		// Bounds are exact, so each root's hi is the rounded-up TAT of a
		// tenant whose TAT lies after hi-1: at least k tenants lie after
		// the k-th largest root hi minus 1, and no subtree whose hi is
		// below that k-th hi can hold one of the k latest.
		var his [numShards]int64
		for i := range roots.n {
			his[i] = roots.items[i].hi
		}
		slices.Sort(his[:roots.n])
		c.floor = his[roots.n-k]
	}
	roots.init()
	for roots.n > 0 {
		r := roots.pop()
		if !c.mayRank(r.hi) {
			break
		}
		r.s.mu.Lock()
		r.s.collect(&c)
		r.s.mu.Unlock()
	}
	top := c.top
	best := top.sorted()
	out := make([]ranked, len(best))
	for i, b := range best {
		out[i] = ranked{key: b.key, av: st.rate.Available(b.tat, now)}
	}
	return out, nil
}

func (st *gcraStore) stats() Stats {
	s := Stats{Tenants: int(st.count.Load())}
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		s.IndexEntries += sh.used
		sh.mu.Unlock()
	}
	return s
}

// live counts the tenants the shards hold; at rest it equals count.
func (st *gcraStore) live() int {
	n := 0
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		n += sh.live
		sh.mu.Unlock()
	}
	return n
}

type shardRoot struct {
	hi int64
	s  *gcraShard
}

// rootHeap is a max-heap of shards by root hi.
type rootHeap struct {
	items [numShards]shardRoot
	n     int
}

func (h *rootHeap) init() {
	for i := h.n/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *rootHeap) pop() shardRoot {
	r := h.items[0]
	h.n--
	h.items[0] = h.items[h.n]
	h.down(0)
	return r
}

func (h *rootHeap) down(i int) {
	for {
		c := 2*i + 1
		if c >= h.n {
			return
		}
		if c+1 < h.n && h.items[c+1].hi > h.items[c].hi {
			c++
		}
		if h.items[i].hi >= h.items[c].hi {
			return
		}
		h.items[i], h.items[c] = h.items[c], h.items[i]
		i = c
	}
}
