package memory

import (
	"context"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/btree"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The sliding-log table keeps, per shard, a map from key to the key's log
// and an ordered index of (reset, key), where reset is the instant the
// key's log empties (its newest grant plus the period). The index finds
// the keys to drop once their log is empty and the one to evict at the
// bound. It cannot answer Lowest: the permits a log has left depend on when
// each grant leaves the window, so that order changes with time, and Lowest
// scans every key. A key costs about 200 bytes: the map entry, the log
// and its ring of grants, and an index item.

type logKey struct {
	log   limiter.Log
	reset int64  // when log empties, in nanoseconds since the Unix epoch
	key   string // the table's own copy of the key, which it alone holds
}

type logItem struct {
	reset int64
	key   string
}

// logEvictsBefore orders the index: earliest reset first, then largest key,
// so that its minimum is the key evicted first.
func logEvictsBefore(a, b logItem) bool {
	if a.reset != b.reset {
		return a.reset < b.reset
	}
	return a.key > b.key
}

type logShard struct {
	mu      sync.Mutex
	keys    map[string]*logKey
	byReset *btree.BTreeG[logItem]
	_       [64]byte
}

type logTable struct {
	// floor is the log a key the table does not remember starts from,
	// until floorUntil: none (an empty log), or after a crash the log of a
	// bucket emptied at the restart (see Keys.Restore). Both are set before
	// the table is shared.
	floor      limiter.Log
	floorUntil int64
	window     limiter.Window
	limit      int64
	interval   time.Duration // see refillInterval
	seed       maphash.Seed
	admission
	mask   uint64 // len(shards) - 1
	shards []logShard
}

func newLogTable(p limiter.Policy, maxKeys int64) *logTable {
	st := &logTable{window: limiter.NewWindow(p), limit: p.Limit, interval: refillInterval(p), seed: maphash.MakeSeed()}
	st.max = maxKeys
	st.shards = make([]logShard, shardsFor(maxKeys))
	st.mask = uint64(len(st.shards) - 1)
	for i := range st.shards {
		st.shards[i].keys = make(map[string]*logKey)
		st.shards[i].byReset = btree.NewBTreeGOptions(logEvictsBefore, btree.Options{NoLocks: true})
	}
	return st
}

func (st *logTable) shard(key string) *logShard { return &st.shards[st.shardIndex(key)] }

func (st *logTable) shardIndex(key string) int {
	return int(maphash.String(st.seed, key) & st.mask)
}

// granted re-indexes t after a grant at now that was decided as d.
func (s *logShard) granted(t *logKey, now int64, d limiter.Decision) {
	reset := addNanos(now, d.ResetAfter)
	if reset == t.reset {
		return
	}
	s.byReset.Delete(logItem{t.reset, t.key})
	t.reset = reset
	s.byReset.Set(logItem{reset, t.key})
}

// put remembers t under a copy of key, so that the table never retains
// its callers' strings (see Keys).
func (s *logShard) put(key string, t *logKey) {
	t.key = strings.Clone(key)
	s.keys[t.key] = t
	s.byReset.Set(logItem{t.reset, t.key})
}

func (s *logShard) remove(t *logKey) {
	delete(s.keys, t.key)
	s.byReset.Delete(logItem{t.reset, t.key})
}

// expire drops up to expirePerOp keys whose log is empty at now.
func (s *logShard) expire(st *logTable, now int64) {
	dropped := 0
	for range expirePerOp {
		it, ok := s.byReset.Min()
		if !ok || it.reset > now {
			break
		}
		s.remove(s.keys[it.key])
		dropped++
	}
	st.release(dropped)
}

func (st *logTable) acquire(key string, now, n int64) (limiter.Decision, bool) {
	s := st.shard(key)
	s.mu.Lock()
	if t := s.keys[key]; t != nil {
		d := t.log.Acquire(st.window, now, n)
		if d.Allowed {
			s.granted(t, now, d)
		}
		s.expire(st, now)
		s.mu.Unlock()
		return d, false
	}
	t := &logKey{log: st.start(now)}
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

// admitAtBound is gcraTable.admitAtBound for logs.
func (st *logTable) admitAtBound(key string, now, n int64) (limiter.Decision, bool) {
	evicted, wait := st.evict(now)
	if !evicted {
		return tableFull(n, st.limit, wait), true
	}
	s := st.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.keys[key]; t != nil {
		st.release(1)
		d := t.log.Acquire(st.window, now, n)
		if d.Allowed {
			s.granted(t, now, d)
		}
		return d, false
	}
	t := &logKey{log: st.start(now)}
	d := t.log.Acquire(st.window, now, n)
	t.reset = addNanos(now, d.ResetAfter)
	s.put(key, t)
	return d, false
}

// evict is gcraTable.evict for logs: the candidate is the key whose log
// empties first.
func (st *logTable) evict(now int64) (evicted bool, wait time.Duration) {
	for range maxEvictAttempts {
		vs, v, ok := st.victim()
		if !ok {
			continue
		}
		vs.mu.Lock()
		vt := vs.keys[v.key]
		if vt == nil || vt.reset != v.reset {
			vs.mu.Unlock()
			continue
		}
		if vt.log.Available(st.window, now).Remaining == 0 {
			// A denial: it records nothing.
			vd := vt.log.Acquire(st.window, now, 1)
			vs.mu.Unlock()
			return false, vd.RetryAfter
		}
		vs.remove(vt)
		vs.mu.Unlock()
		return true, 0
	}
	return false, st.interval
}

// victim finds the key whose log empties first, largest key among ties.
func (st *logTable) victim() (s *logShard, v logItem, ok bool) {
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

func (st *logTable) available(key string, now int64) (limiter.Availability, bool) {
	s := st.shard(key)
	s.mu.Lock()
	t := s.keys[key]
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
	fresh := st.start(now)
	return fresh.Available(st.window, now), false
}

// start returns the log a key the table does not remember starts from at
// now: its own copy of the floor while the floor holds grants, else an
// empty one.
func (st *logTable) start(now int64) limiter.Log {
	if now < st.floorUntil {
		return st.floor.Clone()
	}
	return limiter.Log{}
}

// availableAtBound is gcraTable.availableAtBound for logs: the key it
// would evict is the one whose log empties first.
func (st *logTable) availableAtBound(now int64) (limiter.Availability, bool) {
	empty := st.start(now)
	vs, v, ok := st.victim()
	if !ok {
		return empty.Available(st.window, now), false
	}
	vs.mu.Lock()
	vt := vs.keys[v.key]
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
	return tableFullAvailability(st.limit, vd.RetryAfter), true
}

type logRanked struct {
	remaining  int64
	resetAfter time.Duration
	key        string
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

func (st *logTable) lowest(ctx context.Context, now int64, k int) ([]limiter.KeyEntry, error) {
	top := newTopK(k, logRanksBefore)
	for i := range st.shards {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s := &st.shards[i]
		s.mu.Lock()
		for key, t := range s.keys {
			if t.reset <= now {
				continue // empty log: a full bucket
			}
			av := t.log.Available(st.window, now)
			top.offer(logRanked{remaining: av.Remaining, resetAfter: av.ResetAfter, key: key})
		}
		s.mu.Unlock()
	}
	best := top.sorted()
	out := make([]limiter.KeyEntry, len(best))
	for i, b := range best {
		out[i] = limiter.KeyEntry{Key: b.key, Availability: limiter.Availability{Remaining: b.remaining, Limit: st.limit, ResetAfter: b.resetAfter}}
	}
	return out, nil
}

func (st *logTable) stats() KeyStats {
	s := KeyStats{Keys: int(st.count.Load())}
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		s.IndexEntries += sh.byReset.Len()
		sh.mu.Unlock()
	}
	return s
}

// live counts the keys the shards hold; at rest it equals count.
func (st *logTable) live() int {
	n := 0
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		n += len(sh.keys)
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
