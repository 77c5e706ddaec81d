package memory

import (
	"math"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The index over a shard's slots is a tree of spans with fan-out 8. Its
// nodes of level 0 are the blocks: block b holds slots [8b, 8b+8) and their
// span, side by side, so that an acquisition reads and updates the span in
// the same page, often the same cache line, as its slot. A node j of level
// l >= 1 lives in levels[l-1][j] and bounds nodes [8j, 8j+8) of level l-1.
// The top level has a single node, the root. Every level but the top has a
// multiple of 8 nodes (tables of more than one block have a multiple of 8
// blocks; upper levels are padded with empty spans), so every node above
// level 0 has exactly 8 children.
//
// Bounds are exact: lo is the smallest TAT.NS below a node and hi the largest
// TAT.NS rounded up (NS+1 when Frac > 0), so every TAT t below satisfies
// (lo, 0) <= t <= (hi, 0). Keeping them exact is cheap because a key's
// TAT only ever grows: an acquisition raises a block's hi, which climbs only
// the ancestors it exceeds, and changes its lo only when the key held it.
// A parent is recomputed from its children only when a bound it shared
// with one of them moves inward.
//
// Ordering TATs by their nanoseconds alone keeps a span in 16 bytes; ties
// within one nanosecond are settled at the slots, which hold the whole TAT.

const (
	fanoutBits = 3
	fanout     = 1 << fanoutBits
)

// span bounds the TATs below a node; an empty node has lo > hi.
type span struct{ lo, hi int64 }

var emptySpan = span{lo: math.MaxInt64, hi: math.MinInt64}

func (p span) empty() bool { return p.hi == math.MinInt64 }

// block is level 0 of the index: fanout slots and their span.
type block struct {
	span  span
	slots [fanout]slot
}

// ceilNS is t's nanosecond rounded up.
func ceilNS(t limiter.TAT) int64 {
	if t.Frac != 0 && t.NS != math.MaxInt64 {
		return t.NS + 1
	}
	return t.NS
}

func (s *gcraShard) slot(i int) *slot { return &s.blocks[i/fanout].slots[i%fanout] }

// depth is the number of levels, blocks included.
func (s *gcraShard) depth() int { return len(s.levels) + 1 }

// node returns node j of level l.
func (s *gcraShard) node(l, j int) *span {
	if l == 0 {
		return &s.blocks[j].span
	}
	return &s.levels[l-1][j]
}

func (s *gcraShard) root() span { return *s.node(s.depth()-1, 0) }

// blocksFor returns how many blocks a table of at least n slots has.
func blocksFor(n int) int {
	b := (n + fanout - 1) / fanout
	if b > 1 {
		b = (b + fanout - 1) / fanout * fanout
	}
	return b
}

// buildLevels sizes the upper levels for the current blocks and computes
// every bound from the slots.
func (s *gcraShard) buildLevels() {
	for b := range s.blocks {
		s.blocks[b].span = s.blockSpan(b)
	}
	s.levels = s.levels[:0]
	for n := len(s.blocks); n > 1; {
		n = (n + fanout - 1) / fanout
		size := n
		if n > 1 {
			size = (n + fanout - 1) / fanout * fanout
		}
		lv := make([]span, size)
		for j := range lv {
			lv[j] = emptySpan
		}
		s.levels = append(s.levels, lv)
		l := len(s.levels)
		for j := range n {
			lv[j] = s.childrenSpan(l, j)
		}
	}
	s.publish(s.root())
}

// blockSpan computes the span of block b from its slots.
func (s *gcraShard) blockSpan(b int) span {
	p := emptySpan
	for i := range s.blocks[b].slots {
		sl := &s.blocks[b].slots[i]
		if sl.state != slotLive {
			continue
		}
		p.lo = min(p.lo, sl.ns)
		p.hi = max(p.hi, ceilNS(limiter.TAT{NS: sl.ns, Frac: sl.frac}))
	}
	return p
}

// childrenSpan computes node j of level l >= 1 from its children.
func (s *gcraShard) childrenSpan(l, j int) span {
	p := emptySpan
	for x := range fanout {
		c := s.node(l-1, j*fanout+x)
		p.lo = min(p.lo, c.lo)
		p.hi = max(p.hi, c.hi)
	}
	return p
}

// refresh recomputes block b's span from its slots and carries the change
// up.
func (s *gcraShard) refresh(b int) { s.changed(0, b, s.blocks[b].span, s.blockSpan(b)) }

// changed sets node j of level l, which spanned old, to p and carries the
// change up as far as it goes.
func (s *gcraShard) changed(l, j int, old, p span) {
	top := s.depth() - 1
	for p != old {
		*s.node(l, j) = p
		if l == top {
			s.publish(p)
			return
		}
		l, j = l+1, j/fanout
		parent := s.node(l, j)
		q := *parent
		np := q
		switch {
		case p.lo < q.lo:
			np.lo = p.lo
		case old.lo == q.lo && p.lo > old.lo:
			np.lo = s.childrenSpan(l, j).lo
		}
		switch {
		case p.hi > q.hi:
			np.hi = p.hi
		case old.hi == q.hi && p.hi < old.hi:
			np.hi = s.childrenSpan(l, j).hi
		}
		old, p = q, np
	}
}

func (s *gcraShard) publish(root span) {
	s.rootLo.Store(root.lo)
	s.rootHi.Store(root.hi)
}

// raised updates the index after slot i's TAT grew from old to tat; p is
// the span of its block.
func (s *gcraShard) raised(i int, old, tat limiter.TAT, p span) {
	b := i / fanout
	if old.NS == p.lo {
		s.refresh(b) // the slot may have held the block's lo
		return
	}
	if hi := ceilNS(tat); hi > p.hi {
		s.changed(0, b, p, span{p.lo, hi})
	}
}

// added updates the index after a key was put in slot i.
func (s *gcraShard) added(i int, tat limiter.TAT) {
	b := i / fanout
	p := s.blocks[b].span
	if np := (span{min(p.lo, tat.NS), max(p.hi, ceilNS(tat))}); np != p {
		s.changed(0, b, p, np)
	}
}

// earliest returns the slot of the key evicted first (earliest TAT, then
// largest key; see evictsBefore), or -1 when the shard is empty. It visits
// children earliest bound first and skips those that cannot hold an earlier
// TAT than the best found, so it reads O(log n) nodes unless many TATs share
// a nanosecond.
func (s *gcraShard) earliest() int {
	best := -1
	if !s.root().empty() {
		s.earliestIn(s.depth()-1, 0, &best)
	}
	return best
}

// earliestIn visits node j of level l.
func (s *gcraShard) earliestIn(l, j int, best *int) {
	if l == 0 {
		for i := j * fanout; i < j*fanout+fanout; i++ {
			sl := s.slot(i)
			if sl.state != slotLive {
				continue
			}
			if *best < 0 {
				*best = i
				continue
			}
			// Keys are read only to break a tie (see evictsBefore).
			c := sl.tat().Compare(s.slot(*best).tat())
			if c == 0 {
				ki, kb := s.key(i), s.key(*best)
				c = -compareKeys(&ki, &kb)
			}
			if c < 0 {
				*best = i
			}
		}
		return
	}
	var seen uint8
	for {
		// The unseen child with the smallest lo.
		x, lo := -1, int64(math.MaxInt64)
		for y := range fanout {
			if c := s.node(l-1, j*fanout+y); seen&(1<<y) == 0 && !c.empty() && (x < 0 || c.lo < lo) {
				x, lo = y, c.lo
			}
		}
		// A TAT below is at least (lo, 0), so it cannot come before one
		// whose NS is smaller than lo.
		if x < 0 || *best >= 0 && lo > s.slot(*best).ns {
			return
		}
		seen |= 1 << x
		s.earliestIn(l-1, j*fanout+x, best)
	}
}

// collector gathers the k latest TATs that are not full at now.
type collector struct {
	now int64
	// floor is a hi below which no subtree can hold one of the k latest
	// TATs; at least now+1, since a subtree whose hi is at most now holds
	// only full buckets.
	floor int64
	top   *topK[gcraRanked]
}

// mayRank reports whether a subtree whose TATs are at most (hi, 0) could
// hold one of the k latest.
func (c *collector) mayRank(hi int64) bool {
	if hi < c.floor {
		return false
	}
	if !c.top.full() {
		return true
	}
	w := c.top.worst().tat
	// A TAT t <= (hi, 0) enters only if t >= w (a tie wins on a smaller key).
	return hi > w.NS || hi == w.NS && w.Frac == 0
}

// collect offers to c the keys of the shard that could rank among the k
// latest, visiting subtrees latest bound first.
func (s *gcraShard) collect(c *collector) {
	if c.mayRank(s.root().hi) {
		s.collectIn(s.depth()-1, 0, c)
	}
}

// collectIn visits node j of level l.
func (s *gcraShard) collectIn(l, j int, c *collector) {
	if l == 0 {
		for i := range s.blocks[j].slots {
			sl := &s.blocks[j].slots[i]
			if sl.state != slotLive {
				continue
			}
			t := sl.tat()
			if t.FullAt(c.now) || !c.mayRank(ceilNS(t)) {
				continue
			}
			c.top.offer(gcraRanked{tat: t, key: s.key(j*fanout + i)})
		}
		return
	}
	var seen uint8
	for {
		// The unseen child with the largest hi.
		x, hi := -1, int64(math.MinInt64)
		for y := range fanout {
			if c := s.node(l-1, j*fanout+y); seen&(1<<y) == 0 && c.hi > hi {
				x, hi = y, c.hi
			}
		}
		if x < 0 || !c.mayRank(hi) {
			return
		}
		seen |= 1 << x
		s.collectIn(l-1, j*fanout+x, c)
	}
}
