package limiter

import (
	"math"
	"sync"
	"time"
)

// Limiter is the state of one rate limit in process memory. It is safe for
// concurrent use; the zero value is not usable (see New).
type Limiter struct {
	policy Policy
	rate   Rate   // GCRA
	window Window // SlidingLog

	mu  sync.Mutex
	tat TAT // GCRA
	log Log // SlidingLog
}

// New returns a full limiter for p, or an error wrapping ErrInvalidPolicy.
func New(p Policy) (*Limiter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	p = p.Normalize()
	l := &Limiter{policy: p}
	if p.Algorithm == GCRA {
		l.rate = NewRate(p)
	} else {
		l.window = NewWindow(p)
	}
	return l, nil
}

// Policy returns the limiter's policy with its defaults filled in.
func (l *Limiter) Policy() Policy { return l.policy }

// Acquire takes n permits at now if all of them fit, and reports the
// decision. A denial records nothing. n must be from 1 to MaxLimit, otherwise
// the error wraps ErrInvalidPermits and nothing changes.
func (l *Limiter) Acquire(now time.Time, n int64) (Decision, error) {
	if err := CheckPermits(n); err != nil {
		return Decision{}, err
	}
	t := Nanos(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.policy.Algorithm == GCRA {
		var d Decision
		l.tat, d = l.rate.Acquire(l.tat, t, n)
		return d, nil
	}
	return l.log.Acquire(l.window, t, n), nil
}

// Available reports how many permits could be acquired at now, without
// acquiring any.
func (l *Limiter) Available(now time.Time) Availability {
	t := Nanos(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.policy.Algorithm == GCRA {
		return l.rate.Available(l.tat, t)
	}
	return l.log.Available(l.window, t)
}

// Nanos converts t to nanoseconds since the Unix epoch, clamped to
// [0, MaxInt64]: instants before 1970 count as the epoch and instants after
// 2262 as the last representable nanosecond, where UnixNano is undefined.
func Nanos(t time.Time) int64 {
	if t.Before(epoch) {
		return 0
	}
	if t.After(lastNano) {
		return math.MaxInt64
	}
	return t.UnixNano()
}

var (
	epoch    = time.Unix(0, 0)
	lastNano = time.Unix(0, math.MaxInt64)
)
