// Package clocktest is a manual clock for tests of the in-process limiters:
// a wall clock and a monotonic clock that move only when told, together or
// apart.
package clocktest

import (
	"sync"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Clock is a manual pair of clocks: Advance moves both, as time passing
// does; StepWall moves the wall clock alone, as an NTP step does. It is safe
// for concurrent use.
type Clock struct {
	mu   sync.Mutex
	wall time.Time
	mono time.Duration
}

// New returns a Clock whose wall clock reads wall and whose monotonic clock
// reads 0.
func New(wall time.Time) *Clock { return &Clock{wall: wall} }

// Advance lets d pass on both clocks.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = c.wall.Add(d)
	c.mono += d
}

// StepWall moves the wall clock by d (either way) and leaves the monotonic
// clock where it is.
func (c *Clock) StepWall(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = c.wall.Add(d)
}

// Wall reads the wall clock.
func (c *Clock) Wall() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wall
}

// Mono reads the monotonic clock: the time advanced since New.
func (c *Clock) Mono() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

// Limiter returns a limiter.Clock started now on c: the Unix time of c's
// wall clock now, plus what c's monotonic clock advances from now on. Stores
// built on it see Advance and never StepWall, as stores built on
// limiter.NewClock do with the system's clocks.
func (c *Clock) Limiter() *limiter.Clock {
	wall, mono0 := c.Wall(), c.Mono()
	return limiter.NewClockAt(wall, func() time.Duration { return c.Mono() - mono0 })
}
