package memory

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// A joint decision names keys of keyed limiters beside plain limiters. It
// locks the plain limiters (limiter.Lock), then the shards of the keys, in
// the order of their tables' IDs and shard indexes, each shard once: every
// operation that holds more than one lock takes them in that one order, so
// none deadlocks. Under the locks each key's state is copied into a
// limiter.Bucket, the buckets are decided together (limiter.DecideBuckets),
// and the keys' new states are written back.
//
// A key the table does not remember needs room when the decision records
// permits for it. Room is reserved before the locks are taken; a key that
// got none while its table holds its bound makes the decision let go of
// its locks, make room as Keys describes (evicting the key with the most
// permits left if it has one) and decide again, at most maxVictimAttempts
// times. When the key to evict is limited, the key that needs room is
// reported KeysFull: the decision is denied (Take) or refused (Charge).
// A Take or Peek of more than a key's capacity is reported
// ExceedsCapacity instead, as an acquisition is.

// cell is one key of a keyed limiter in a joint decision.
type cell struct {
	ks       *Keys
	key      string
	h        uint64
	mu       *sync.Mutex // the key's shard's lock
	shard    int
	reserved bool // a unit of room is held for the key
	found    bool // the table remembers the key (under the lock)
	// atBound is set for a Peek of a key the table could not remember
	// now: it would be refused room until wait has passed.
	atBound bool
	wait    time.Duration
	b       limiter.Bucket
}

// newCell locates key in k. It takes no lock.
func (k *Keys) newCell(key string) cell {
	c := cell{ks: k, key: key}
	if k.gcra != nil {
		c.h = k.gcra.hash(key)
		c.shard = int(c.h & k.gcra.mask)
		c.mu = &k.gcra.shards[c.shard].mu
	} else {
		c.shard = k.log.shardIndex(key)
		c.mu = &k.log.shards[c.shard].mu
	}
	return c
}

func (k *Keys) admission() *admission {
	if k.gcra != nil {
		return &k.gcra.admission
	}
	return &k.log.admission
}

// load copies the key's state at now into c.b; c.mu must be held.
func (c *cell) load(now int64) {
	k := c.ks
	c.b = k.proto
	if k.gcra != nil {
		s := &k.gcra.shards[c.shard]
		i, found := s.find(c.key, c.h)
		c.found = found
		if found {
			c.b.SetTAT(s.slot(i).tat())
		} else {
			c.b.SetTAT(k.gcra.floor)
		}
		return
	}
	t := k.log.shards[c.shard].keys[c.key]
	c.found = t != nil
	if t != nil {
		c.b.SetLog(t.log)
	} else {
		c.b.SetLog(k.log.start(now))
	}
}

// store writes c.b back as the key's state, found after a decision at now;
// c.mu must be held. A key the table does not remember is put in only
// when its bucket is not full, using the room reserved for it.
func (c *cell) store(now int64, found limiter.Check) {
	k := c.ks
	if k.gcra != nil {
		st := k.gcra
		s := &st.shards[c.shard]
		tat := c.b.TAT()
		i, ok := s.find(c.key, c.h)
		switch {
		case ok:
			old := s.slot(i).tat()
			if tat == old {
				return
			}
			sl := s.slot(i)
			sl.ns, sl.frac = tat.NS, tat.Frac
			if tat.Compare(old) > 0 {
				s.raised(i, old, tat, s.blocks[i/fanout].span)
			} else {
				s.refresh(i / fanout) // a refund: the index's bounds may move inward
			}
		case !tat.FullAt(now) && c.reserved:
			s.insert(st, c.key, c.h, i, tat, now)
			c.reserved = false
		}
		return
	}
	s := &k.log.shards[c.shard]
	reset := addNanos(now, found.ResetAfter)
	if t := s.keys[c.key]; t != nil {
		t.log = c.b.Log()
		if reset != t.reset {
			s.byReset.Delete(logItem{t.reset, t.key})
			t.reset = reset
			s.byReset.Set(logItem{reset, t.key})
		}
		return
	}
	if found.ResetAfter > 0 && c.reserved {
		s.put(c.key, &logKey{log: c.b.Log(), reset: reset})
		c.reserved = false
	}
}

// release gives back c's unit of room if it was not used.
func (c *cell) release() {
	if c.reserved {
		c.ks.admission().release(1)
		c.reserved = false
	}
}

// atBoundCheck is the check of a key that cannot be given room before
// wait has passed.
func (c *cell) atBoundCheck() limiter.Check {
	return limiter.Check{Limit: c.ks.policy.Limit, RetryAfter: c.wait, ResetAfter: c.wait, KeysFull: true}
}

// makeRoom evicts a key from k as Keys describes and hands its unit of
// room to the caller, or reports how long until it can: the key it would
// evict is limited.
func (k *Keys) makeRoom(now int64) (ok bool, wait time.Duration) {
	if k.gcra != nil {
		return k.gcra.evict(now)
	}
	return k.log.evict(now)
}

// atBound reports whether k, holding its bound, would refuse a newcomer
// room now, and for how long.
func (k *Keys) atBound(now int64) (bool, time.Duration) {
	a := k.admission()
	if a.count.Load() < a.max {
		return false, 0
	}
	var av limiter.Availability
	var full bool
	if k.gcra != nil {
		av, full = k.gcra.availableAtBound(now)
	} else {
		av, full = k.log.availableAtBound(now)
	}
	return full, av.ResetAfter
}

// part is one distinct (limiter, key) of a joint decision: a plain
// limiter, or a key of a keyed one.
type part struct {
	l    *limiter.Limiter // nil for a key
	cell cell
}

// decideParts decides parts (totals[j] permits of parts[j]) together at
// now under mode, as limiter.DecideAll does for plain limiters; with
// holds (a settlement), totals are signed and adjusted as limiter.AdjustAll
// does (mode is then Charge). It reports retry when a key needed room, which it made
// after letting go of its locks: the caller decides again. When the room
// cannot be made now, that key's check is KeysFull, and nothing is
// recorded.
func decideParts(now int64, parts []part, totals []int64, mode limiter.Mode, holds []limiter.Held) (found []limiter.Check, retry bool) {
	settle := holds != nil
	var plain []*limiter.Limiter
	var cells []*cell
	for j := range parts {
		if parts[j].l != nil {
			plain = append(plain, parts[j].l)
		} else {
			cells = append(cells, &parts[j].cell)
		}
	}
	// records reports whether part j records permits, and so needs room
	// for a key its table does not remember.
	records := func(j int) bool {
		if settle {
			return totals[j] > 0
		}
		return mode == limiter.Take || mode == limiter.Charge
	}
	for j := range parts {
		if parts[j].l != nil {
			continue
		}
		switch c := &parts[j].cell; {
		case mode == limiter.Peek:
			c.atBound, c.wait = c.ks.atBound(now)
		case records(j) && !c.reserved:
			c.reserved = c.ks.admission().reserve()
		}
	}
	defer func() {
		if retry {
			return // the room made is kept for the next round
		}
		for _, c := range cells {
			c.release()
		}
	}()

	unlock := limiter.Lock(plain)
	// Each shard once, in the order of (table ID, shard index).
	locks := slices.Clone(cells)
	slices.SortFunc(locks, func(a, b *cell) int {
		if c := cmp.Compare(a.ks.id, b.ks.id); c != 0 {
			return c
		}
		return cmp.Compare(a.shard, b.shard)
	})
	locks = slices.CompactFunc(locks, func(a, b *cell) bool { return a.mu == b.mu })
	for _, c := range locks {
		c.mu.Lock()
	}
	unlockAll := func() {
		for _, c := range slices.Backward(locks) {
			c.mu.Unlock()
		}
		unlock()
	}

	bs := make([]*limiter.Bucket, len(parts))
	var homeless []int // the parts of keys that need room and hold none
	for j := range parts {
		if parts[j].l != nil {
			bs[j] = parts[j].l.Bucket()
			continue
		}
		c := &parts[j].cell
		c.load(now)
		bs[j] = &c.b
		if !c.found && !c.reserved && records(j) {
			homeless = append(homeless, j)
		}
	}
	if len(homeless) > 0 {
		// A Take needs the room only if it is allowed: fit first.
		var fit []limiter.Check
		if settle {
			fit = limiter.AdjustBuckets(now, bs, make([]int64, len(bs)), nil)
		} else {
			fit = limiter.DecideBuckets(now, bs, totals, limiter.Peek)
		}
		unlockAll()
		allowed := true
		for _, f := range fit {
			allowed = allowed && f.Fits
		}
		// A key that cannot get room now denies the decision (or refuses
		// the charge), and none is evicted for it: check them all first.
		// A Take above a key's capacity is told so, as an acquisition
		// is, rather than that its key has no room: room would not make
		// it fit.
		blocked := false
		for _, j := range homeless {
			c := &parts[j].cell
			if mode == limiter.Take && fit[j].ExceedsCapacity {
				continue
			}
			if full, wait := c.ks.atBound(now); full {
				c.wait = wait
				fit[j] = c.atBoundCheck()
				blocked = true
			}
		}
		if blocked || mode == limiter.Take && !allowed {
			return fit, false
		}
		// Room for every key that needs it, each unit kept by its key
		// into the next round, where a concurrent newcomer cannot take it.
		for _, j := range homeless {
			c := &parts[j].cell
			if ok, wait := c.ks.makeRoom(now); !ok {
				c.wait = wait
				fit[j] = c.atBoundCheck()
				return fit, false // every unit held is released on return
			}
			c.reserved = true
		}
		return nil, true
	}
	if mode == limiter.Peek {
		var full []int // the keys that could not get room now
		for j := range parts {
			if c := &parts[j].cell; parts[j].l == nil && !c.found && c.atBound {
				full = append(full, j)
			}
		}
		if len(full) > 0 {
			// What a Take would be told.
			found = limiter.DecideBuckets(now, bs, totals, limiter.Peek)
			unlockAll()
			for _, j := range full {
				if !found[j].ExceedsCapacity {
					found[j] = parts[j].cell.atBoundCheck()
				}
			}
			return found, false
		}
	}
	if settle {
		found = limiter.AdjustBuckets(now, bs, totals, holds)
	} else {
		found = limiter.DecideBuckets(now, bs, totals, mode)
	}
	allowed := true
	for _, f := range found {
		allowed = allowed && f.Fits
	}
	if mode == limiter.Refund || mode == limiter.Charge || mode == limiter.Take && allowed {
		// Keys remembered first: an insertion may rebuild the shard, which
		// drops the keys whose bucket is full.
		for _, pass := range []bool{true, false} {
			for j := range parts {
				if c := &parts[j].cell; parts[j].l == nil && c.found == pass {
					c.store(now, found[j])
				}
			}
		}
	}
	unlockAll()
	return found, false
}
