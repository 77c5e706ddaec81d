// Package limiter decides whether a caller may take N more permits now.
//
// A limit is Limit permits per Period, enforced by one of two algorithms:
//
//   - GCRA (the generic cell rate algorithm, equivalent to a token bucket of
//     size Burst that refills one permit every Period/Limit). Its state is one
//     timestamp. It admits at most Burst + ⌊(w·Limit)/Period⌋ permits in any
//     closed interval of length w, so in a half-open window [t, t+Period) up
//     to Burst + Limit − 1: with Burst = Limit, 2·Limit − 1 when the bucket
//     starts full (Limit at once, then Limit − 1 more as it refills before
//     the window ends). Use it to smooth traffic.
//   - SlidingLog keeps one entry per granted acquisition and guarantees that no
//     more than Limit permits are granted in any window of length Period. Use it
//     when an upstream bans callers who exceed its limit.
//
// Every acquisition is all or nothing: either all N permits are granted and
// recorded, or none are and the state is unchanged.
//
// Time is data: every operation takes the current time as an argument, so
// the algorithms never read a clock and can be tested at any instant. The
// in-process backends read it from a Clock, which steps of the wall clock
// do not move.
// Arithmetic is exact integer arithmetic in nanoseconds (GCRA counts in units
// of 1/Limit of a nanosecond), so no rounding accumulates.
package limiter

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names how a limiter spreads its permits over time.
type Algorithm string

const (
	// GCRA is the default algorithm: a token bucket kept as one timestamp.
	GCRA Algorithm = "gcra"
	// SlidingLog never grants more than Limit permits in any window of
	// length Period.
	SlidingLog Algorithm = "sliding_log"
)

// DefaultMaxLimiters is the most named limiters a store holds unless
// configured otherwise: far more than a service declares for its
// upstreams, and a bound on what callers creating limiters in a loop can
// take. In the memory store a GCRA limiter costs about 300 bytes (see
// memory's TestScale), 30 MB at this bound; a sliding log 16 bytes more
// per entry in its window, up to MaxLogEntries (64 KiB), so 100,000 full
// logs would take 6.6 GB: lower the bound where that matters.
const DefaultMaxLimiters = 100_000

// Bounds of a Policy. They keep every product and sum of the arithmetic
// within 128 bits and every duration within time.Duration.
const (
	MaxLimit  = 1_000_000_000
	MinPeriod = time.Millisecond
	MaxPeriod = 366 * 24 * time.Hour
)

// Errors returned by this package and by every Store. Wrapped errors keep
// them matchable with errors.Is.
var (
	ErrNotFound        = errors.New("limiter not found")
	ErrInvalidPolicy   = errors.New("invalid policy")
	ErrInvalidPermits  = errors.New("invalid permits")
	ErrInvalidName     = errors.New("invalid limiter name")
	ErrUnavailable     = errors.New("limiter backend unavailable")
	ErrInvalidBatch    = errors.New("invalid batch")
	ErrInvalidPageSize = errors.New("invalid page size")
	// ErrTooManyLimiters reports a Put that would create a limiter in a
	// store that already holds its maximum; replacing one is always
	// allowed.
	ErrTooManyLimiters = errors.New("too many limiters")
	// ErrNotDurable reports a change that a store which keeps it on disk
	// could not write there. A change to the definitions was then not
	// made, and the definition in force before it still is; a refund (or
	// settlement) made with an idempotency key was made, and a retry with
	// the key is answered from its record.
	ErrNotDurable = errors.New("change not written to disk")
	// ErrNotIdle reports a limiter that Service.DeleteIdle left in place
	// because it holds counts.
	ErrNotIdle          = errors.New("limiter holds counts")
	errUnknownAlgorithm = errors.New("unknown algorithm")
)

// Policy is Limit permits per Period. The zero value is not valid.
type Policy struct {
	// Limit is the number of permits per Period, from 1 to MaxLimit.
	Limit int64
	// Period is the window the limit applies to, from MinPeriod to MaxPeriod.
	Period time.Duration
	// Algorithm is GCRA when empty.
	Algorithm Algorithm
	// Burst is how many permits GCRA grants at once from a full bucket,
	// from 1 to Limit; 0 means Limit. SlidingLog requires 0.
	Burst int64
}

// Normalize returns p with its defaults filled in: GCRA when Algorithm is
// empty, and Burst = Limit for GCRA when Burst is 0.
func (p Policy) Normalize() Policy {
	if p.Algorithm == "" {
		p.Algorithm = GCRA
	}
	if p.Algorithm == GCRA && p.Burst == 0 {
		p.Burst = p.Limit
	}
	return p
}

// Validate reports why p cannot be used, wrapping ErrInvalidPolicy, or nil.
func (p Policy) Validate() error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidPolicy, fmt.Sprintf(format, args...))
	}
	if p.Limit < 1 || p.Limit > MaxLimit {
		return invalid("limit must be between 1 and %d, got %d", int64(MaxLimit), p.Limit)
	}
	if p.Period < MinPeriod || p.Period > MaxPeriod {
		return invalid("period must be between %s and %s, got %s", MinPeriod, MaxPeriod, p.Period)
	}
	switch p.Algorithm {
	case "", GCRA:
		if p.Burst < 0 || p.Burst > p.Limit {
			return invalid("burst must be between 1 and the limit (%d), got %d", p.Limit, p.Burst)
		}
	case SlidingLog:
		if p.Burst != 0 {
			return invalid("burst applies to %s only", GCRA)
		}
	default:
		return invalid("%v %q (want %q or %q)", errUnknownAlgorithm, p.Algorithm, GCRA, SlidingLog)
	}
	return nil
}

// Decision is the answer to an acquisition.
//
// Its three flags come last, side by side, so that it takes six words
// rather than seven: a Decision is copied by value on every acquisition,
// and a shorter copy is measurably faster (see BenchmarkSingleKey).
type Decision struct {
	// Permits is the number of permits asked for.
	Permits int64
	// Remaining is the number of permits that could be acquired right after
	// this decision.
	Remaining int64
	// Limit is the policy's Limit.
	Limit int64
	// RetryAfter is how long until Permits could be granted, when denied
	// and ExceedsCapacity is false; 0 otherwise. It assumes no other caller
	// takes permits meanwhile.
	RetryAfter time.Duration
	// ResetAfter is how long until the limiter is full again if nobody
	// acquires meanwhile.
	ResetAfter time.Duration
	// Allowed reports whether all Permits were granted. When false and not
	// Degraded, nothing was recorded.
	Allowed bool
	// ExceedsCapacity reports a denial that no amount of waiting can turn
	// into a grant: Permits exceeds what the limiter can ever hold (Burst
	// for GCRA, Limit for SlidingLog).
	ExceedsCapacity bool
	// Degraded reports a decision made without the store, which could not
	// answer in time (ErrUnavailable): Allowed then follows the FailureMode,
	// and Remaining, Limit, RetryAfter and ResetAfter are zero because they
	// are unknown. Whether the store recorded the permits is unknown too: a
	// call that reached a shared store before its deadline passed may still
	// run there and take them, at most once, since it is never retried.
	// Under FailClosed that can only make later decisions stricter.
	Degraded bool
}

// Availability is how much of a limit can be taken right now.
type Availability struct {
	// Remaining is the number of permits an acquisition could take now.
	Remaining int64
	// Limit is the policy's Limit.
	Limit int64
	// ResetAfter is how long until the limiter is full again if nobody
	// acquires meanwhile.
	ResetAfter time.Duration
}

// CheckPermits reports whether n is a permit count any acquisition accepts:
// from 1 to MaxLimit. Counts above a limiter's own capacity are valid and
// answered with ExceedsCapacity.
func CheckPermits(n int64) error {
	if n < 1 || n > MaxLimit {
		return fmt.Errorf("%w: permits must be between 1 and %d, got %d", ErrInvalidPermits, int64(MaxLimit), n)
	}
	return nil
}
