package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// benchIP is a distinct IPv4 address for each i < 2^24.
func benchIP(i int) string { return fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255) }

// BenchmarkAcquire measures Acquire against one standalone server from
// parallel goroutines: on one tenant, where every call runs on the same
// state and index member, and spread over many tenants. Concurrent calls
// share the client's connection through auto-pipelining, so the benchmark
// runs 32 goroutines per GOMAXPROCS, as a busy service has many requests in
// flight.
func BenchmarkAcquire(b *testing.B) {
	c := newClient(b, redistest.Standalone(b))
	ctx := context.Background()
	const tenants = 10_000
	for _, alg := range algorithms {
		ts := newTenants(b, c, policy(limiter.MaxLimit, time.Hour, alg))
		b.Run(string(alg)+"/one-tenant", func(b *testing.B) {
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := ts.Acquire(ctx, "192.0.2.1", 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run(string(alg)+"/many-tenants", func(b *testing.B) {
			var next atomic.Int64
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := ts.Acquire(ctx, benchIP(int(next.Add(1)%tenants)), 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkLowest measures Lowest(10) over 10k and 100k tenants that each
// took a different number of permits. Under the sliding log, "decayed"
// tenants took a large grant then a small one, and the query runs once the
// large grants have left the window: every bound is loose, so the first
// query reads every log (reported as first-query-ms) and lowers the bounds,
// and the queries measured after it read about k logs per shard.
func BenchmarkLowest(b *testing.B) {
	c := newClient(b, redistest.Standalone(b))
	ctx := context.Background()
	for _, n := range []int{10_000, 100_000} {
		for _, alg := range algorithms {
			ts := newTenants(b, c, policy(1000, time.Hour, alg))
			fill(b, c, n, func(i int) error {
				_, err := ts.Acquire(ctx, benchIP(i), 1+int64(i*7919%999))
				return err
			})
			b.Run(fmt.Sprintf("%s/%dk", alg, n/1000), func(b *testing.B) {
				for b.Loop() {
					if es, err := ts.Lowest(ctx, 10); err != nil || len(es) != 10 {
						b.Fatalf("Lowest(10): %d tenants, %v", len(es), err)
					}
				}
			})
		}

		ts := newTenants(b, c, policy(1000, time.Second, limiter.SlidingLog))
		t0 := int64(epochUS)
		fill(b, c, n, func(i int) error {
			if _, err := ts.acquire(ctx, benchIP(i), 900, us(t0+int64(i%100_000))); err != nil {
				return err
			}
			_, err := ts.acquire(ctx, benchIP(i), 1+int64(i*7919%99), us(t0+500_000+int64(i%100_000)))
			return err
		})
		at := us(t0 + 1_200_000) // the large grants have left, the small ones not
		b.Run(fmt.Sprintf("sliding_log-decayed/%dk", n/1000), func(b *testing.B) {
			// The slow log records every script run of the first query.
			if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("slowlog-log-slower-than", "0").ParameterValue("slowlog-max-len", "10000").Build()).Error(); err != nil {
				b.Fatal(err)
			}
			c.Do(ctx, c.B().SlowlogReset().Build())
			start := time.Now()
			if _, err := ts.lowest(ctx, 10, at); err != nil {
				b.Fatal(err)
			}
			first := time.Since(start)
			longest := longestScript(b, c)
			c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("slowlog-log-slower-than", "10000").Build())
			for b.Loop() {
				if es, err := ts.lowest(ctx, 10, at); err != nil || len(es) != 10 {
					b.Fatalf("Lowest(10): %d tenants, %v", len(es), err)
				}
			}
			b.ReportMetric(float64(first.Microseconds())/1000, "first-query-ms")
			b.ReportMetric(float64(longest.Microseconds())/1000, "longest-run-ms")
		})
		if err := c.Do(ctx, c.B().Flushall().Build()).Error(); err != nil {
			b.Fatal(err)
		}
	}
}

// longestScript is the longest script run in the server's slow log.
func longestScript(b *testing.B, c rueidis.Client) time.Duration {
	b.Helper()
	entries, err := c.Do(context.Background(), c.B().SlowlogGet().Count(10000).Build()).ToArray()
	if err != nil {
		b.Fatal(err)
	}
	var longest time.Duration
	for _, e := range entries {
		fields, err := e.ToArray()
		if err != nil || len(fields) < 4 {
			continue
		}
		args, _ := fields[3].AsStrSlice()
		us, _ := fields[2].AsInt64()
		if len(args) > 0 && strings.HasPrefix(strings.ToUpper(args[0]), "EVAL") {
			longest = max(longest, time.Duration(us)*time.Microsecond)
		}
	}
	return longest
}

// fill calls add for 0..n-1 from 64 goroutines, pipelined on the client.
func fill(b *testing.B, _ rueidis.Client, n int, add func(i int) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 64 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := add(i); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
}
