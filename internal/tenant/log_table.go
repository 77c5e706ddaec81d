package tenant

import (
	"context"
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/tidwall/btree"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The sliding-log table keeps, per shard, a map from key to the tenant's log
// and an ordered index of (reset, key), where reset is the instant the
// tenant's log empties (its newest grant plus the period). The index finds
// the tenants to drop once their log is empty and the one to evict at the
// bound. It cannot answer Lowest: the permits a log has left depend on when
// each grant leaves the window, so that order changes with time, and Lowest
// scans every tenant. A tenant costs about 200 bytes: the map entry, the log
// and its ring of grants, and an index item.

type logTenant struct {
	log   limiter.Log
	reset int64 // when log empties, in nanoseconds since the Unix epoch
}

type logItem struct {
	reset int64
	key   uint64
}

// logEvictsBefore orders the index: earliest reset first, then largest key,
// so that its minimum is the tenant evicted first.
func logEvictsBefore(a, b logItem) bool {
	if a.reset != b.reset {
		return a.reset < b.reset
	}
	return a.key > b.key
}

type logShard struct {
	mu      sync.Mutex
	tenants map[uint64]*logTenant
	byReset *btree.BTreeG[logItem]
	_       [64]byte
}

type logStore struct {
	window   limiter.Window
	limit    int64
	interval time.Duration // see refillInterval
	seed     maphash.Seed
	admission
	shards [numShards]logShard
}

func newLogStore(p limiter.Policy, maxTenants int64) *logStore {
	st := &logStore{window: limiter.NewWindow(p), limit: p.Limit, interval: refillInterval(p), seed: maphash.MakeSeed()}
	st.max = maxTenants
	for i := range st.shards {
		st.shards[i].tenants = make(map[uint64]*logTenant)
		st.shards[i].byReset = btree.NewBTreeGOptions(logEvictsBefore, btree.Options{NoLocks: true})
	}
	return st
}

func (st *logStore) shard(key uint64) *logShard {
	return &st.shards[maphash.Comparable(st.seed, key)&(numShards-1)]
}

// granted re-indexes t after a grant at now that was decided as d.
func (s *logShard) granted(key uint64, t *logTenant, now int64, d limiter.Decision) {
	reset := addNanos(now, d.ResetAfter)
	if reset == t.reset {
		return
	}
	s.byReset.Delete(logItem{t.reset, key})
	t.reset = reset
	s.byReset.Set(logItem{reset, key})
}

func (s *logShard) put(key uint64, t *logTenant) {
	s.tenants[key] = t
	s.byReset.Set(logItem{t.reset, key})
}

func (s *logShard) remove(key uint64, t *logTenant) {
	delete(s.tenants, key)
	s.byReset.Delete(logItem{t.reset, key})
}

// expire drops up to expirePerOp tenants whose log is empty at now.
func (s *logShard) expire(st *logStore, now int64) {
	dropped := 0
	for range expirePerOp {
		it, ok := s.byReset.Min()
		if !ok || it.reset > now {
			break
		}
		s.remove(it.key, s.tenants[it.key])
		dropped++
	}
	st.release(dropped)
}

func (st *logStore) acquire(key uint64, now, n int64) (limiter.Decision, bool) {
	s := st.shard(key)
	s.mu.Lock()
	if t := s.tenants[key]; t != nil {
		d := t.log.Acquire(st.window, now, n)
		if d.Allowed {
			s.granted(key, t, now, d)
		}
		s.expire(st, now)
		s.mu.Unlock()
		return d, false
	}
	t := new(logTenant)
	d := t.log.Acquire(st.window, now, n)
	if !d.Allowed {
		s.mu.Unlock()
		return d, false
	}
	t.reset = addNanos(now, d.ResetAfter)
	if st.reserve() {
		s.put(key, t)
		s.expire(st, now)
		s.mu.Unlock()
		return d, false
	}
	s.mu.Unlock()
	return st.admitAtBound(key, now, n)
}

// admitAtBound is gcraStore.admitAtBound for logs: the candidate for
// eviction is the tenant whose log empties first.
func (st *logStore) admitAtBound(key uint64, now, n int64) (limiter.Decision, bool) {
	for range maxVictimAttempts {
		vs, v, ok := st.victim()
		if !ok {
			continue
		}
		vs.mu.Lock()
		vt := vs.tenants[v.key]
		if vt == nil || vt.reset != v.reset {
			vs.mu.Unlock()
			continue
		}
		if vt.log.Available(st.window, now).Remaining == 0 {
			// The log is limited, so this acquisition is a denial and
			// records nothing.
			vd := vt.log.Acquire(st.window, now, 1)
			vs.mu.Unlock()
			return registryFull(n, st.limit, vd.RetryAfter), true
		}
		vs.remove(v.key, vt)
		vs.mu.Unlock()

		s := st.shard(key)
		s.mu.Lock()
		if t := s.tenants[key]; t != nil {
			st.release(1)
			d := t.log.Acquire(st.window, now, n)
			if d.Allowed {
				s.granted(key, t, now, d)
			}
			s.mu.Unlock()
			return d, false
		}
		t := new(logTenant)
		d := t.log.Acquire(st.window, now, n)
		t.reset = addNanos(now, d.ResetAfter)
		s.put(key, t)
		s.mu.Unlock()
		return d, false
	}
	return registryFull(n, st.limit, st.interval), true
}

// victim finds the tenant whose log empties first, largest key among ties.
func (st *logStore) victim() (s *logShard, v logItem, ok bool) {
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		it, found := sh.byReset.Min()
		sh.mu.Unlock()
		if found && (!ok || logEvictsBefore(it, v)) {
			s, v, ok = sh, it, true
		}
	}
	return s, v, ok
}

func (st *logStore) available(key uint64, now int64) (limiter.Availability, bool) {
	s := st.shard(key)
	s.mu.Lock()
	t := s.tenants[key]
	var av limiter.Availability
	if t != nil {
		av = t.log.Available(st.window, now)
	}
	s.expire(st, now)
	s.mu.Unlock()
	if t != nil {
		return av, false
	}
	if st.count.Load() >= st.max {
		return st.availableAtBound(now)
	}
	var empty limiter.Log
	return empty.Available(st.window, now), false
}

// availableAtBound is gcraStore.availableAtBound for logs: the tenant it
// would evict is the one whose log empties first.
func (st *logStore) availableAtBound(now int64) (limiter.Availability, bool) {
	var empty limiter.Log
	vs, v, ok := st.victim()
	if !ok {
		return empty.Available(st.window, now), false
	}
	vs.mu.Lock()
	vt := vs.tenants[v.key]
	limited := vt != nil && vt.log.Available(st.window, now).Remaining == 0
	var vd limiter.Decision
	if limited {
		// A denial: it records nothing.
		vd = vt.log.Acquire(st.window, now, 1)
	}
	vs.mu.Unlock()
	if !limited {
		return empty.Available(st.window, now), false
	}
	return registryFullAvailability(st.limit, vd.RetryAfter), true
}

type logRanked struct {
	remaining  int64
	resetAfter time.Duration
	key        uint64
}

// logRanksBefore is Lowest's order for logs: fewest permits left, then
// latest reset, then smallest key.
func logRanksBefore(a, b logRanked) bool {
	if a.remaining != b.remaining {
		return a.remaining < b.remaining
	}
	if a.resetAfter != b.resetAfter {
		return a.resetAfter > b.resetAfter
	}
	return a.key < b.key
}

func (st *logStore) lowest(ctx context.Context, now int64, k int) ([]ranked, error) {
	top := newTopK(k, logRanksBefore)
	for i := range st.shards {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s := &st.shards[i]
		s.mu.Lock()
		for key, t := range s.tenants {
			if t.reset <= now {
				continue // empty log: a full bucket
			}
			av := t.log.Available(st.window, now)
			top.offer(logRanked{remaining: av.Remaining, resetAfter: av.ResetAfter, key: key})
		}
		s.mu.Unlock()
	}
	best := top.sorted()
	out := make([]ranked, len(best))
	for i, b := range best {
		out[i] = ranked{key: b.key, av: limiter.Availability{Remaining: b.remaining, Limit: st.limit, ResetAfter: b.resetAfter}}
	}
	return out, nil
}

func (st *logStore) stats() Stats {
	s := Stats{Tenants: int(st.count.Load())}
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		s.IndexEntries += sh.byReset.Len()
		sh.mu.Unlock()
	}
	return s
}

// live counts the tenants the shards hold; at rest it equals count.
func (st *logStore) live() int {
	n := 0
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		n += len(sh.tenants)
		sh.mu.Unlock()
	}
	return n
}

// addNanos returns now+d, saturating at the last representable instant.
func addNanos(now int64, d time.Duration) int64 {
	if d > 0 && now > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return now + int64(d)
}
