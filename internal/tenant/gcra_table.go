package tenant

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The GCRA table keeps, per shard, an open-addressed hash table of slots
// {key, TAT} and, over the slots, a tree of bounds (see gcra_index.go): for
// every block of fanout slots, and every block of fanout blocks above it, the
// earliest and latest TAT below. An acquisition rewrites its slot and the
// few bounds that change; Lowest walks the latest bounds down to the k latest
// TATs, and eviction and expiry walk the earliest ones. The slots hold no
// pointers, so the garbage collector never scans them, and a tenant costs
// one 24-byte slot plus about 2.3 bytes of bounds per slot, divided by the
// load factor (between 9/16 and 4/5).

const (
	shardBits = 6
	numShards = 1 << shardBits

	// expirePerOp is how many tenants with a full bucket an operation drops
	// at most, so that none costs more than O(expirePerOp·log n).
	expirePerOp = 2

	// Load factor bounds of a shard's table: it is rebuilt when live plus
	// deleted slots would exceed maxLoad, or live ones fall below minLoad,
	// and sized so that live ones fill rebuiltLoad of it.
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
	slots  []slot
	live   int // slots holding a tenant
	used   int // live plus deleted slots: a probe ends only at an empty slot
	levels [][]span

	// rootLo and rootHi copy the root bounds so that eviction and Lowest
	// pick shards without taking every lock.
	rootLo, rootHi atomic.Int64

	_ [64]byte // keeps neighbouring shards' locks off one cache line
}

type gcraStore struct {
	rate     limiter.Rate
	limit    int64
	interval time.Duration // one permit's worth of refill, rounded up
	seed     maphash.Seed
	admission
	shards [numShards]gcraShard
}

func newGCRAStore(p limiter.Policy, maxTenants int64) *gcraStore {
	st := &gcraStore{
		rate:     limiter.NewRate(p),
		limit:    p.Limit,
		interval: (p.Period + time.Duration(p.Limit) - 1) / time.Duration(p.Limit),
		seed:     maphash.MakeSeed(),
	}
	st.max = maxTenants
	for i := range st.shards {
		s := &st.shards[i]
		s.slots = make([]slot, minSlots)
		s.buildLevels()
	}
	return st
}

// hash is keyed with a per-registry random seed, so that nobody can choose
// addresses that pile up in one shard or one probe sequence.
func (st *gcraStore) hash(key uint64) uint64 { return maphash.Comparable(st.seed, key) }

// shard picks a shard from the low bits of h; home uses the high bits.
func (st *gcraStore) shard(h uint64) *gcraShard { return &st.shards[h&(numShards-1)] }

func (s *gcraShard) home(h uint64) int {
	i, _ := bits.Mul64(h, uint64(len(s.slots)))
	return int(i)
}

// find returns the slot holding key and true, or the slot where key would be
// inserted (the first deleted or empty slot of its probe sequence) and
// false. A probe ends at an empty slot; there always is one.
func (s *gcraShard) find(key, h uint64) (int, bool) {
	free := -1
	for i := s.home(h); ; {
		sl := &s.slots[i]
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
		if i++; i == len(s.slots) {
			i = 0
		}
	}
}

func (st *gcraStore) acquire(key uint64, now, n int64) (limiter.Decision, bool) {
	h := st.hash(key)
	s := st.shard(h)
	s.mu.Lock()
	i, found := s.find(key, h)
	if found {
		d := s.take(st, i, now, n)
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
	sl := &s.slots[i]
	old := sl.tat()
	tat, d := st.rate.Acquire(old, now, n)
	if d.Allowed {
		sl.ns, sl.frac = tat.NS, tat.Frac
		s.raised(i, old, tat)
	}
	return d
}

// insert remembers a new tenant in slot i (from find), for which room has
// been reserved. It rebuilds the table first when it would become too full.
func (s *gcraShard) insert(st *gcraStore, key, h uint64, i int, tat limiter.TAT, now int64) {
	if s.slots[i].state == slotEmpty && (s.used+1)*maxLoadDen > len(s.slots)*maxLoadNum {
		s.rebuild(st, now, s.live+1)
		i, _ = s.find(key, h)
	}
	if s.slots[i].state == slotEmpty {
		s.used++
	}
	s.slots[i] = slot{key: key, ns: tat.NS, frac: tat.Frac, state: slotLive}
	s.live++
	s.added(i, tat)
}

// remove forgets the tenant in slot i. The caller accounts for the room it
// frees.
func (s *gcraShard) remove(i int) {
	s.slots[i].state = slotDeleted
	s.live--
	s.fix(i / fanout)
}

// expire drops up to expirePerOp tenants whose bucket is full at now,
// earliest TAT first, and shrinks the table when it has become mostly
// empty.
func (s *gcraShard) expire(st *gcraStore, now int64) {
	dropped := 0
	for range expirePerOp {
		if s.levels[len(s.levels)-1][0].lo > now {
			break // no TAT is at or before now
		}
		i := s.earliest()
		if i < 0 || !s.slots[i].tat().FullAt(now) {
			break
		}
		s.remove(i)
		dropped++
	}
	st.release(dropped)
	if dropped > 0 && len(s.slots) > minSlots && s.live*minLoadDen < len(s.slots) {
		s.rebuild(st, now, s.live)
	}
}

// rebuild rehashes the live tenants whose bucket is not full at now into a
// table sized for max(them, want), dropping deleted slots and full buckets.
func (s *gcraShard) rebuild(st *gcraStore, now int64, want int) {
	old := s.slots
	kept := 0
	for i := range old {
		if old[i].state == slotLive && !old[i].tat().FullAt(now) {
			kept++
		}
	}
	st.release(s.live - kept)
	n := max(kept, want)
	size := (n*rebuiltDen/rebuiltNum + fanout) / fanout * fanout
	s.slots = make([]slot, max(size, minSlots))
	for i := range old {
		sl := &old[i]
		if sl.state != slotLive || sl.tat().FullAt(now) {
			continue
		}
		j, _ := s.find(sl.key, st.hash(sl.key))
		s.slots[j] = *sl
	}
	s.live, s.used = kept, kept
	s.buildLevels()
}

// admitAtBound remembers a newcomer while the registry holds MaxTenants
// tenants, making room as Config.MaxTenants describes, or denies it.
func (st *gcraStore) admitAtBound(key, h uint64, now, n int64) (limiter.Decision, bool) {
	retry := st.interval
	for range maxVictimAttempts {
		vs, vkey, vtat, ok := st.victim()
		if !ok {
			continue // every unit of room is an insertion under way
		}
		vs.mu.Lock()
		i, found := vs.find(vkey, st.hash(vkey))
		if !found || vs.slots[i].tat() != vtat {
			vs.mu.Unlock() // it acquired meanwhile: look again
			continue
		}
		if !vtat.FullAt(now) && st.rate.Available(vtat, now).Remaining == 0 {
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
	return registryFull(n, st.limit, retry), true
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
			sl := &sh.slots[j]
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

func (st *gcraStore) available(key uint64, now int64) limiter.Availability {
	h := st.hash(key)
	s := st.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	tat := limiter.TAT{}
	if i, found := s.find(key, h); found {
		tat = s.slots[i].tat()
	}
	s.expire(st, now)
	return st.rate.Available(tat, now)
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
	// Visit shards latest bound first so that the k-th best rises quickly
	// and prunes the others at their root.
	type root struct {
		hi int64
		s  *gcraShard
	}
	var roots [numShards]root
	n := 0
	for i := range st.shards {
		if hi := st.shards[i].rootHi.Load(); hi > now {
			roots[n] = root{hi, &st.shards[i]}
			n++
		}
	}
	// Insertion sort, latest first: n is at most numShards.
	for i := 1; i < n; i++ {
		for j := i; j > 0 && roots[j].hi > roots[j-1].hi; j-- {
			roots[j], roots[j-1] = roots[j-1], roots[j]
		}
	}
	top := newTopK(k, ranksBefore)
	for _, r := range roots[:n] {
		if !mayRank(top, r.hi) {
			break
		}
		r.s.mu.Lock()
		r.s.collect(now, top)
		r.s.mu.Unlock()
	}
	best := top.sorted()
	out := make([]ranked, len(best))
	for i, b := range best {
		out[i] = ranked{key: b.key, av: st.rate.Available(b.tat, now)}
	}
	return out, nil
}

func (st *gcraStore) stats() Stats {
	var s Stats
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		s.Tenants += sh.live
		s.IndexEntries += sh.used
		sh.mu.Unlock()
	}
	return s
}
