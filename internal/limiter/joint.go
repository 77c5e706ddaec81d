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
	t := clampNow(now)
	order := lockOrder(ls)
	for _, j := range order {
		ls[j].mu.Lock()
	}
	found = make([]Check, len(ls))
	switch mode {
	case Charge, Refund:
		for j, l := range ls {
			found[j] = l.adjust(t, totals[j], mode)
		}
	default:
		all := true
		for j, l := range ls {
			found[j] = l.fit(t, totals[j])
			all = all && found[j].Fits
		}
		if all && mode == Take {
			for j, l := range ls {
				found[j] = l.take(t, totals[j])
			}
		}
	}
	for _, j := range order {
		ls[j].mu.Unlock()
	}
	return found
}

// AdjustAll charges deltas[j] permits to ls[j] where it is positive and
// refunds -deltas[j] where it is negative, at now, all in one step, as
// DecideAll does; found[j] is ls[j] as it is then, Fits set. The limiters
// must be distinct.
func AdjustAll(now int64, ls []*Limiter, deltas []int64) (found []Check) {
	t := clampNow(now)
	order := lockOrder(ls)
	for _, j := range order {
		ls[j].mu.Lock()
	}
	found = make([]Check, len(ls))
	for j, l := range ls {
		switch d := deltas[j]; {
		case d > 0:
			found[j] = l.adjust(t, d, Charge)
		case d < 0:
			found[j] = l.adjust(t, -d, Refund)
		default:
			found[j] = l.state(t)
		}
	}
	for _, j := range order {
		ls[j].mu.Unlock()
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

// state reports the limiter as it is now, Fits set. l.mu must be held.
func (l *Limiter) state(now int64) Check {
	var av Availability
	if l.gcra {
		av = l.rate.Available(l.tat, now)
	} else {
		av = l.log.Available(l.window, now)
	}
	return Check{Fits: true, Remaining: av.Remaining, Limit: av.Limit, ResetAfter: av.ResetAfter}
}

// fit reports whether n permits fit now, recording nothing, with the
// limiter's state as it is. l.mu must be held.
func (l *Limiter) fit(now, n int64) Check {
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

// take records n permits, which fit now. l.mu must be held.
func (l *Limiter) take(now, n int64) Check {
	var d Decision
	if l.gcra {
		l.tat, d = l.rate.Acquire(l.tat, now, n)
	} else {
		d = l.log.Acquire(l.window, now, n)
	}
	return checkOf(d)
}

// adjust charges or refunds n permits, and reports the limiter as it is
// then. l.mu must be held.
func (l *Limiter) adjust(now, n int64, mode Mode) Check {
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

func checkOf(d Decision) Check {
	return Check{
		Fits: d.Allowed, ExceedsCapacity: d.ExceedsCapacity,
		Remaining: d.Remaining, Limit: d.Limit,
		RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter,
	}
}
