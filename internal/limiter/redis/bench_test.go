package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

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
				cpu := redisCPU(b, c)
				g := 0
				for b.Loop() {
					if err := cl.call(g % groups); err != nil {
						b.Fatal(err)
					}
					g++
				}
				reportRedisCPU(b, c, cpu, b.N, "redis-µs/op")
			})
			b.Run(string(alg)+"/parallel/"+cl.name, func(b *testing.B) {
				var next atomic.Int64
				cpu := redisCPU(b, c)
				b.SetParallelism(32)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := cl.call(int(next.Add(1) % groups)); err != nil {
							b.Error(err)
							return
						}
					}
				})
				reportRedisCPU(b, c, cpu, b.N, "redis-µs/op")
			})
		}
	}
}

// redisCPU is the CPU time the server has used so far, user and system,
// from INFO: where Redis's share of a decision's cost shows, which the
// time per operation of a parallel benchmark mixes with this process's.
func redisCPU(b *testing.B, c rueidis.Client) time.Duration {
	b.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		b.Fatalf("INFO cpu: %v", err)
	}
	var cpu time.Duration
	for _, line := range strings.Split(info, "\r\n") {
		name, value, _ := strings.Cut(line, ":")
		if name != "used_cpu_user" && name != "used_cpu_sys" {
			continue
		}
		sec, err := strconv.ParseFloat(value, 64)
		if err != nil {
			b.Fatalf("INFO cpu: %s: %v", line, err)
		}
		cpu += time.Duration(sec * float64(time.Second))
	}
	return cpu
}

// reportRedisCPU reports the server's CPU since it used before, per op of
// the n that ran, as the metric unit.
func reportRedisCPU(b *testing.B, c rueidis.Client, before time.Duration, n int, unit string) {
	b.Helper()
	used := redisCPU(b, c) - before
	b.ReportMetric(float64(used.Nanoseconds())/1e3/float64(n), unit)
}

// BenchmarkDecideBatch measures what Redis spends on a decision of one
// item in a batch, the run of decide.lua the Store sends when decisions of
// one slot queue behind one in flight: each run decides batch takes of one
// permit, built as the Store builds them, with no coalescing in the way,
// so that every run is the same size. The limiters never run out: a limit
// of 10^9 per second, as the harness's gRPC comparison sets, whose GCRA
// costs exceed 2^53 before they are divided, and, for a plain limiter by
// GCRA, 3·10^6 per second, whose costs do not. The keyed limiters are
// asked about one key or about 100,000 in turn. Redis's CPU per decision
// (redis-µs/decision) is the figure: the time per run mixes it with this
// process's and the round trip.
func BenchmarkDecideBatch(b *testing.B) {
	c := newClient(b, redistest.Standalone(b))
	s := newStore(b, c)
	ctx := context.Background()
	const batch = maxGroup - 1
	ip := func(k int) string { return fmt.Sprintf("10.%d.%d.%d", k>>16, k>>8&255, k&255) }
	for _, bc := range []struct {
		alg   limiter.Algorithm
		limit int64
		keyed bool
		keys  int // keys asked about in turn
	}{
		{limiter.GCRA, 3_000_000, false, 0},
		{limiter.GCRA, 1_000_000_000, false, 0},
		{limiter.GCRA, 1_000_000_000, true, 1},
		{limiter.GCRA, 1_000_000_000, true, 100_000},
		{limiter.SlidingLog, 1_000_000_000, false, 0},
		{limiter.SlidingLog, 1_000_000_000, true, 1},
		{limiter.SlidingLog, 1_000_000_000, true, 100_000},
	} {
		shape := "plain"
		if bc.keyed {
			shape = fmt.Sprintf("keyed-%d-keys", bc.keys)
		}
		name := fmt.Sprintf("%s-limit-%d-%s", bc.alg, bc.limit, shape)
		def := limiter.Definition{Name: name, Policy: limiter.Policy{Limit: bc.limit, Period: time.Second, Algorithm: bc.alg}, Keyed: bc.keyed}
		if bc.keyed {
			def.MaxKeys = 200_000
		}
		if _, err := s.Put(ctx, def); err != nil {
			b.Fatal(err)
		}
		item := func(i int) limiter.Item {
			it := limiter.Item{Name: name, Permits: 1}
			if bc.keyed {
				it.Key = ip(i % bc.keys)
			}
			return it
		}
		b.Run(fmt.Sprintf("%s/limit-%d/%s", bc.alg, bc.limit, shape), func(b *testing.B) {
			// A first decision has the Store learn the limiter's group.
			if _, err := s.Decide(ctx, []limiter.Item{item(0)}, limiter.Peek, ""); err != nil {
				b.Fatal(err)
			}
			calls := make([]scriptCall, batch)
			out := make([]scriptReply, batch)
			i := 0
			cpu := redisCPU(b, c)
			for b.Loop() {
				b.StopTimer()
				for j := range calls {
					items := []limiter.Item{item(i)}
					i++
					group := s.groupOf(name)
					_, calls[j] = s.scriptCall(items, group, limiter.Scope(items, []string{group}), call{mode: "take"}, "")
				}
				b.StartTimer()
				s.runDecisions(ctx, "", calls, out)
				for j, r := range out {
					if r.err != nil || len(r.v) < 2 || r.v[0] != 1 || r.v[1] != 1 {
						b.Fatalf("decision %d of a run: %v %v", j, r.v, r.err)
					}
				}
			}
			reportRedisCPU(b, c, cpu, b.N*batch, "redis-µs/decision")
		})
	}
}
