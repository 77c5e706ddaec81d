package limiter_test

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// BenchmarkSingleKey compares one limiter's acquire with x/time/rate's
// AllowN on the same policy (1e9 permits per second, so neither runs dry
// and both do the full grant path), with a fixed time and with time.Now.
//
//	go test -run '^$' -bench SingleKey -count 10 ./internal/limiter/ | benchstat -col /impl -
func BenchmarkSingleKey(b *testing.B) {
	const limit = limiter.MaxLimit
	clocks := []struct {
		name string
		now  func() time.Time
	}{
		{"fixed", func() time.Time { return t0 }},
		{"time.Now", time.Now},
	}
	for _, clock := range clocks {
		b.Run("clock="+clock.name+"/impl=ratelimiter", func(b *testing.B) {
			l, _ := limiter.New(limiter.Policy{Limit: limit, Period: time.Second})
			for b.Loop() {
				if _, err := l.Acquire(clock.now(), 1); err != nil {
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
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Acquire(time.Now(), 1)
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

// BenchmarkSlidingLog measures the strict algorithm at a steady state where
// the log holds about a thousand entries.
func BenchmarkSlidingLog(b *testing.B) {
	l, _ := limiter.New(limiter.Policy{Limit: 1000, Period: time.Second, Algorithm: limiter.SlidingLog})
	now := t0
	for b.Loop() {
		l.Acquire(now, 1)
		now = now.Add(time.Millisecond)
	}
}
