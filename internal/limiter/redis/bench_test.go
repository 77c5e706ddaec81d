package redis

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// BenchmarkAcquire measures Acquire against one standalone server from
// parallel goroutines: on one key, where every call runs on the same state,
// and spread over many keys. Concurrent calls share the client's
// connection through auto-pipelining, so the benchmark runs 32 goroutines
// per GOMAXPROCS, as a busy service has many requests in flight.
func BenchmarkAcquire(b *testing.B) {
	c := newClient(b, redistest.Standalone(b))
	s := newStore(b, c)
	ctx := context.Background()
	const keys = 10_000
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		one := "one-" + string(alg)
		put(b, s, one, limiter.Policy{Limit: limiter.MaxLimit, Period: time.Second, Algorithm: alg})
		for i := range keys {
			put(b, s, fmt.Sprintf("many-%s-%d", alg, i), limiter.Policy{Limit: 1000, Period: time.Second, Algorithm: alg})
		}
		b.Run(string(alg)+"/one-key", func(b *testing.B) {
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.Acquire(ctx, one, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run(string(alg)+"/many-keys", func(b *testing.B) {
			var next atomic.Int64
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					name := fmt.Sprintf("many-%s-%d", alg, next.Add(1)%keys)
					if _, err := s.Acquire(ctx, name, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
