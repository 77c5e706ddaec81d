package limiter

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Limiter is the state of one rate limit in process memory. It is safe for
// concurrent use; the zero value is not usable (see New).
type Limiter struct {
	policy Policy
	id     uint64 // orders locks in DecideAll

	mu sync.Mutex
	b  Bucket
}

// Bucket is the state of one bucket under a policy, with the policy's
// arithmetic: what a Limiter holds, and what a table of keys makes of a key
// for a joint decision (see DecideBuckets). It is not safe for concurrent
// use; its zero value is not usable (see NewBucket).
type Bucket struct {
	gcra   bool
	rate   Rate   // GCRA
	window Window // SlidingLog
	tat    TAT    // GCRA
	log    Log    // SlidingLog
}

// NewBucket returns a full bucket of p, which must be valid.
func NewBucket(p Policy) Bucket {
	p = p.Normalize()
	if p.Algorithm == GCRA {
		return Bucket{gcra: true, rate: NewRate(p)}
	}
	return Bucket{window: NewWindow(p)}
}

// TAT returns a GCRA bucket's state.
func (b *Bucket) TAT() TAT { return b.tat }

// SetTAT sets a GCRA bucket's state.
func (b *Bucket) SetTAT(t TAT) { b.tat = t }

// Log returns a sliding-log bucket's state. The Log shares its ring with
// the bucket: a caller that keeps it hands the bucket over.
func (b *Bucket) Log() Log { return b.log }

// SetLog sets a sliding-log bucket's state, which the bucket takes over.
func (b *Bucket) SetLog(l Log) { b.log = l }

// New returns a full limiter for p, or an error wrapping ErrInvalidPolicy.
func New(p Policy) (*Limiter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	p = p.Normalize()
	return &Limiter{policy: p, id: lastID.Add(1), b: NewBucket(p)}, nil
}

// Bucket returns the limiter's state, for a joint decision that holds the
// limiter's lock (see Lock) while it uses it.
func (l *Limiter) Bucket() *Bucket { return &l.b }

// Idle reports whether the limiter holds no counts at now: its bucket is
// full.
func (l *Limiter) Idle(now int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Empty(now)
}

// NextID returns a number that no Limiter and no other caller of NextID
// has: joint decisions lock limiters before the locks of other tables,
// ordered by these numbers (see Lock).
func NextID() uint64 { return lastID.Add(1) }

// lastID numbers limiters as they are made.
var lastID atomic.Uint64

// Policy returns the limiter's policy with its defaults filled in.
func (l *Limiter) Policy() Policy { return l.policy }

// Acquire takes n permits at now if all of them fit, and reports the
// decision. A denial records nothing. n must be from 1 to MaxLimit, otherwise
// the error wraps ErrInvalidPermits and nothing changes.
//
// now is in nanoseconds on the timeline of a Clock (Clock.Now), or Nanos of
// a time.Time; it is clamped to [0, MaxNanos]. Calls on one Limiter must all
// use the same timeline.
func (l *Limiter) Acquire(now int64, n int64) (Decision, error) {
	if err := CheckPermits(n); err != nil {
		return Decision{}, err
	}
	t := clampNow(now)
	var d Decision
	l.mu.Lock()
	if b := &l.b; b.gcra {
		b.tat, d = b.rate.Acquire(b.tat, t, n)
	} else {
		d = b.log.Acquire(b.window, t, n)
	}
	l.mu.Unlock()
	return d, nil
}

// Available reports how many permits could be acquired at now (as in
// Acquire), without acquiring any.
func (l *Limiter) Available(now int64) Availability {
	t := clampNow(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := &l.b; b.gcra {
		return b.rate.Available(b.tat, t)
	}
	return l.b.log.Available(l.b.window, t)
}

// MaxNanos is the latest instant the algorithms distinguish, in the year
// 2261: one MaxPeriod before the last nanosecond an int64 holds, so that a
// TAT or a log entry's expiry always fits.
const MaxNanos = math.MaxInt64 - int64(MaxPeriod)

// Nanos converts t to nanoseconds since the Unix epoch, clamped to
// [0, MaxNanos]: instants before 1970 count as the epoch and instants after
// MaxNanos as MaxNanos. Time standing still at the edges can only make a
// limiter stricter, never grant more. It reads t's wall clock only: the
// in-process backends decide on a Clock instead, which steps of the wall
// clock do not move.
func Nanos(t time.Time) int64 {
	// Comparing seconds first is cheaper than time.Time comparisons, and
	// UnixNano is only defined within int64's range.
	s := t.Unix()
	switch {
	case s < 0:
		return 0
	case s > MaxNanos/1e9:
		return MaxNanos
	}
	return min(s*1e9+int64(t.Nanosecond()), MaxNanos)
}

// clampNow applies Nanos's clamp to a time already in nanoseconds.
func clampNow(now int64) int64 { return min(max(now, 0), MaxNanos) }
