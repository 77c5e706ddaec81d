package limiter

import (
	"math"
	"time"
)

// TAT is GCRA's theoretical arrival time: the instant at which the bucket is
// full again. It is NS nanoseconds since the Unix epoch plus Frac/Limit of a
// nanosecond, so it is exact for every rate. The zero TAT is a full bucket at
// any time from the epoch on. TATs of one policy order by remaining
// capacity: a later TAT has fewer permits left, at every instant.
type TAT struct {
	NS   int64
	Frac uint32
}

// Compare returns -1, 0 or +1 as t is before, equal to or after u.
func (t TAT) Compare(u TAT) int {
	switch {
	case t.NS < u.NS:
		return -1
	case t.NS > u.NS:
		return 1
	case t.Frac < u.Frac:
		return -1
	case t.Frac > u.Frac:
		return 1
	}
	return 0
}

// FullAt reports whether a bucket with this TAT is full at now (nanoseconds
// since the Unix epoch): it holds no trace of past acquisitions and is
// indistinguishable from an unused one.
func (t TAT) FullAt(now int64) bool {
	return t.NS < now || t.NS == now && t.Frac == 0
}

// Rate is the arithmetic of one GCRA policy: a bucket of Burst permits that
// refills one permit every Period/Limit. All of its methods are pure
// functions of their arguments; the zero Rate is not usable.
type Rate struct {
	limit, period, burst uint64
	tolerance            u128 // burst × period, in units of 1/limit ns
}

// NewRate returns the Rate of p, which must be valid (see Policy.Validate).
func NewRate(p Policy) Rate {
	p = p.Normalize()
	r := Rate{limit: uint64(p.Limit), period: uint64(p.Period), burst: uint64(p.Burst)}
	r.tolerance = mul64(r.burst, r.period)
	return r
}

// backlog is how far t lies after now, in units of 1/limit ns.
func (r *Rate) backlog(t TAT, now int64) u128 {
	now = clampNow(now)
	if t.FullAt(now) {
		return u128{}
	}
	// t.NS >= now, and the true difference fits in uint64 even when the
	// signed subtraction would overflow.
	return mul64(uint64(t.NS)-uint64(now), r.limit).addSmall(uint64(t.Frac))
}

// remaining is how many permits fit in the bucket given its backlog.
func (r *Rate) remaining(backlog u128) int64 {
	if backlog.cmp(r.tolerance) >= 0 {
		return 0
	}
	q, _ := r.tolerance.sub(backlog).divmod(r.period)
	return int64(q)
}

// duration converts a span in units of 1/limit ns to a Duration, rounding up
// so that a caller told to wait never retries too early.
func (r *Rate) duration(units u128) time.Duration {
	ns := units.divCeil(r.limit)
	if ns > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// Acquire decides whether n permits fit at now (nanoseconds since the Unix
// epoch, clamped to [0, MaxNanos]) in a bucket whose TAT is t, and returns the TAT to store. When the
// decision is a denial the returned TAT is t itself: nothing is recorded.
// n must be at least 1.
func (r *Rate) Acquire(t TAT, now int64, n int64) (TAT, Decision) {
	backlog := r.backlog(t, now)
	d := Decision{Permits: n, Limit: int64(r.limit)}
	if uint64(n) > r.burst {
		d.ExceedsCapacity = true
		d.Remaining = r.remaining(backlog)
		d.ResetAfter = r.duration(backlog)
		return t, d
	}
	after := backlog.add(mul64(uint64(n), r.period))
	if after.cmp(r.tolerance) > 0 {
		d.Remaining = r.remaining(backlog)
		d.RetryAfter = r.duration(after.sub(r.tolerance))
		d.ResetAfter = r.duration(backlog)
		return t, d
	}
	d.Allowed = true
	d.Remaining = r.remaining(after)
	// One division gives both the new TAT and the reset time.
	q, rem := after.divmod(r.limit) // q <= period <= MaxPeriod, so now+q <= MaxInt64
	d.ResetAfter = time.Duration(q)
	if rem != 0 {
		d.ResetAfter++
	}
	return TAT{NS: clampNow(now) + int64(q), Frac: uint32(rem)}, d
}

// Available reports how many permits could be acquired at now from a bucket
// whose TAT is t, without acquiring any.
func (r *Rate) Available(t TAT, now int64) Availability {
	backlog := r.backlog(t, now)
	return Availability{
		Remaining:  r.remaining(backlog),
		Limit:      int64(r.limit),
		ResetAfter: r.duration(backlog),
	}
}

// maxDebt bounds how far a Charge can put a bucket beyond empty: its TAT
// lies at most MaxPeriod after now, so it always fits in an int64.
func (r *Rate) maxDebt() u128 { return mul64(uint64(MaxPeriod), r.limit) }

// Charge records n permits at now (as in Acquire) whether or not they fit,
// and returns the TAT to store: a bucket charged past empty is in debt and
// grants nothing until time has repaid it. The debt is capped: the TAT
// lies at most MaxPeriod after now, and a charge beyond that is forgiven.
// n must be at least 1.
func (r *Rate) Charge(t TAT, now int64, n int64) TAT {
	after := r.backlog(t, now).add(mul64(uint64(n), r.period))
	if cap := r.maxDebt(); after.cmp(cap) > 0 {
		after = cap
	}
	return r.tatAfter(now, after)
}

// Refund gives back n permits at now (as in Acquire) and returns the TAT to
// store: the bucket regains n permits, but never more than it holds when
// full. n must be at least 1.
func (r *Rate) Refund(t TAT, now int64, n int64) TAT {
	backlog, cost := r.backlog(t, now), mul64(uint64(n), r.period)
	if backlog.cmp(cost) <= 0 {
		return TAT{}
	}
	return r.tatAfter(now, backlog.sub(cost))
}

// RefundHeld is Refund of n permits that a reservation which left the
// TAT until holds: it gives back at most what of them has not drained by
// now, until − now, and nothing once until has passed.
func (r *Rate) RefundHeld(t TAT, now int64, n int64, until TAT) TAT {
	backlog, cost := r.backlog(t, now), mul64(uint64(n), r.period)
	if held := r.backlog(until, now); held.cmp(cost) < 0 {
		cost = held
	}
	if backlog.cmp(cost) <= 0 {
		return TAT{}
	}
	return r.tatAfter(now, backlog.sub(cost))
}

// tatAfter is the TAT that lies backlog (at most maxDebt) after now.
func (r *Rate) tatAfter(now int64, backlog u128) TAT {
	if backlog.isZero() {
		return TAT{}
	}
	q, rem := backlog.divmod(r.limit)
	return TAT{NS: clampNow(now) + int64(q), Frac: uint32(rem)}
}
