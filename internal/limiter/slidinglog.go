package limiter

import (
	"math"
	"time"
)

// MaxLogEntries bounds a sliding log: one limiter holds at most this many
// entries (16 bytes each, so at most 64 KiB). A log needs one entry per
// acquisition still inside the window, and never more than Limit of them, so
// a policy with Limit <= MaxLogEntries is always exact. Beyond that, when the
// log is full its two oldest entries are merged into one stamped with the
// later time: the merged permits then count for slightly longer than they
// should, so the log can only deny earlier, never grant more than Limit in
// any window.
const MaxLogEntries = 4096

type logEntry struct {
	at int64 // nanoseconds since the Unix epoch
	n  int64 // permits granted at that instant
}

// Log is the state of one SlidingLog limiter: the grants of the last Period,
// oldest first, in a ring buffer that grows on demand up to MaxLogEntries.
// The zero Log is an empty one. It is not safe for concurrent use.
type Log struct {
	ring []logEntry
	head int   // index of the oldest entry
	size int   // number of entries
	used int64 // permits held by the entries
}

// Window is the arithmetic of one SlidingLog policy.
type Window struct {
	limit      int64
	period     int64
	maxEntries int
}

// NewWindow returns the Window of p, which must be valid.
func NewWindow(p Policy) Window {
	return Window{limit: p.Limit, period: int64(p.Period), maxEntries: int(min(p.Limit, MaxLogEntries))}
}

func (l *Log) at(i int) *logEntry { return &l.ring[(l.head+i)&(len(l.ring)-1)] }

// expired reports whether a grant at `at` has left the window (now-period, now].
func (w Window) expired(at, now int64) bool {
	return now > at && uint64(now)-uint64(at) >= uint64(w.period)
}

// expire drops the grants that have left the window at now.
func (l *Log) expire(w Window, now int64) {
	for l.size > 0 {
		e := l.at(0)
		if !w.expired(e.at, now) {
			return
		}
		l.used -= e.n
		l.head = (l.head + 1) & (len(l.ring) - 1)
		l.size--
	}
}

// until is the time from now until the grant at `at` leaves the window.
func (w Window) until(at, now int64) time.Duration {
	if w.expired(at, now) {
		return 0
	}
	d := uint64(at) - uint64(now) + uint64(w.period) // at+period-now, in (0, period + (at-now)]
	if d > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

func (l *Log) resetAfter(w Window, now int64) time.Duration {
	if l.size == 0 {
		return 0
	}
	return w.until(l.at(l.size-1).at, now)
}

// Acquire decides whether n permits fit at now (nanoseconds since the Unix
// epoch, clamped to [0, MaxNanos]) and records them if so. A denial leaves l unchanged apart from
// forgetting grants that have left the window. n must be at least 1.
func (l *Log) Acquire(w Window, now int64, n int64) Decision {
	now = clampNow(now)
	d := l.fit(w, now, n)
	if d.Allowed {
		l.append(w, now, n)
		d.Remaining -= n
		d.ResetAfter = l.resetAfter(w, now)
	}
	return d
}

// fit is Acquire at a clamped now without recording anything: Allowed says
// whether n permits fit, and Remaining and ResetAfter are the log's as it
// is. It forgets grants that have left the window.
func (l *Log) fit(w Window, now int64, n int64) Decision {
	l.expire(w, now)
	d := Decision{Permits: n, Limit: w.limit, Remaining: l.remaining(w), ResetAfter: l.resetAfter(w, now)}
	switch {
	case n > w.limit:
		d.ExceedsCapacity = true
	case l.used+n > w.limit:
		d.RetryAfter = l.retryAfter(w, now, n)
	default:
		d.Allowed = true
	}
	return d
}

// retryAfter is how long until enough grants leave the window for n more.
func (l *Log) retryAfter(w Window, now int64, n int64) time.Duration {
	excess := l.used + n - w.limit
	for i := 0; i < l.size; i++ {
		e := l.at(i)
		excess -= e.n
		if excess <= 0 {
			return w.until(e.at, now)
		}
	}
	return 0 // unreachable while n <= limit
}

// append records n permits at now. Time never runs backwards inside a log:
// a grant stamped before the newest entry takes the newest entry's time, which
// keeps it counted at least as long as it should be.
func (l *Log) append(w Window, now int64, n int64) {
	l.used += n
	if l.size > 0 {
		last := l.at(l.size - 1)
		if now <= last.at {
			last.n += n
			return
		}
	}
	if l.size == w.maxEntries {
		if l.size == 1 {
			// A log of one entry (a limit of 1, charged past it) merges
			// the grant into it, stamped with the later time.
			e := l.at(0)
			e.at, e.n = now, e.n+n
			return
		}
		// Merge the two oldest entries into the later one.
		first := l.at(0)
		l.at(1).n += first.n
		l.head = (l.head + 1) & (len(l.ring) - 1)
		l.size--
	}
	if l.size == len(l.ring) {
		l.grow(w)
	}
	*l.at(l.size) = logEntry{at: now, n: n}
	l.size++
}

func (l *Log) grow(w Window) {
	c := max(4, 2*len(l.ring))
	ring := make([]logEntry, c)
	for i := 0; i < l.size; i++ {
		ring[i] = *l.at(i)
	}
	l.ring, l.head = ring, 0
}

// Available reports how many permits could be acquired at now without
// acquiring any. It forgets grants that have left the window.
func (l *Log) Available(w Window, now int64) Availability {
	now = clampNow(now)
	l.expire(w, now)
	return Availability{Remaining: l.remaining(w), Limit: w.limit, ResetAfter: l.resetAfter(w, now)}
}

// remaining is what the log could grant now: none while it is in debt.
func (l *Log) remaining(w Window) int64 { return max(w.limit-l.used, 0) }

// MaxLogDebt bounds how far past its limit a Charge can put a sliding
// log: a charge beyond it is forgiven.
const MaxLogDebt = MaxLimit

// Charge records n permits at now (as in Acquire) whether or not they fit:
// a log charged past its limit is in debt and grants nothing until enough
// of its grants have left the window. The log holds at most Limit +
// MaxLogDebt permits. n must be at least 1.
func (l *Log) Charge(w Window, now int64, n int64) {
	now = clampNow(now)
	l.expire(w, now)
	if n = min(n, w.limit+MaxLogDebt-l.used); n > 0 {
		l.append(w, now, n)
	}
}

// Refund gives back n permits, taken from the newest grants first: they
// are the ones a caller that did not act made last. A log never holds
// fewer than no permits. n must be at least 1.
func (l *Log) Refund(w Window, now int64, n int64) {
	l.expire(w, clampNow(now))
	for n > 0 && l.size > 0 {
		last := l.at(l.size - 1)
		if last.n > n {
			last.n -= n
			l.used -= n
			return
		}
		n -= last.n
		l.used -= last.n
		l.size--
	}
}

// RefundSince gives back up to n permits granted at or after the instant
// at: from the oldest entry stamped at or after it, which holds what was
// granted then (or those permits merged into a later entry), and nothing
// once at has left the window, when the later entries are other grants.
// An entry left empty is dropped. n must be at least 1.
func (l *Log) RefundSince(w Window, now int64, n int64, at int64) {
	now = clampNow(now)
	l.expire(w, now)
	if w.expired(at, now) {
		return
	}
	i := 0
	for i < l.size && l.at(i).at < at {
		i++
	}
	if i == l.size {
		return
	}
	e := l.at(i)
	k := min(n, e.n)
	e.n -= k
	l.used -= k
	if e.n > 0 {
		return
	}
	for ; i+1 < l.size; i++ {
		*l.at(i) = *l.at(i + 1)
	}
	l.size--
}

// Len is the number of entries the log holds, for memory accounting.
func (l *Log) Len() int { return l.size }
