package limiter_test

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// BenchmarkSingleKey compares one limiter's acquire with x/time/rate's
// AllowN on the same policy (1e9 permits per second, so neither runs dry
// and both do the full grant path), with a fixed time and with the system's
// clock: the limiter reads it as the stores do (limiter.Clock, one
// monotonic read), x/time/rate with time.Now (a wall and a monotonic read).
//
//	go test -run '^$' -bench SingleKey -count 10 ./internal/limiter/ | benchstat -col /impl -
func BenchmarkSingleKey(b *testing.B) {
	const limit = limiter.MaxLimit
	fixed := limiter.Nanos(t0)
	clocks := []struct {
		name  string
		nanos func() int64     // ratelimiter's
		now   func() time.Time // x/time/rate's
	}{
		{"fixed", func() int64 { return fixed }, func() time.Time { return t0 }},
		{"system", limiter.NewClock().Now, time.Now},
	}
	for _, clock := range clocks {
		b.Run("clock="+clock.name+"/impl=ratelimiter", func(b *testing.B) {
			l, _ := limiter.New(limiter.Policy{Limit: limit, Period: time.Second})
			for b.Loop() {
				if _, err := l.Acquire(clock.nanos(), 1); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("clock="+clock.name+"/impl=x-time-rate", func(b *testing.B) {
			l := rate.NewLimiter(limit, limit)
			for b.Loop() {
				l.AllowN(clock.now(), 1)
			}
		})
	}
}

// BenchmarkSingleKeyParallel is the same contended from every core.
func BenchmarkSingleKeyParallel(b *testing.B) {
	const limit = limiter.MaxLimit
	b.Run("impl=ratelimiter", func(b *testing.B) {
		l, _ := limiter.New(limiter.Policy{Limit: limit, Period: time.Second})
		clock := limiter.NewClock()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Acquire(clock.Now(), 1)
			}
		})
	})
	b.Run("impl=x-time-rate", func(b *testing.B) {
		l := rate.NewLimiter(limit, limit)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.AllowN(time.Now(), 1)
			}
		})
	})
}

// BenchmarkClock compares a decision's clock read with time.Now, which the
// stores read before limiter.Clock.
func BenchmarkClock(b *testing.B) {
	b.Run("impl=time.Now", func(b *testing.B) {
		for b.Loop() {
			limiter.Nanos(time.Now())
		}
	})
	b.Run("impl=Clock.Now", func(b *testing.B) {
		c := limiter.NewClock()
		for b.Loop() {
			c.Now()
		}
	})
}

// BenchmarkSlidingLog measures the strict algorithm at a steady state where
// the log holds about a thousand entries.
func BenchmarkSlidingLog(b *testing.B) {
	l, _ := limiter.New(limiter.Policy{Limit: 1000, Period: time.Second, Algorithm: limiter.SlidingLog})
	now := limiter.Nanos(t0)
	for b.Loop() {
		l.Acquire(now, 1)
		now += int64(time.Millisecond)
	}
}
