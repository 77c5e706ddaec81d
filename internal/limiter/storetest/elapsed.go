package storetest

import (
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Elapsed bounds how far a backend's clock moved between two of its
// decisions, from local instants taken around the calls that made them: the
// first decided somewhere in [t0, t1], the second in [ta, tb], so its clock
// moved between ta-t1 and tb-t0. It holds on any machine, however slow: a
// slower call only widens the bounds. It assumes the backend's clock runs
// at the rate of ours (an in-process store, or a server on this host, as in
// tests), to within Tolerance, which also covers a server's rounding of
// its time to whole microseconds.
type Elapsed struct{ Min, Max time.Duration }

// Tolerance widens every Elapsed on both sides.
const Tolerance = time.Millisecond

// Since returns the Elapsed between a decision made in [t0, t1] and one
// made in [ta, tb].
func Since(t0, t1, ta, tb time.Time) Elapsed {
	return Elapsed{Min: max(0, ta.Sub(t1)-Tolerance), Max: tb.Sub(t0) + Tolerance}
}

// Remaining bounds what a limiter of p that granted its whole capacity at
// once (Limit permits; GCRA with Burst equal to Limit) has left after e:
// under GCRA one permit back per Period/Limit, under the sliding log all of
// them when the grant leaves the window.
func (e Elapsed) Remaining(p limiter.Policy) (lo, hi int64) {
	back := func(d time.Duration) int64 {
		if p.Algorithm == limiter.SlidingLog {
			if d >= p.Period {
				return p.Limit
			}
			return 0
		}
		return min(p.Limit, int64(d)*p.Limit/int64(p.Period))
	}
	return back(e.Min), back(e.Max)
}

// Until bounds how long after the second decision an instant lies that is
// d after the first: what a backend reports as ResetAfter, or as
// RetryAfter for permits it will hold again at that instant.
func (e Elapsed) Until(d time.Duration) (lo, hi time.Duration) {
	return max(0, d-e.Max), max(0, d-e.Min)
}
