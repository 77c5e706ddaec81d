package memory_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// BenchmarkDecide sets a joint decision of three limiters of one group
// beside a single acquisition and a joint decision of one, in the same run,
// on 1,000 groups of three limiters: serially, and from every core. The
// keyed cases do the same with two keyed limiters (per IP and per user,
// 1,000 keys each) and a plain one of one group: a keyed acquisition, a
// decision of that one key, and a decision of a key of each and the plain
// limiter.
func BenchmarkDecide(b *testing.B) {
	ctx := context.Background()
	s := memory.New(nil, 0)
	const groups = 1000
	p := limiter.Policy{Limit: limiter.MaxLimit, Period: time.Second}
	name := func(g, j int) string { return fmt.Sprintf("d-%d-%d", g, j) }
	for g := range groups {
		for j := range 3 {
			if _, err := s.Put(ctx, limiter.Definition{Name: name(g, j), Policy: p, Group: fmt.Sprintf("g%d", g)}); err != nil {
				b.Fatal(err)
			}
		}
	}
	one := make([][]limiter.Item, groups)
	three := make([][]limiter.Item, groups)
	for g := range groups {
		one[g] = []limiter.Item{{Name: name(g, 0), Permits: 1}}
		three[g] = []limiter.Item{{Name: name(g, 0), Permits: 1}, {Name: name(g, 1), Permits: 1}, {Name: name(g, 2), Permits: 1}}
	}
	for _, def := range []limiter.Definition{
		{Name: "k-ip", Policy: p, Group: "k", Keyed: true, MaxKeys: groups},
		{Name: "k-user", Policy: p, Group: "k", Keyed: true, MaxKeys: groups},
		{Name: "k-global", Policy: p, Group: "k"},
	} {
		if _, err := s.Put(ctx, def); err != nil {
			b.Fatal(err)
		}
	}
	keyed := make([][]limiter.Item, groups)
	for g := range groups {
		keyed[g] = []limiter.Item{{Name: "k-ip", Key: fmt.Sprintf("10.0.%d.%d", g/256, g%256), Permits: 1}, {Name: "k-user", Key: fmt.Sprintf("user-%d", g), Permits: 1}, {Name: "k-global", Permits: 1}}
	}
	calls := []struct {
		name string
		call func(g int) error
	}{
		{"acquire", func(g int) error { _, err := s.Acquire(ctx, one[g][0].Name, 1); return err }},
		{"decide-1", func(g int) error { _, err := s.Decide(ctx, one[g], limiter.Take, ""); return err }},
		{"decide-3", func(g int) error { _, err := s.Decide(ctx, three[g], limiter.Take, ""); return err }},
		{"acquire-key", func(g int) error { _, err := s.AcquireKey(ctx, "k-user", keyed[g][1].Key, 1); return err }},
		{"decide-1-keyed", func(g int) error { _, err := s.Decide(ctx, keyed[g][1:2], limiter.Take, ""); return err }},
		{"decide-3-keyed", func(g int) error { _, err := s.Decide(ctx, keyed[g], limiter.Take, ""); return err }},
	}
	for _, cl := range calls {
		b.Run("serial/"+cl.name, func(b *testing.B) {
			g := 0
			for b.Loop() {
				if err := cl.call(g % groups); err != nil {
					b.Fatal(err)
				}
				g++
			}
		})
		b.Run("parallel/"+cl.name, func(b *testing.B) {
			var next atomic.Int64
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

// BenchmarkDecideChurn measures keyed decisions when nearly every key is
// new: three keyed limiters of one group, 1,000 keys each, asked about
// 100,000 keys in turn, so that each decision evicts a key from each
// table (the most permits left first) to make room; 25 goroutines per
// core, as a proxy's or Envoy's many connections would ask. A single
// key's acquisition beside a decision on one key of each limiter, for
// each algorithm (the sliding log at a limit of 1,000 a second, so that
// its logs hold entries):
//
//	go test -run '^$' -bench DecideChurn ./internal/limiter/memory
func BenchmarkDecideChurn(b *testing.B) {
	ctx := context.Background()
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		s := memory.New(nil, 0)
		p := limiter.Policy{Limit: limiter.MaxLimit, Period: time.Second, Algorithm: alg}
		if alg == limiter.SlidingLog {
			p = limiter.Policy{Limit: 1000, Period: time.Second, Algorithm: alg}
		}
		for _, n := range []string{"a", "b", "c"} {
			if _, err := s.Put(ctx, limiter.Definition{Name: n, Policy: p, Group: "g", Keyed: true, MaxKeys: 1000}); err != nil {
				b.Fatal(err)
			}
		}
		keys := make([]string, 100_000)
		for i := range keys {
			keys[i] = fmt.Sprint(i)
		}
		calls := []struct {
			name string
			call func(key string) error
		}{
			{"acquire-key", func(k string) error { _, err := s.AcquireKey(ctx, "a", k, 1); return err }},
			{"decide-3", func(k string) error {
				items := []limiter.Item{{Name: "a", Key: k, Permits: 1}, {Name: "b", Key: k, Permits: 1}, {Name: "c", Key: k, Permits: 1}}
				_, err := s.Decide(ctx, items, limiter.Take, "")
				return err
			}},
		}
		for _, cl := range calls {
			b.Run(fmt.Sprintf("%v/%s", alg, cl.name), func(b *testing.B) {
				var next atomic.Int64
				b.SetParallelism(25)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := cl.call(keys[next.Add(1)%int64(len(keys))]); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
