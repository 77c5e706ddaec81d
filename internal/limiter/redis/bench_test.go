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

// BenchmarkAcquireBatch measures AcquireBatch against one standalone server:
// batches of 100 acquisitions from one limiter, each batch one pipelined
// round trip. one-key runs 32 goroutines per GOMAXPROCS as BenchmarkAcquire
// does; serial has one batch in flight at a time, so its time per batch is
// one round trip plus the server's work. Both report decisions per second,
// to set beside 1/(ns/op) of BenchmarkAcquire.
func BenchmarkAcquireBatch(b *testing.B) {
	c := newClient(b, redistest.Standalone(b))
	s := newStore(b, c)
	ctx := context.Background()
	const size = 100
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		one := "one-" + string(alg)
		put(b, s, one, limiter.Policy{Limit: limiter.MaxLimit, Period: time.Second, Algorithm: alg})
		reqs := make([]limiter.Request, size)
		for i := range reqs {
			reqs[i] = limiter.Request{Name: one, Permits: 1}
		}
		acquire := func(b *testing.B, out []limiter.Result) bool {
			s.AcquireBatch(ctx, reqs, out)
			for _, r := range out {
				if r.Err != nil {
					b.Error(r.Err)
					return false
				}
			}
			return true
		}
		b.Run(string(alg)+"/one-key", func(b *testing.B) {
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				out := make([]limiter.Result, size)
				for pb.Next() {
					if !acquire(b, out) {
						return
					}
				}
			})
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "decisions/s")
		})
		b.Run(string(alg)+"/one-key/serial", func(b *testing.B) {
			out := make([]limiter.Result, size)
			for b.Loop() {
				if !acquire(b, out) {
					return
				}
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

// BenchmarkDecide sets a joint decision of three limiters of one group
// beside a single acquisition and a joint decision of one, in the same run:
// each is one script run and one round trip, so a three-limit decision
// should cost little more than a single one. The limiters are spread over
// 1,000 groups so that no key is hot (a hot key's single acquisitions
// coalesce, which joint decisions do not). serial has one call in flight,
// so its time is one round trip plus the server's work; parallel has 32
// per GOMAXPROCS, as a busy service does. The keyed cases set a key's
// acquisition (key_acquire.lua) beside a decision of that one key
// (decide.lua), over 1,000 keys of one keyed limiter.
func BenchmarkDecide(b *testing.B) {
	c := newClient(b, redistest.Standalone(b))
	s := newStore(b, c)
	ctx := context.Background()
	const groups = 1000
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		p := limiter.Policy{Limit: 1_000_000, Period: time.Second, Algorithm: alg}
		three := make([][]limiter.Item, groups)
		for g := range groups {
			for j := range 3 {
				name := fmt.Sprintf("d-%s-%d-%d", alg, g, j)
				putIn(b, s, name, fmt.Sprintf("dg-%s-%d", alg, g), p)
				three[g] = append(three[g], limiter.Item{Name: name, Permits: 1})
			}
		}
		calls := []struct {
			name string
			call func(g int) error
		}{
			{"acquire", func(g int) error { _, err := s.Acquire(ctx, three[g][0].Name, 1); return err }},
			{"decide-1", func(g int) error { _, err := s.Decide(ctx, three[g][:1], limiter.Take, ""); return err }},
			{"decide-3", func(g int) error { _, err := s.Decide(ctx, three[g], limiter.Take, ""); return err }},
		}
		keyed := fmt.Sprintf("k-%s", alg)
		if _, err := s.Put(ctx, limiter.Definition{Name: keyed, Policy: p, Keyed: true, MaxKeys: groups}); err != nil {
			b.Fatal(err)
		}
		key := func(g int) string { return fmt.Sprintf("10.0.%d.%d", g/256, g%256) }
		calls = append(calls, []struct {
			name string
			call func(g int) error
		}{
			{"acquire-key", func(g int) error { _, err := s.AcquireKey(ctx, keyed, key(g), 1); return err }},
			{"decide-1-keyed", func(g int) error {
				_, err := s.Decide(ctx, []limiter.Item{{Name: keyed, Key: key(g), Permits: 1}}, limiter.Take, "")
				return err
			}},
		}...)
		for _, cl := range calls {
			b.Run(string(alg)+"/serial/"+cl.name, func(b *testing.B) {
				g := 0
				for b.Loop() {
					if err := cl.call(g % groups); err != nil {
						b.Fatal(err)
					}
					g++
				}
			})
			b.Run(string(alg)+"/parallel/"+cl.name, func(b *testing.B) {
				var next atomic.Int64
				b.SetParallelism(32)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := cl.call(int(next.Add(1) % groups)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
