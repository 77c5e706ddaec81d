package tenant

import (
	"math"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The index over a shard's slots is a tree of spans with fan-out 8:
// levels[0][b] bounds the TATs of slots [8b, 8b+8), levels[l][j] bounds
// levels[l-1][8j, 8j+8), and the last level has a single entry, the root.
// Levels other than the root are padded to a multiple of 8 with empty spans
// so that every node has exactly 8 children.
//
// Bounds are exact: lo is the smallest TAT.NS below a node and hi the largest
// TAT.NS rounded up (NS+1 when Frac > 0), so every TAT t below satisfies
// (lo, 0) <= t <= (hi, 0). Keeping them exact costs little because a
// tenant's TAT only ever grows: an acquisition can only raise a block's hi,
// and changes its lo only when the tenant held it.
//
// Ordering TATs by their nanoseconds alone keeps a span in 16 bytes, so a
// node's 8 children fill two cache lines; ties within one nanosecond are
// settled at the slots, which hold the whole TAT.

const (
	fanoutBits = 3
	fanout     = 1 << fanoutBits
)

// span bounds the TATs below a node; an empty node has lo > hi.
type span struct{ lo, hi int64 }

var emptySpan = span{lo: math.MaxInt64, hi: math.MinInt64}

func (p span) empty() bool { return p.hi == math.MinInt64 }

// ceilNS is t's nanosecond rounded up.
func ceilNS(t limiter.TAT) int64 {
	if t.Frac != 0 && t.NS != math.MaxInt64 {
		return t.NS + 1
	}
	return t.NS
}

// buildLevels sizes the levels for the current slots and computes every
// bound from them.
func (s *gcraShard) buildLevels() {
	s.levels = s.levels[:0]
	n := len(s.slots) / fanout
	for {
		size := n
		if n > 1 {
			size = (n + fanout - 1) / fanout * fanout
		}
		lv := make([]span, size)
		for i := range lv {
			lv[i] = emptySpan
		}
		s.levels = append(s.levels, lv)
		if n == 1 {
			break
		}
		n = (n + fanout - 1) / fanout
	}
	for b := range len(s.slots) / fanout {
		s.levels[0][b] = s.blockSpan(b)
	}
	for l := 1; l < len(s.levels); l++ {
		for j := range s.levels[l] {
			s.levels[l][j] = join(s.levels[l-1][j*fanout : j*fanout+fanout])
		}
	}
	s.publish()
}

// blockSpan computes the bounds of block b from its slots.
func (s *gcraShard) blockSpan(b int) span {
	p := emptySpan
	for i := b * fanout; i < b*fanout+fanout; i++ {
		sl := &s.slots[i]
		if sl.state != slotLive {
			continue
		}
		p.lo = min(p.lo, sl.ns)
		p.hi = max(p.hi, ceilNS(limiter.TAT{NS: sl.ns, Frac: sl.frac}))
	}
	return p
}

func join(children []span) span {
	p := emptySpan
	for _, c := range children[:fanout] {
		p.lo = min(p.lo, c.lo)
		p.hi = max(p.hi, c.hi)
	}
	return p
}

// fix recomputes the bounds of block b and of its ancestors, stopping at the
// first that does not change.
func (s *gcraShard) fix(b int) {
	p := s.blockSpan(b)
	for l := 0; ; l++ {
		lv := s.levels[l]
		if lv[b] == p {
			return
		}
		lv[b] = p
		if l == len(s.levels)-1 {
			s.publish()
			return
		}
		b /= fanout
		p = join(lv[b*fanout:])
	}
}

func (s *gcraShard) publish() {
	root := s.levels[len(s.levels)-1][0]
	s.rootLo.Store(root.lo)
	s.rootHi.Store(root.hi)
}

// raised updates the bounds after slot i's TAT grew from old to tat.
func (s *gcraShard) raised(i int, old, tat limiter.TAT) {
	p := s.levels[0][i/fanout]
	if old.NS == p.lo || ceilNS(tat) > p.hi {
		s.fix(i / fanout)
	}
}

// added updates the bounds after a tenant was put in slot i.
func (s *gcraShard) added(i int, tat limiter.TAT) {
	p := s.levels[0][i/fanout]
	if tat.NS < p.lo || ceilNS(tat) > p.hi {
		s.fix(i / fanout)
	}
}

// earliest returns the slot of the tenant evicted first (earliest TAT, then
// largest key; see evictsBefore), or -1 when the shard is empty. It visits
// children earliest bound first and skips those that cannot hold an earlier
// TAT than the best found, so it reads O(log n) nodes unless many TATs share
// a nanosecond.
func (s *gcraShard) earliest() int {
	best := -1
	top := len(s.levels) - 1
	if s.levels[top][0].empty() {
		return -1
	}
	s.earliestIn(top, 0, &best)
	return best
}

// earliestIn visits node j of level l; a node of level 0 covers slots
// [8j, 8j+8).
func (s *gcraShard) earliestIn(l, j int, best *int) {
	if l == 0 {
		for i := j * fanout; i < j*fanout+fanout; i++ {
			sl := &s.slots[i]
			if sl.state != slotLive {
				continue
			}
			if *best < 0 || evictsBefore(sl.tat(), sl.key, s.slots[*best].tat(), s.slots[*best].key) {
				*best = i
			}
		}
		return
	}
	children := s.levels[l-1][j*fanout : j*fanout+fanout]
	order := byBound(children, func(a, b span) bool { return a.lo < b.lo })
	for _, c := range order {
		p := children[c]
		if p.empty() {
			continue
		}
		// A TAT below is at least (p.lo, 0), so it cannot come before one
		// whose NS is smaller than p.lo.
		if *best >= 0 && p.lo > s.slots[*best].ns {
			break
		}
		s.earliestIn(l-1, j*fanout+int(c), best)
	}
}

// collect offers to top every tenant of the shard that is not full at now
// and could rank among its k best, latest bound first.
func (s *gcraShard) collect(now int64, top *topK[gcraRanked]) {
	top0 := len(s.levels) - 1
	if s.levels[top0][0].hi <= now {
		return
	}
	s.collectIn(top0, 0, now, top)
}

// collectIn visits node j of level l, as earliestIn does.
func (s *gcraShard) collectIn(l, j int, now int64, top *topK[gcraRanked]) {
	if l == 0 {
		for i := j * fanout; i < j*fanout+fanout; i++ {
			sl := &s.slots[i]
			if sl.state != slotLive {
				continue
			}
			t := sl.tat()
			if t.FullAt(now) {
				continue
			}
			top.offer(gcraRanked{tat: t, key: sl.key})
		}
		return
	}
	children := s.levels[l-1][j*fanout : j*fanout+fanout]
	order := byBound(children, func(a, b span) bool { return a.hi > b.hi })
	for _, c := range order {
		hi := children[c].hi
		// A subtree whose hi is at most now holds only full buckets.
		if hi <= now || !mayRank(top, hi) {
			break
		}
		s.collectIn(l-1, j*fanout+int(c), now, top)
	}
}

// mayRank reports whether a TAT at most (hi, 0) could enter top.
func mayRank(top *topK[gcraRanked], hi int64) bool {
	if !top.full() {
		return true
	}
	w := top.worst().tat
	// A TAT t <= (hi, 0) enters only if t >= w (a tie wins on a smaller key).
	return hi > w.NS || hi == w.NS && w.Frac == 0
}

// byBound returns the indexes of 8 children sorted by before.
func byBound(children []span, before func(a, b span) bool) [fanout]uint8 {
	var order [fanout]uint8
	for i := range order {
		order[i] = uint8(i)
		for j := i; j > 0 && before(children[order[j]], children[order[j-1]]); j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	return order
}
