package memory

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// indexDepth is the number of levels of the deepest GCRA shard index.
func indexDepth(k *Keys) int {
	st, ok := k.table.(*gcraTable)
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

// TestIndexUpdates drives one shard's index directly, with keys placed
// in chosen slots, so that every way a bound can move is exercised: a
// key alone in a subtree leaving it, the latest or earliest TAT of a
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
					key := fmt.Sprint(i)
					fp, off := pack(key)
					*sl = slot{ns: tat.NS, frac: tat.Frac, fp: fp, off: off, n: uint16(len(key)), state: slotLive}
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
						kx, kj := s.key(x), s.key(j)
						if y := s.slot(x); y.state == slotLive && evictsBefore(y.tat(), &kx, s.slot(j).tat(), &kj) {
							t.Fatalf("step %d: earliest is slot %d, but slot %d comes before", step, j, x)
						}
					}
				}
			}
		})
	}
}
