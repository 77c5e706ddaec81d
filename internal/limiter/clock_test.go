package limiter_test

import (
	"math"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
)

// A Clock reads the wall clock once, at its start: stepping the wall clock
// afterwards moves no reading; only monotonic time does.
func TestClockIgnoresWallSteps(t *testing.T) {
	c := clocktest.New(t0)
	c.Advance(time.Minute) // the monotonic clock need not read 0 at the start
	clock := c.Limiter()
	start := limiter.Nanos(t0.Add(time.Minute))
	steps := []struct {
		name    string
		wall    time.Duration // stepped on the wall clock alone
		advance time.Duration // then passed on both clocks
		want    int64
	}{
		{"at the start", 0, 0, start},
		{"a second later", 0, time.Second, start + 1e9},
		{"wall stepped an hour forward", time.Hour, 0, start + 1e9},
		{"then a second later", 0, time.Second, start + 2e9},
		{"wall stepped two hours back", -2 * time.Hour, 0, start + 2e9},
		{"then a nanosecond later", 0, 1, start + 2e9 + 1},
	}
	for _, s := range steps {
		c.StepWall(s.wall)
		c.Advance(s.advance)
		if got := clock.Now(); got != s.want {
			t.Errorf("%s: got %d, want %d", s.name, got, s.want)
		}
	}
}

// Readings stay within [0, MaxNanos], as Nanos's do, whatever the start and
// the elapsed time.
func TestClockClamps(t *testing.T) {
	tests := []struct {
		name    string
		wall    time.Time
		elapsed time.Duration
		want    int64
	}{
		{"started before the epoch counts from it", time.Unix(-10, 0), time.Second, 1e9},
		{"elapsed past MaxNanos", time.Unix(0, limiter.MaxNanos-5), 10, limiter.MaxNanos},
		{"elapsed would overflow int64", time.Unix(0, limiter.MaxNanos), math.MaxInt64, limiter.MaxNanos},
		{"just below MaxNanos", time.Unix(0, limiter.MaxNanos-5), 4, limiter.MaxNanos - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := limiter.NewClockAt(tt.wall, func() time.Duration { return tt.elapsed })
			if got := clock.Now(); got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
}

// The system Clock starts at the wall clock's Unix time and never goes
// back.
func TestNewClock(t *testing.T) {
	before := limiter.Nanos(time.Now())
	clock := limiter.NewClock()
	first := clock.Now()
	if first < before {
		t.Fatalf("first reading %d, want at least the wall time before the start, %d", first, before)
	}
	prev := first
	for range 1000 {
		now := clock.Now()
		if now < prev {
			t.Fatalf("reading %d after %d: went back", now, prev)
		}
		prev = now
	}
}
