package limiter

import "slices"

// DecideAll decides at now (as in Acquire) whether totals[j] permits fit in
// ls[j] for every j, and under Take records all of them when they do: all
// or nothing, atomically with respect to every other call on these
// limiters. Under Charge and Refund it charges or refunds every total,
// unconditionally, as one step. found[j] is what ls[j] found, with Name and Permits unset (see
// NewVerdict). The limiters must be distinct and each total from 1 to
// MaxItems·MaxLimit.
//
// It holds every limiter's lock while it decides, taking them in the order
// limiters were made, so that concurrent calls on overlapping limiters
// never deadlock and no lock is shared by unrelated limiters.
func DecideAll(now int64, ls []*Limiter, totals []int64, mode Mode) (found []Check) {
	unlock := Lock(ls)
	bs := make([]*Bucket, len(ls))
	for j, l := range ls {
		bs[j] = &l.b
	}
	found = DecideBuckets(now, bs, totals, mode)
	unlock()
	return found
}

// DecideBuckets is DecideAll on buckets that the caller guards: it decides
// at now whether totals[j] permits fit in bs[j] for every j and, under
// Take, takes all of them when they do; under Charge and Refund it charges
// or refunds every total. The buckets must be distinct.
func DecideBuckets(now int64, bs []*Bucket, totals []int64, mode Mode) (found []Check) {
	t := clampNow(now)
	found = make([]Check, len(bs))
	switch mode {
	case Charge, Refund:
		for j, b := range bs {
			found[j] = b.adjust(t, totals[j], mode)
		}
	default:
		all := true
		for j, b := range bs {
			found[j] = b.fit(t, totals[j])
			all = all && found[j].Fits
		}
		if all && mode == Take {
			for j, b := range bs {
				found[j] = b.take(t, totals[j])
			}
		}
	}
	return found
}

// Lock takes the locks of the distinct limiters ls in the order limiters
// were made, so that concurrent joint decisions on overlapping limiters
// never deadlock, and returns the func that releases them. A caller that
// also locks other tables (keyed limiters' shards) takes them after these,
// in the order of their NextID numbers.
func Lock(ls []*Limiter) (unlock func()) {
	order := lockOrder(ls)
	for _, j := range order {
		ls[j].mu.Lock()
	}
	return func() {
		for _, j := range order {
			ls[j].mu.Unlock()
		}
	}
}

// AdjustAll charges deltas[j] permits to ls[j] where it is positive and
// refunds -deltas[j] where it is negative, at now, all in one step, as
// DecideAll does; found[j] is ls[j] as it is then, Fits set. With holds
// (a settlement), the refund to ls[j] gives back no more than holds[j]
// still holds (see Held). The limiters must be distinct.
func AdjustAll(now int64, ls []*Limiter, deltas []int64, holds []Held) (found []Check) {
	unlock := Lock(ls)
	bs := make([]*Bucket, len(ls))
	for j, l := range ls {
		bs[j] = &l.b
	}
	found = AdjustBuckets(now, bs, deltas, holds)
	unlock()
	return found
}

// AdjustBuckets is AdjustAll on buckets that the caller guards.
func AdjustBuckets(now int64, bs []*Bucket, deltas []int64, holds []Held) (found []Check) {
	t := clampNow(now)
	found = make([]Check, len(bs))
	for j, b := range bs {
		switch d := deltas[j]; {
		case d > 0:
			found[j] = b.adjust(t, d, Charge)
		case d < 0 && holds != nil:
			found[j] = b.refundHeld(t, -d, holds[j])
		case d < 0:
			found[j] = b.adjust(t, -d, Refund)
		default:
			found[j] = b.state(t)
		}
	}
	return found
}

// lockOrder is the order in which DecideAll and AdjustAll lock ls: the
// order the limiters were made in.
func lockOrder(ls []*Limiter) []int {
	order := make([]int, len(ls))
	for j := range order {
		order[j] = j
	}
	slices.SortFunc(order, func(a, b int) int {
		if ls[a].id < ls[b].id {
			return -1
		}
		return 1
	})
	return order
}

// state reports the bucket as it is now, Fits set.
func (l *Bucket) state(now int64) Check {
	var av Availability
	if l.gcra {
		av = l.rate.Available(l.tat, now)
	} else {
		av = l.log.Available(l.window, now)
	}
	return Check{Fits: true, Remaining: av.Remaining, Limit: av.Limit, ResetAfter: av.ResetAfter}
}

// fit reports whether n permits fit now, recording nothing, with the
// bucket's state as it is.
func (l *Bucket) fit(now, n int64) Check {
	if l.gcra {
		_, d := l.rate.Acquire(l.tat, now, n)
		c := checkOf(d)
		if d.Allowed {
			av := l.rate.Available(l.tat, now)
			c.Remaining, c.ResetAfter = av.Remaining, av.ResetAfter
		}
		return c
	}
	return checkOf(l.log.fit(l.window, now, n))
}

// take records n permits, which fit now.
func (l *Bucket) take(now, n int64) Check {
	var d Decision
	if l.gcra {
		l.tat, d = l.rate.Acquire(l.tat, now, n)
	} else {
		d = l.log.Acquire(l.window, now, n)
	}
	c := checkOf(d)
	if c.Fits {
		c.held = Held{At: now, Until: l.tat}
	}
	return c
}

// adjust charges or refunds n permits, and reports the bucket as it is
// then.
func (l *Bucket) adjust(now, n int64, mode Mode) Check {
	switch {
	case l.gcra && mode == Charge:
		l.tat = l.rate.Charge(l.tat, now, n)
	case l.gcra:
		l.tat = l.rate.Refund(l.tat, now, n)
	case mode == Charge:
		l.log.Charge(l.window, now, n)
	default:
		l.log.Refund(l.window, now, n)
	}
	return l.state(now)
}

// refundHeld refunds n permits that h holds, and reports the bucket as it
// is then.
func (l *Bucket) refundHeld(now, n int64, h Held) Check {
	if l.gcra {
		l.tat = l.rate.RefundHeld(l.tat, now, n, h.Until)
	} else {
		l.log.RefundSince(l.window, now, n, h.At)
	}
	return l.state(now)
}

func checkOf(d Decision) Check {
	return Check{
		Fits: d.Allowed, ExceedsCapacity: d.ExceedsCapacity,
		Remaining: d.Remaining, Limit: d.Limit,
		RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter,
	}
}
