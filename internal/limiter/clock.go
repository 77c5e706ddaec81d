package limiter

import "time"

// Clock tells the in-process limiters (the memory store and the tenant
// registry) the instant they decide at, in nanoseconds on the timeline the
// algorithms use: the Unix time of the wall clock when the Clock started,
// plus the time elapsed since then on the monotonic clock. It is safe for
// concurrent use; the zero value is not usable (see NewClock).
//
// Only the start reads the wall clock. A step of the wall clock afterwards
// (an NTP correction, an operator's date command, a virtual machine
// resumed) therefore moves no decision: permits come back exactly as
// monotonic time passes, as x/time/rate does by subtracting times with
// Sub. Were every decision to read the wall clock, a step forward would
// refill every bucket at once and a step back would freeze them all for
// as long as the step. The readings drift from the wall clock by whatever
// it is stepped or slewed after the start; nothing the in-process backends
// answer is a wall time (decisions carry durations only), so no one sees
// the drift.
type Clock struct {
	base    int64                // decision time at the start
	start   time.Time            // the start, with its monotonic reading
	elapsed func() time.Duration // nil: time.Since(start)
}

// NewClock returns a Clock on the system's clocks, started now.
func NewClock() *Clock {
	start := time.Now()
	return &Clock{base: Nanos(start), start: start}
}

// NewClockAt returns a Clock whose readings are Nanos(wall) plus
// elapsed(), which must never go back: started at the wall time wall,
// elapsed is the time elapsed since on a monotonic clock. It lets a test
// move the wall and monotonic clocks independently, as the system's clocks
// move when the wall clock is stepped (see package clocktest), or read a
// counter of its own (wall at the epoch, elapsed the counter).
func NewClockAt(wall time.Time, elapsed func() time.Duration) *Clock {
	return &Clock{base: Nanos(wall), elapsed: elapsed}
}

// Now returns the current decision time in nanoseconds, clamped to
// [0, MaxNanos] as Nanos clamps.
func (c *Clock) Now() int64 {
	var d time.Duration
	if c.elapsed == nil {
		// time.Since reads only the monotonic clock when start carries a
		// monotonic reading, which time.Now's result always does: one
		// clock read, cheaper than time.Now's two.
		d = time.Since(c.start)
	} else {
		d = c.elapsed()
	}
	// base is within [0, MaxNanos]: saturate rather than overflow.
	if int64(d) > MaxNanos-c.base {
		return MaxNanos
	}
	return clampNow(c.base + int64(d))
}
