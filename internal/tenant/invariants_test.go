package tenant

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// checkInvariants verifies a registry's internal state from scratch: every
// tenant is findable from its hash, counts agree, and every bound of the
// GCRA index is exact.
func checkInvariants(t testing.TB, r *Registry) {
	t.Helper()
	var err error
	switch st := r.store.(type) {
	case *gcraStore:
		err = st.check()
	case *logStore:
		err = st.check()
	}
	if err != nil {
		t.Fatal(err)
	}
}

func (st *gcraStore) check() error {
	total := 0
	for si := range st.shards {
		s := &st.shards[si]
		s.mu.Lock()
		err := s.check(st, si)
		total += s.live
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if c := st.count.Load(); int64(total) != c {
		return fmt.Errorf("shards hold %d tenants, count says %d", total, c)
	}
	return nil
}

func (s *gcraShard) check(st *gcraStore, si int) error {
	if s.nslots != len(s.blocks)*fanout || len(s.blocks) != blocksFor(len(s.blocks)*fanout) {
		return fmt.Errorf("shard %d: %d slots in %d blocks", si, s.nslots, len(s.blocks))
	}
	live, used := 0, 0
	for i := range s.nslots {
		sl := s.slot(i)
		if sl.state == slotEmpty {
			continue
		}
		used++
		if sl.state != slotLive {
			continue
		}
		live++
		h := st.hash(sl.key)
		if st.shard(h) != s {
			return fmt.Errorf("shard %d: key %#x belongs to another shard", si, sl.key)
		}
		if j, found := s.find(sl.key, h); !found || j != i {
			return fmt.Errorf("shard %d: key %#x in slot %d, find gives %d, %v", si, sl.key, i, j, found)
		}
	}
	if live != s.live || used != s.used {
		return fmt.Errorf("shard %d: %d live and %d used slots, fields say %d and %d", si, live, used, s.live, s.used)
	}
	if used*maxLoadDen > s.nslots*maxLoadNum {
		return fmt.Errorf("shard %d: %d of %d slots used", si, used, s.nslots)
	}
	return s.checkIndex(si)
}

// checkIndex verifies that every bound of the shard's index is exact.
func (s *gcraShard) checkIndex(si int) error {
	for b := range s.blocks {
		if got, want := s.blocks[b].span, s.blockSpan(b); got != want {
			return fmt.Errorf("shard %d: block %d spans %+v, want %+v", si, b, got, want)
		}
	}
	n := len(s.blocks)
	for l := 1; l < s.depth(); l++ {
		n = (n + fanout - 1) / fanout
		lv := s.levels[l-1]
		if len(lv) != n && len(lv) != (n+fanout-1)/fanout*fanout {
			return fmt.Errorf("shard %d: level %d has %d nodes for %d", si, l, len(lv), n)
		}
		for j := range lv {
			want := emptySpan
			if j < n {
				want = s.childrenSpan(l, j)
			}
			if got := lv[j]; got != want {
				return fmt.Errorf("shard %d: level %d node %d is %+v, want %+v", si, l, j, got, want)
			}
		}
	}
	if n != 1 {
		return fmt.Errorf("shard %d: top level has %d nodes", si, n)
	}
	root := s.root()
	if lo, hi := s.rootLo.Load(), s.rootHi.Load(); lo != root.lo || hi != root.hi {
		return fmt.Errorf("shard %d: published root {%d %d}, want %+v", si, lo, hi, root)
	}
	return nil
}

func (st *logStore) check() error {
	total := 0
	for si := range st.shards {
		s := &st.shards[si]
		s.mu.Lock()
		var err error
		if n := s.byReset.Len(); n != len(s.tenants) {
			err = fmt.Errorf("shard %d: %d tenants, %d index items", si, len(s.tenants), n)
		}
		for key, lt := range s.tenants {
			if _, ok := s.byReset.Get(logItem{lt.reset, key}); !ok && err == nil {
				err = fmt.Errorf("shard %d: key %#x not indexed at %d", si, key, lt.reset)
			}
		}
		total += len(s.tenants)
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if c := st.count.Load(); int64(total) != c {
		return fmt.Errorf("shards hold %d tenants, count says %d", total, c)
	}
	return nil
}

// indexDepth is the number of levels of the deepest GCRA shard index.
func indexDepth(r *Registry) int {
	st, ok := r.store.(*gcraStore)
	if !ok {
		return 0
	}
	d := 0
	for i := range st.shards {
		st.shards[i].mu.Lock()
		d = max(d, st.shards[i].depth())
		st.shards[i].mu.Unlock()
	}
	return d
}

// TestIndexUpdates drives one shard's index directly, with tenants placed
// in chosen slots, so that every way a bound can move is exercised: a
// tenant alone in a subtree leaving it, the latest or earliest TAT of a
// subtree moving, ties.
func TestIndexUpdates(t *testing.T) {
	for _, slots := range []int{8, 64, 512, 4096} {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(slots), 9))
			var s gcraShard
			s.resize(slots)
			for step := range 10_000 {
				i := rng.IntN(s.nslots)
				// Sparse phases leave subtrees with one tenant; dense
				// phases fill them.
				if step/2000%2 == 0 && rng.IntN(3) > 0 {
					i = rng.IntN(max(1, s.nslots/8)) * 8
				}
				sl := s.slot(i)
				tat := limiter.TAT{NS: rng.Int64N(50), Frac: uint32(rng.IntN(3))}
				switch {
				case sl.state != slotLive:
					*sl = slot{key: uint64(i), ns: tat.NS, frac: tat.Frac, state: slotLive}
					s.live++
					s.added(i, tat)
				case rng.IntN(2) == 0:
					old := sl.tat()
					tat.NS += old.NS
					if tat.Compare(old) <= 0 {
						tat.Frac = old.Frac + 1
					}
					sl.ns, sl.frac = tat.NS, tat.Frac
					s.raised(i, old, tat, s.blocks[i/fanout].span)
				default:
					s.remove(i)
				}
				if err := s.checkIndex(0); err != nil {
					t.Fatalf("step %d (slot %d): %v", step, i, err)
				}
				if j := s.earliest(); j >= 0 && (step%8 == 0 || s.nslots <= 64) {
					for x := range s.nslots {
						if y := s.slot(x); y.state == slotLive && evictsBefore(y.tat(), y.key, s.slot(j).tat(), s.slot(j).key) {
							t.Fatalf("step %d: earliest is slot %d, but slot %d comes before", step, j, x)
						}
					}
				}
			}
		})
	}
}
