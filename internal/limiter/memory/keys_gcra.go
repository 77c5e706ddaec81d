package memory

import (
	"bytes"
	"context"
	"encoding/binary"
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
// probing, deleted slots marked and reclaimed by rebuilds) of 24-byte slots
// {TAT, key} and, over the slots, a tree of bounds (see keys_index.go): for
// every block of 8 slots, and every 8 nodes above, the earliest and latest
// TAT below. A key of up to 8 bytes lives in its slot; a longer one in the
// shard's arena, one byte slice that only grows until a rebuild compacts
// it, with its fingerprint, offset and length in its slot (see slot). An
// acquisition rewrites its slot and the few bounds that
// change; Lowest walks the latest bounds down to the k latest TATs, and
// eviction and expiry walk the earliest ones. Nothing in the table or the
// arena is a pointer, so the garbage collector never scans them. A key costs
// a 24-byte slot plus 16 bytes of bounds per 8 slots (and 1/7 more above),
// divided by the load factor, which stays between 9/16 and 4/5 (33 to 47
// bytes), plus, for a key longer than 8 bytes, its bytes in the arena,
// where the bytes of dropped keys stay until a rebuild, never more of them
// than of live ones.

const (
	// A table has one shard per keysPerShard keys of its bound, rounded up
	// to a power of two, and at most maxShards: a small keyed limiter costs
	// one shard, about 400 bytes, and the tenants' million get 64.
	maxShards    = 64
	keysPerShard = 1024

	// expirePerOp is how many keys with a full bucket an operation drops
	// at most, so that none costs more than O(expirePerOp·log n).
	expirePerOp = 2

	// A shard's table is rebuilt when live plus deleted slots would
	// exceed 4/5 of it, or live ones fall below 1/5, and sized so that live
	// ones then fill 9/16 of it: probes stay short and memory stays
	// proportional to the keys.
	maxLoadNum, maxLoadDen = 4, 5
	minLoadDen             = 5
	rebuiltNum, rebuiltDen = 9, 16
	minSlots               = fanout

	// A shard's arena is compacted (by a rebuild) when the bytes of
	// dropped keys exceed both the live ones and minGarbage.
	minGarbage = 1 << 10
)

const (
	slotEmpty uint16 = iota
	slotLive
	slotDeleted
)

// slot is one key's state: 24 bytes. A key of up to inlineKey bytes is
// held in fp and off (see pack); a longer one in the arena, at
// arena[off:off+n], with fp the high half of its hash, compared before its
// bytes while probing.
type slot struct {
	ns    int64
	frac  uint32
	fp    uint32
	off   uint32
	n     uint16
	state uint16
}

// inlineKey is the longest key a slot holds itself: the per-IP tenants'
// 8-byte keys cost no arena bytes, and finding one reads no more than its
// slot.
const inlineKey = 8

// pack returns the fp and off fields of a slot holding key, of at most
// inlineKey bytes, inline.
func pack(key string) (hi, lo uint32) {
	var b [inlineKey]byte
	copy(b[:], key)
	return binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[:4])
}

// keyRef is a key as a GCRA shard holds it: up to inlineKey bytes copied
// out of its slot, longer ones a slice of the shard's arena. The arena only
// grows until a rebuild replaces it, so a keyRef stays valid and unchanged
// after the shard's lock is released.
type keyRef struct {
	ext []byte
	in  [inlineKey]byte
	n   uint8
}

func (r *keyRef) bytes() []byte {
	if r.ext != nil {
		return r.ext
	}
	return r.in[:r.n]
}

func compareKeys(a, b *keyRef) int { return bytes.Compare(a.bytes(), b.bytes()) }

func (sl *slot) tat() limiter.TAT { return limiter.TAT{NS: sl.ns, Frac: sl.frac} }

type gcraShard struct {
	mu     sync.Mutex
	blocks []block // the slots, 8 to a block, and level 0 of the index
	arena  []byte  // the keys' bytes; see slot
	dead   int     // bytes of arena held by no live slot
	nslots int     // len(blocks) * fanout
	live   int     // slots holding a key
	used   int     // live plus deleted slots: a probe ends only at an empty slot
	levels [][]span

	// rootLo and rootHi copy the root bounds so that eviction and Lowest
	// pick shards without taking every lock.
	rootLo, rootHi atomic.Int64

	_ [64]byte // keeps neighbouring shards' locks off one cache line
}

type gcraTable struct {
	// floor is the TAT a key the table does not remember starts from: the
	// zero TAT (a full bucket), or after a crash the TAT of a bucket
	// emptied at the restart (see Keys.Restore). It is set before the
	// table is shared.
	floor    limiter.TAT
	rate     limiter.Rate
	limit    int64
	interval time.Duration // see refillInterval
	seed     maphash.Seed
	admission
	mask   uint64 // len(shards) - 1
	shards []gcraShard
}

func newGCRATable(p limiter.Policy, maxKeys int64) *gcraTable {
	st := &gcraTable{
		rate:     limiter.NewRate(p),
		limit:    p.Limit,
		interval: refillInterval(p),
		seed:     maphash.MakeSeed(),
	}
	st.max = maxKeys
	st.shards = make([]gcraShard, shardsFor(maxKeys))
	st.mask = uint64(len(st.shards) - 1)
	for i := range st.shards {
		st.shards[i].resize(minSlots)
	}
	return st
}

// shardsFor is how many shards a table of at most maxKeys keys has.
func shardsFor(maxKeys int64) int {
	n := 1
	for n < maxShards && int64(n)*keysPerShard < maxKeys {
		n *= 2
	}
	return n
}

// hash is keyed with a per-table random seed, so that nobody can choose
// keys that pile up in one shard or one probe sequence. A key of up to
// inlineKey bytes is hashed as its packed form and length, which costs
// less than hashing its bytes.
func (st *gcraTable) hash(key string) uint64 {
	if len(key) <= inlineKey {
		hi, lo := pack(key)
		return maphash.Comparable(st.seed, uint64(hi)<<32|uint64(lo)) ^ uint64(len(key))
	}
	return maphash.String(st.seed, key)
}

// shard picks a shard from the low bits of h, home the slot from its
// high bits, and the fingerprint is its high half.
func (st *gcraTable) shard(h uint64) *gcraShard { return &st.shards[h&st.mask] }

func fingerprint(h uint64) uint32 { return uint32(h >> 32) }

func (s *gcraShard) home(h uint64) int {
	i, _ := bits.Mul64(h, uint64(s.nslots))
	return int(i)
}

// key returns the key in slot i.
func (s *gcraShard) key(i int) keyRef {
	sl := s.slot(i)
	if sl.n > inlineKey {
		return keyRef{ext: s.arena[sl.off : sl.off+uint32(sl.n) : sl.off+uint32(sl.n)]}
	}
	r := keyRef{n: uint8(sl.n)}
	binary.LittleEndian.PutUint32(r.in[:4], sl.off)
	binary.LittleEndian.PutUint32(r.in[4:], sl.fp)
	return r
}

// resize replaces the table by an empty one of at least n slots; the index
// is left to buildLevels.
func (s *gcraShard) resize(n int) {
	s.blocks = make([]block, blocksFor(n))
	s.nslots = len(s.blocks) * fanout
	s.live, s.used = 0, 0
	s.arena, s.dead = nil, 0
	s.buildLevels()
}

// find returns the slot holding key and true, or the slot where key would be
// inserted (the first deleted or empty slot of its probe sequence) and
// false. A probe ends at an empty slot; there always is one.
func (s *gcraShard) find(key string, h uint64) (int, bool) { return s.findFrom(key, h, s.home(h)) }

func (s *gcraShard) findFrom(key string, h uint64, home int) (int, bool) {
	free := -1
	short := len(key) <= inlineKey
	fp, off := fingerprint(h), uint32(0)
	if short {
		fp, off = pack(key)
	}
	for i := home; ; {
		sl := s.slot(i)
		switch sl.state {
		case slotEmpty:
			if free < 0 {
				free = i
			}
			return free, false
		case slotLive:
			if sl.fp == fp && int(sl.n) == len(key) && (short && sl.off == off || !short && string(s.arena[sl.off:sl.off+uint32(sl.n)]) == key) {
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

func (st *gcraTable) acquire(key string, now, n int64) (limiter.Decision, bool) {
	h := st.hash(key)
	s := st.shard(h)
	s.mu.Lock()
	home := s.home(h)
	// Load the home block's span before probing: the load does not depend
	// on the probe, so the two cache misses overlap.
	bounds := s.blocks[home/fanout].span
	i, found := s.findFrom(key, h, home)
	if found {
		if i/fanout != home/fanout {
			bounds = s.blocks[i/fanout].span
		}
		d := s.takeWith(st, i, now, n, bounds)
		s.expire(st, now)
		s.mu.Unlock()
		return d, false
	}
	tat, d := st.rate.Acquire(st.floor, now, n)
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

// take acquires n permits from the key in slot i.
func (s *gcraShard) take(st *gcraTable, i int, now, n int64) limiter.Decision {
	return s.takeWith(st, i, now, n, s.blocks[i/fanout].span)
}

// takeWith is take given the span of slot i's block.
func (s *gcraShard) takeWith(st *gcraTable, i int, now, n int64, bounds span) limiter.Decision {
	sl := s.slot(i)
	old := sl.tat()
	tat, d := st.rate.Acquire(old, now, n)
	if d.Allowed {
		sl.ns, sl.frac = tat.NS, tat.Frac
		s.raised(i, old, tat, bounds)
	}
	return d
}

// insert remembers a new key in slot i (from find), for which room has been
// reserved. It rebuilds the table first when it would become too full, or
// its arena mostly dead.
func (s *gcraShard) insert(st *gcraTable, key string, h uint64, i int, tat limiter.TAT, now int64) {
	full := s.slot(i).state == slotEmpty && (s.used+1)*maxLoadDen > s.nslots*maxLoadNum
	if full || s.dead > minGarbage && s.dead > len(s.arena)-s.dead {
		s.rebuild(st, now, s.live+1)
		i, _ = s.find(key, h)
	}
	if s.slot(i).state == slotEmpty {
		s.used++
	}
	fp, off := fingerprint(h), uint32(len(s.arena))
	if len(key) <= inlineKey {
		fp, off = pack(key)
	} else {
		s.arena = append(s.arena, key...)
	}
	*s.slot(i) = slot{ns: tat.NS, frac: tat.Frac, fp: fp, off: off, n: uint16(len(key)), state: slotLive}
	s.live++
	s.added(i, tat)
}

// remove forgets the key in slot i. The caller accounts for the room it
// frees.
func (s *gcraShard) remove(i int) {
	sl := s.slot(i)
	sl.state = slotDeleted
	if sl.n > inlineKey {
		s.dead += int(sl.n)
	}
	s.live--
	s.refresh(i / fanout)
}

// expire drops up to expirePerOp keys whose bucket is full at now, earliest
// TAT first, and shrinks the table when it has become mostly empty.
func (s *gcraShard) expire(st *gcraTable, now int64) {
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

// rebuild rehashes the live keys whose bucket is not full at now into a
// table sized for max(them, want), dropping deleted slots and full buckets,
// and copies their bytes into a new, compact arena.
func (s *gcraShard) rebuild(st *gcraTable, now int64, want int) {
	old, oldArena := s.blocks, s.arena
	keep := func(sl *slot) bool { return sl.state == slotLive && !sl.tat().FullAt(now) }
	kept, size := 0, 0
	for b := range old {
		for i := range old[b].slots {
			if sl := &old[b].slots[i]; keep(sl) {
				kept++
				if sl.n > inlineKey {
					size += int(sl.n)
				}
			}
		}
	}
	st.release(s.live - kept)
	n := max(kept, want)
	s.blocks = make([]block, blocksFor(max(n*rebuiltDen/rebuiltNum+1, minSlots)))
	s.nslots = len(s.blocks) * fanout
	// A new arena, never the old one reused: slices of the old one that
	// Lowest handed out must stay unchanged.
	s.arena, s.dead = make([]byte, 0, size+size/4), 0
	for b := range old {
		for i := range old[b].slots {
			sl := &old[b].slots[i]
			if !keep(sl) {
				continue
			}
			moved := *sl
			var key []byte
			if sl.n > inlineKey {
				key = oldArena[sl.off : sl.off+uint32(sl.n)]
				moved.off = uint32(len(s.arena))
				s.arena = append(s.arena, key...)
			} else {
				r := keyRef{n: uint8(sl.n)}
				binary.LittleEndian.PutUint32(r.in[:4], sl.off)
				binary.LittleEndian.PutUint32(r.in[4:], sl.fp)
				key = r.bytes()
			}
			j, _ := s.find(string(key), st.hash(string(key)))
			*s.slot(j) = moved
		}
	}
	s.live, s.used = kept, kept
	s.buildLevels()
}

// admitAtBound remembers a newcomer while the table holds its bound of
// keys, making room as Keys describes (see evict), or denies it. The room
// the victim frees passes straight to the newcomer, so the bound holds at
// every instant.
func (st *gcraTable) admitAtBound(key string, h uint64, now, n int64) (limiter.Decision, bool) {
	evicted, wait := st.evict(now)
	if !evicted {
		return tableFull(n, st.limit, wait), true
	}
	s := st.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	i, found := s.find(key, h)
	if found {
		// Remembered meanwhile by a concurrent acquisition.
		st.release(1)
		return s.take(st, i, now, n), false
	}
	tat, d := st.rate.Acquire(st.floor, now, n)
	s.insert(st, key, h, i, tat, now)
	return d, false
}

// evict removes the key Keys evicts first when it has a permit left (a
// full bucket has, and is dropped here too), and keeps its unit of room for
// the caller: evicted is then true. Otherwise that key is limited, and wait
// is how long until it regains a permit. When concurrent acquisitions keep
// changing the candidate, it gives up after maxEvictAttempts with a wait
// of one permit's refill.
func (st *gcraTable) evict(now int64) (evicted bool, wait time.Duration) {
	for range maxEvictAttempts {
		v, ok := st.victim()
		if !ok {
			continue // every unit of room is an insertion under way
		}
		vs := v.s
		vs.mu.Lock()
		vkey := string(v.key.bytes())
		i, found := vs.find(vkey, st.hash(vkey))
		if !found || vs.slot(i).tat() != v.tat {
			vs.mu.Unlock() // it acquired meanwhile: look again
			continue
		}
		if st.rate.Available(v.tat, now).Remaining == 0 {
			vs.mu.Unlock()
			_, vd := st.rate.Acquire(v.tat, now, 1)
			return false, vd.RetryAfter
		}
		vs.remove(i)
		vs.mu.Unlock()
		return true, 0
	}
	return false, st.interval
}

// candidate is a key found in a shard: the victim of an eviction.
type candidate struct {
	s   *gcraShard
	tat limiter.TAT
	key keyRef
}

// victim finds the key Keys evicts first: the earliest TAT, and among
// equal TATs the largest key. Only shards whose earliest bound is the
// smallest can hold it.
func (st *gcraTable) victim() (v candidate, ok bool) {
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
		return candidate{}, false
	}
	for i := range st.shards {
		sh := &st.shards[i]
		if sh.rootHi.Load() == math.MinInt64 || sh.rootLo.Load() != lo {
			continue
		}
		sh.mu.Lock()
		if j := sh.earliest(); j >= 0 {
			c := candidate{s: sh, tat: sh.slot(j).tat(), key: sh.key(j)}
			if !ok || evictsBefore(c.tat, &c.key, v.tat, &v.key) {
				v, ok = c, true
			}
		}
		sh.mu.Unlock()
	}
	return v, ok
}

// evictsBefore orders keys for eviction: earliest TAT first, then largest
// key, the reverse of Lowest's order.
func evictsBefore(t limiter.TAT, k *keyRef, u limiter.TAT, l *keyRef) bool {
	if c := t.Compare(u); c != 0 {
		return c < 0
	}
	return compareKeys(k, l) > 0
}

func (st *gcraTable) available(key string, now int64) (limiter.Availability, bool) {
	h := st.hash(key)
	s := st.shard(h)
	s.mu.Lock()
	tat := st.floor
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
// one permit, changing nothing: a full bucket when the key it would evict
// has a permit left, otherwise no permit until that key regains one. The
// victim is looked for without holding any shard's lock, as admitAtBound
// does.
func (st *gcraTable) availableAtBound(now int64) (limiter.Availability, bool) {
	v, ok := st.victim()
	if !ok || st.rate.Available(v.tat, now).Remaining > 0 {
		return st.rate.Available(st.floor, now), false
	}
	_, vd := st.rate.Acquire(v.tat, now, 1)
	return tableFullAvailability(st.limit, vd.RetryAfter), true
}

// gcraRanked is a Lowest candidate.
type gcraRanked struct {
	tat limiter.TAT
	key keyRef
}

// ranksBefore is Lowest's order: latest TAT first, then smallest key.
func ranksBefore(a, b gcraRanked) bool {
	if c := a.tat.Compare(b.tat); c != 0 {
		return c > 0
	}
	return compareKeys(&a.key, &b.key) < 0
}

func (st *gcraTable) lowest(_ context.Context, now int64, k int) ([]limiter.KeyEntry, error) {
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
		// key whose TAT lies after hi-1: at least k keys lie after the
		// k-th largest root hi minus 1, and no subtree whose hi is below
		// that k-th hi can hold one of the k latest.
		var his [maxShards]int64
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
	out := make([]limiter.KeyEntry, len(best))
	for i, b := range best {
		out[i] = limiter.KeyEntry{Key: string(b.key.bytes()), Availability: st.rate.Available(b.tat, now)}
	}
	return out, nil
}

func (st *gcraTable) stats() KeyStats {
	s := KeyStats{Keys: int(st.count.Load())}
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		s.IndexEntries += sh.used
		sh.mu.Unlock()
	}
	return s
}

// live counts the keys the shards hold; at rest it equals count.
func (st *gcraTable) live() int {
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
	items [maxShards]shardRoot
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
