package limiter_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// jointPolicies mixes both algorithms, bursts and rates, so that one
// decision spans limiters that refill at different paces.
var jointPolicies = []limiter.Policy{
	{Limit: 9, Period: 9 * time.Second},
	{Limit: 100, Period: time.Minute, Burst: 10},
	{Limit: 7, Period: time.Second},
	{Limit: 9, Period: 9 * time.Second, Algorithm: limiter.SlidingLog},
	{Limit: 50, Period: 999 * time.Millisecond, Algorithm: limiter.SlidingLog},
}

// capacity is the most permits p can ever grant at once.
func capacity(p limiter.Policy) int64 {
	if p.Algorithm == limiter.GCRA {
		return p.Burst
	}
	return p.Limit
}

// TestDecideAllAgainstModel drives DecideAll and one brute-force model per
// limiter with random joint decisions (duplicates included), single
// acquisitions and time advances. The model of a joint decision: it is
// allowed exactly when every limiter's model has room for the sum asked of
// it; then, under Take, every model records its sum at that instant, and
// otherwise none records anything. Every field of every answer must match.
func TestDecideAllAgainstModel(t *testing.T) {
	seeds, steps := 30, 600
	if testing.Short() {
		seeds, steps = 5, 200
	}
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			runJointModel(t, uint64(seed), steps, false)
		})
		t.Run(fmt.Sprintf("seed-%d-charge-refund", seed), func(t *testing.T) {
			runJointModel(t, uint64(seed), steps, true)
		})
	}
}

// runJointModel runs one random sequence; with adjust it mixes in charges
// (which may put a limiter in debt) and refunds, so the window bound of
// checkContract no longer applies.
func runJointModel(t *testing.T, seed uint64, steps int, adjust bool) {
	rng := rand.New(rand.NewPCG(seed, 0x1017))
	ls := make([]*limiter.Limiter, len(jointPolicies))
	ms := make([]*model, len(jointPolicies))
	for j, p := range jointPolicies {
		p = p.Normalize()
		ls[j], ms[j] = mustNew(t, p), &model{p: p}
	}
	now := t0.UnixNano()
	for step := range steps {
		switch r := rng.IntN(10); {
		case r < 6:
			// A joint decision on 1 to 4 items, limiters possibly repeated.
			nitems := 1 + rng.IntN(4)
			picks := make([]int, nitems)
			perm := make([]int64, nitems)
			for i := range picks {
				picks[i] = rng.IntN(len(ls))
				perm[i] = 1 + rng.Int64N(capacity(ms[picks[i]].p)/2+2)
			}
			mode := limiter.Take
			switch r := rng.IntN(8); {
			case r < 2:
				mode = limiter.Peek
			case adjust && r < 4:
				mode = limiter.Charge
			case adjust && r < 6:
				mode = limiter.Refund
			}
			checkJoint(t, step, ls, ms, picks, perm, now, mode)
		case adjust && r < 7 && rng.IntN(2) == 0:
			// A settlement: signed adjustments of distinct limiters, as
			// AdjustAll makes them (charge > 0, refund < 0, none 0).
			picks := rng.Perm(len(ls))[:1+rng.IntN(len(ls))]
			dls := make([]*limiter.Limiter, len(picks))
			deltas := make([]int64, len(picks))
			for k, j := range picks {
				dls[k] = ls[j]
				deltas[k] = rng.Int64N(2*capacity(ms[j].p)+1) - capacity(ms[j].p)
			}
			found := limiter.AdjustAll(now, dls, deltas, nil)
			for k, j := range picks {
				switch d := deltas[k]; {
				case d > 0:
					ms[j].charge(now, d)
				case d < 0:
					ms[j].refund(now, -d)
				}
				if got, want := found[k].Remaining, ms[j].remaining(now); got != want || !found[k].Fits {
					t.Fatalf("step %d: limiter %d after a settlement of %d: %+v, model remaining %d", step, j, deltas[k], found[k], want)
				}
			}
		case r < 7:
			j := rng.IntN(len(ls))
			n := 1 + rng.Int64N(capacity(ms[j].p)+1)
			d, err := ls[j].Acquire(now, n)
			if err != nil {
				t.Fatal(err)
			}
			if want := ms[j].remaining(now) >= n; d.Allowed != want {
				t.Fatalf("step %d: single acquire %d: allowed %v, model %v", step, n, d.Allowed, want)
			}
			if d.Allowed {
				ms[j].grants = append(ms[j].grants, grant{now, n})
			}
		case r < 8:
			for j := range ls {
				if got, want := ls[j].Available(now).Remaining, ms[j].remaining(now); got != want {
					t.Fatalf("step %d: limiter %d: available %d, model %d", step, j, got, want)
				}
			}
		default:
			switch rng.IntN(4) {
			case 0:
			case 1:
				now += rng.Int64N(int64(200 * time.Millisecond))
			case 2:
				now += rng.Int64N(int64(2 * time.Second))
			default:
				now += rng.Int64N(int64(20 * time.Second))
			}
		}
	}
	if !adjust {
		for j := range ms {
			checkContract(t, ms[j].p, ms[j].grants)
		}
	}
}

// checkJoint makes one joint decision of perm[i] permits from ls[picks[i]]
// and checks it against the models, recording its grants in them.
func checkJoint(t *testing.T, step int, ls []*limiter.Limiter, ms []*model, picks []int, perm []int64, now int64, mode limiter.Mode) {
	t.Helper()
	// The distinct limiters, in order of first appearance, and their sums.
	var distinct []int
	sums := map[int]int64{}
	for i, j := range picks {
		if _, ok := sums[j]; !ok {
			distinct = append(distinct, j)
		}
		sums[j] += perm[i]
	}
	dls := make([]*limiter.Limiter, len(distinct))
	totals := make([]int64, len(distinct))
	for k, j := range distinct {
		dls[k], totals[k] = ls[j], sums[j]
	}
	found := limiter.DecideAll(now, dls, totals, mode)
	if mode == limiter.Charge || mode == limiter.Refund {
		for k, j := range distinct {
			if mode == limiter.Charge {
				ms[j].charge(now, sums[j])
			} else {
				ms[j].refund(now, sums[j])
			}
			c := found[k]
			if !c.Fits || c.ExceedsCapacity || c.RetryAfter != 0 {
				t.Fatalf("step %d: limiter %d after %d of mode %d: %+v, want it applied", step, j, sums[j], mode, c)
			}
			if got, want := c.Remaining, ms[j].remaining(now); got != want {
				t.Fatalf("step %d: limiter %d after %d of mode %d: remaining %d, model %d", step, j, sums[j], mode, got, want)
			}
		}
		return
	}

	allowed, exceeds := true, false
	var retry int64
	for k, j := range distinct {
		m, n := ms[j], sums[j]
		fits := n <= capacity(m.p) && m.remaining(now) >= n
		allowed = allowed && fits
		if n > capacity(m.p) {
			exceeds = true
		} else if !fits {
			retry = max(retry, m.retry(now, n))
		}
		c := found[k]
		if c.Fits != fits || c.ExceedsCapacity != (n > capacity(m.p)) {
			t.Fatalf("step %d: limiter %d asked %d: fits %v exceeds %v, model %v %v", step, j, n, c.Fits, c.ExceedsCapacity, fits, n > capacity(m.p))
		}
		if !fits && !c.ExceedsCapacity {
			if got, want := int64(c.RetryAfter), m.retry(now, n); got != want {
				t.Fatalf("step %d: limiter %d asked %d: retry %d, model %d", step, j, n, got, want)
			}
		}
	}
	if allowed && mode == limiter.Take {
		for _, j := range distinct {
			ms[j].grants = append(ms[j].grants, grant{now, sums[j]})
		}
	}
	for k, j := range distinct {
		if got, want := found[k].Remaining, ms[j].remaining(now); got != want {
			t.Fatalf("step %d: limiter %d after a joint decision (allowed %v, mode %d): remaining %d, model %d", step, j, allowed, mode, got, want)
		}
	}

	items := make([]limiter.Item, len(picks))
	for i, j := range picks {
		items[i] = limiter.Item{Name: fmt.Sprintf("l%d", j), Permits: perm[i]}
	}
	names, _, index := limiter.Totals(items)
	if len(names) != len(distinct) {
		t.Fatalf("Totals: %d names, want %d", len(names), len(distinct))
	}
	v := limiter.NewVerdict(items, found, index)
	if v.Allowed != allowed || v.ExceedsCapacity != exceeds {
		t.Fatalf("step %d: verdict allowed %v exceeds %v, model %v %v", step, v.Allowed, v.ExceedsCapacity, allowed, exceeds)
	}
	if want := time.Duration(retry); !allowed && !exceeds && v.RetryAfter != want {
		t.Fatalf("step %d: verdict retry %s, model %s", step, v.RetryAfter, want)
	}
	for i, c := range v.Checks {
		if c.Name != items[i].Name || c.Permits != items[i].Permits {
			t.Fatalf("step %d: check %d is %q×%d, want %q×%d", step, i, c.Name, c.Permits, items[i].Name, items[i].Permits)
		}
	}
}

// TestDecideAllConcurrent runs joint decisions over overlapping sets of
// sliding logs from many goroutines, in opposite orders so that a lock
// order that depended on the caller's order would deadlock, and checks
// that each log holds exactly the permits of the decisions that were
// allowed: one per allowed decision naming it, never more than its limit,
// and none taken by a decision that was denied.
func TestDecideAllConcurrent(t *testing.T) {
	const limit = 200
	p := limiter.Policy{Limit: limit, Period: time.Hour, Algorithm: limiter.SlidingLog}
	ls := []*limiter.Limiter{mustNew(t, p), mustNew(t, p), mustNew(t, p)}
	now := t0.UnixNano()
	sets := [][]int{{0, 1}, {1, 0}, {1, 2}, {2, 1}, {0, 2}, {2, 0}, {0, 1, 2}, {2, 1, 0}}
	var (
		mu      sync.Mutex
		granted = make([]int64, len(ls))
		wg      sync.WaitGroup
	)
	for w := range 16 {
		wg.Go(func() {
			for k := range 200 {
				set := sets[(w+k)%len(sets)]
				dls := make([]*limiter.Limiter, len(set))
				totals := make([]int64, len(set))
				for i, j := range set {
					dls[i], totals[i] = ls[j], 1
				}
				found := limiter.DecideAll(now, dls, totals, limiter.Take)
				all := !slices.ContainsFunc(found, func(c limiter.Check) bool { return !c.Fits })
				if all {
					mu.Lock()
					for _, j := range set {
						granted[j]++
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for j, l := range ls {
		used := limit - l.Available(now).Remaining
		if used != granted[j] {
			t.Errorf("limiter %d: %d permits taken, %d granted by allowed decisions", j, used, granted[j])
		}
		if used > limit {
			t.Errorf("limiter %d: %d permits taken, over its limit of %d", j, used, limit)
		}
	}
}
