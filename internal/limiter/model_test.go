package limiter_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/keystest"
)

// model is the reference for both algorithms: a plain list of grants, each
// an instant and a permit count, with every decision recomputed from the
// whole list by brute force.
type model struct {
	p      limiter.Policy // normalized
	grants []grant
}

type grant struct{ at, n int64 }

// tokenBucket answers for GCRA. A greedy token bucket of size b refilling at
// limit/period admits n at now exactly when, for every earlier grant i,
// the permits granted from i on plus n fit in b plus what refilled since i:
//
//	(S_i + n)·period ≤ b·period + (now − t_i)·limit
//
// and n ≤ b. The largest such n is the remaining capacity.
func (m *model) gcraRemaining(now int64) int64 {
	b, period, limit := m.p.Burst, int64(m.p.Period), m.p.Limit
	rem := b
	var suffix int64
	for i := len(m.grants) - 1; i >= 0; i-- {
		suffix += m.grants[i].n
		// floor((b·period + (now−t_i)·limit − S_i·period) / period)
		v := b*period + (now-m.grants[i].at)*limit - suffix*period
		r := floorDiv(v, period)
		rem = min(rem, r)
	}
	return max(rem, 0)
}

// gcraRetry is the least wait after which n permits fit.
func (m *model) gcraRetry(now, n int64) int64 {
	b, period, limit := m.p.Burst, int64(m.p.Period), m.p.Limit
	var wait, suffix int64
	for i := len(m.grants) - 1; i >= 0; i-- {
		suffix += m.grants[i].n
		// smallest w with (S_i+n)·period ≤ b·period + (now+w−t_i)·limit
		need := (suffix+n)*period - b*period - (now-m.grants[i].at)*limit
		wait = max(wait, ceilDiv(need, limit))
	}
	return wait
}

// slidingUsed is the number of permits granted in (now−period, now].
func (m *model) slidingUsed(now int64) int64 {
	var used int64
	for _, g := range m.grants {
		if g.at > now-int64(m.p.Period) {
			used += g.n
		}
	}
	return used
}

func (m *model) remaining(now int64) int64 {
	if m.p.Algorithm == limiter.GCRA {
		return m.gcraRemaining(now)
	}
	return max(m.p.Limit-m.slidingUsed(now), 0)
}

// charge records n permits at now, fitting or not. A sliding log keeps at
// most min(limit, MaxLogEntries) entries, one per instant, and a charge
// can exceed that where grants that fit cannot: the log then merges its
// two oldest entries into the later one (a log of one entry merges the
// grant into it, stamped now), which counts their permits longer. The
// model merges alike, so that it stays exact.
func (m *model) charge(now, n int64) {
	m.grants = append(m.grants, grant{now, n})
	if m.p.Algorithm == limiter.GCRA {
		return
	}
	var live []int // the grants in the window, one per instant
	for i, g := range m.grants {
		if g.at > now-int64(m.p.Period) && g.n > 0 {
			if k := len(live); k > 0 && m.grants[live[k-1]].at == g.at {
				m.grants[live[k-1]].n += g.n
				m.grants[i].n = 0
				continue
			}
			live = append(live, i)
		}
	}
	if maxEntries := min(m.p.Limit, limiter.MaxLogEntries); int64(len(live)) > maxEntries {
		a, b := live[0], live[1]
		if maxEntries == 1 {
			b = live[len(live)-1]
		}
		m.grants[b].n += m.grants[a].n
		m.grants[a].n = 0
	}
}

// refund gives n permits back at now. A token bucket regains them, up to
// full: a grant of -n, which the formula of gcraRemaining caps at the
// burst by itself (its bound b is the empty suffix). A sliding log drops
// them from its newest grants.
func (m *model) refund(now, n int64) {
	if m.p.Algorithm == limiter.GCRA {
		m.grants = append(m.grants, grant{now, -n})
		return
	}
	for i := len(m.grants) - 1; i >= 0 && n > 0; i-- {
		take := min(m.grants[i].n, n)
		m.grants[i].n -= take
		n -= take
	}
}

func (m *model) retry(now, n int64) int64 {
	if m.p.Algorithm == limiter.GCRA {
		return m.gcraRetry(now, n)
	}
	// The earliest instant at which enough grants have left the window.
	for w := int64(0); ; {
		if m.slidingUsed(now+w)+n <= m.p.Limit {
			return w
		}
		// Jump to the next expiry.
		next := int64(-1)
		for _, g := range m.grants {
			if e := g.at + int64(m.p.Period) - now; e > w && (next < 0 || e < next) {
				next = e
			}
		}
		w = next
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 { return -floorDiv(-a, b) }

// TestAgainstModel drives the implementation and the model with long random
// sequences of acquire, available and time advances, and requires identical
// answers: the implementation never admits what the model refuses, never
// refuses what it admits, and reports the same remaining capacity and wait.
func TestAgainstModel(t *testing.T) {
	policies := []limiter.Policy{
		{Limit: 9, Period: 9 * time.Second},
		{Limit: 7, Period: time.Second},                  // fractional emission interval
		{Limit: 13, Period: 1_000_003 * time.Nanosecond}, // prime period
		{Limit: 100, Period: time.Minute, Burst: 10},
		{Limit: 3, Period: time.Millisecond, Burst: 1},
		{Limit: 9, Period: 9 * time.Second, Algorithm: limiter.SlidingLog},
		{Limit: 50, Period: 999 * time.Millisecond, Algorithm: limiter.SlidingLog},
	}
	seeds := 20
	steps := 600
	if testing.Short() {
		seeds, steps = 4, 200
	}
	for _, p := range policies {
		p = p.Normalize()
		for seed := range seeds {
			t.Run(fmt.Sprintf("%s/%d-per-%s/burst-%d/seed-%d", p.Algorithm, p.Limit, p.Period, p.Burst, seed), func(t *testing.T) {
				runModel(t, p, uint64(seed), steps)
			})
		}
	}
}

func runModel(t *testing.T, p limiter.Policy, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	l := mustNew(t, p)
	m := &model{p: p}
	now := t0.UnixNano()
	interval := int64(p.Period) / p.Limit
	var retryAt int64 // the instant the last denial said to come back
	for step := range steps {
		switch r := rng.IntN(10); {
		case r < 6:
			n := 1 + rng.Int64N(max(p.Burst, p.Limit)+2)
			want := m.remaining(now) >= n
			d := acquire(t, l, time.Unix(0, now), n)
			if d.Allowed != want {
				t.Fatalf("step %d: acquire %d at +%dns: got allowed=%v, model says %v (remaining %d)", step, n, now-t0.UnixNano(), d.Allowed, want, m.remaining(now))
			}
			capacity := p.Limit
			if p.Algorithm == limiter.GCRA {
				capacity = p.Burst
			}
			if d.ExceedsCapacity != (n > capacity) {
				t.Fatalf("step %d: acquire %d: ExceedsCapacity=%v, want %v", step, n, d.ExceedsCapacity, n > capacity)
			}
			if !d.Allowed && !d.ExceedsCapacity {
				if got, want := int64(d.RetryAfter), m.retry(now, n); got != want {
					t.Fatalf("step %d: acquire %d: RetryAfter %d, model %d", step, n, got, want)
				}
				retryAt = now + int64(d.RetryAfter)
			}
			if d.Allowed {
				m.grants = append(m.grants, grant{now, n})
			}
			if got, want := d.Remaining, m.remaining(now); got != want {
				t.Fatalf("step %d: acquire %d: remaining %d, model %d", step, n, got, want)
			}
		case r < 8:
			if got, want := l.Available(now).Remaining, m.remaining(now); got != want {
				t.Fatalf("step %d: available %d, model %d", step, got, want)
			}
		default:
			// Mostly small steps around the emission interval, sometimes
			// none (simultaneous requests), sometimes past a whole period.
			// Exact boundaries too: a retry at the advertised instant, one
			// nanosecond before it, and whole intervals and periods.
			switch rng.IntN(8) {
			case 0:
			case 4:
				if retryAt > now {
					now = retryAt
				}
			case 5:
				if retryAt > now+1 {
					now = retryAt - 1
				}
			case 6:
				now += interval
			case 7:
				now += int64(p.Period)
			case 1:
				now += rng.Int64N(interval + 1)
			case 2:
				now += rng.Int64N(3*interval + 1)
			default:
				now += rng.Int64N(int64(p.Period) + 2)
			}
		}
	}
	checkContract(t, p, m.grants)
}

// checkContract checks the documented guarantee on the grants themselves
// (see keystest.Violation).
func checkContract(t *testing.T, p limiter.Policy, grants []grant) {
	t.Helper()
	gs := make([]limiter.Grant, len(grants))
	for i, g := range grants {
		gs[i] = limiter.Grant{At: g.at, N: g.n}
	}
	if err := keystest.Violation(p, gs); err != nil {
		t.Fatal(err)
	}
}
