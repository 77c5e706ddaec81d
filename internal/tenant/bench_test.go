package tenant

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
)

// The benchmarks compare the registry with the usual per-key baseline, a
// map[uint64]*rate.Limiter under one sync.Mutex, on the same keys, the same
// sequence and the same clock: a fixed instant advanced by 1µs per
// acquisition. The policy, 1000 permits per hour, keeps every tenant
// partly used (so remembered and indexed) and never denies.

const benchTenants = 1_000_000

var (
	benchPolicy = limiter.Policy{Limit: 1000, Period: time.Hour}
	benchStart  = time.Unix(1_700_000_000, 0)
)

// benchKeys returns n distinct IPv4 keys, scattered over the address space.
func benchKeys(n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = v4Tag | uint64(uint32(i)*2654435761) // odd: a bijection
	}
	return keys
}

// benchSequence is the keys to acquire, uniform over benchKeys and
// reproducible, read in order so that fetching the next key costs nothing.
var benchSequence = sync.OnceValue(func() []uint64 {
	keys := benchKeys(benchTenants)
	rng := rand.New(rand.NewPCG(1, 2))
	seq := make([]uint64, 1<<22)
	for i := range seq {
		seq[i] = keys[rng.IntN(len(keys))]
	}
	return seq
})

// acquirer is one implementation under benchmark. acquire must be safe for
// concurrent use.
type acquirer interface {
	acquire(key uint64, now time.Time) bool
}

type registryAcquirer struct{ r *Registry }

func (a registryAcquirer) acquire(key uint64, now time.Time) bool {
	kb := keyOf(key)
	d, _ := a.r.keys.Acquire(string(kb[:]), limiter.Nanos(now), 1)
	return d.Allowed
}

// mapMutexRate is the baseline.
type mapMutexRate struct {
	mu       sync.Mutex
	limiters map[uint64]*rate.Limiter
}

func newMapMutexRate() *mapMutexRate {
	return &mapMutexRate{limiters: make(map[uint64]*rate.Limiter)}
}

func (m *mapMutexRate) acquire(key uint64, now time.Time) bool {
	m.mu.Lock()
	l, ok := m.limiters[key]
	if !ok {
		l = rate.NewLimiter(rate.Every(benchPolicy.Period/time.Duration(benchPolicy.Limit)), int(benchPolicy.Limit))
		m.limiters[key] = l
	}
	m.mu.Unlock()
	return l.AllowN(now, 1)
}

func newBenchImpl(b *testing.B, impl string) acquirer {
	b.Helper()
	switch impl {
	case "tenant", "tenant-sliding-log":
		p := benchPolicy
		if impl == "tenant-sliding-log" {
			p.Algorithm = limiter.SlidingLog
		}
		r, err := New(Config{Policy: p}, clocktest.New(benchStart).Limiter())
		if err != nil {
			b.Fatal(err)
		}
		return registryAcquirer{r}
	case "map-mutex-rate":
		return newMapMutexRate()
	}
	b.Fatalf("unknown implementation %q", impl)
	return nil
}

// populate has every key acquire once, 1ns apart, and returns the next
// instant to use.
func populate(b *testing.B, a acquirer, keys []uint64) time.Time {
	b.Helper()
	for i, k := range keys {
		if !a.acquire(k, benchStart.Add(time.Duration(i))) {
			b.Fatalf("populating key %d: denied", i)
		}
	}
	return benchStart.Add(time.Second)
}

var benchImpls = []string{"tenant", "map-mutex-rate"}

func BenchmarkAcquire1M(b *testing.B) {
	keys := benchKeys(benchTenants)
	seq := benchSequence()
	for _, impl := range benchImpls {
		a := newBenchImpl(b, impl)
		now := populate(b, a, keys)
		// The clock only moves forward, across sub-benchmarks and b.N
		// rounds alike: each acquisition takes the next microsecond.
		var tick atomic.Int64
		b.Run("impl="+impl+"/mode=serial", func(b *testing.B) {
			start := tick.Add(int64(b.N)) - int64(b.N)
			b.ResetTimer()
			for i := range b.N {
				j := start + int64(i)
				if !a.acquire(seq[j&(1<<22-1)], now.Add(time.Duration(j)*time.Microsecond)) {
					b.Fatal("denied")
				}
			}
		})
		b.Run("impl="+impl+"/mode=parallel", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					j := tick.Add(1)
					if !a.acquire(seq[j&(1<<22-1)], now.Add(time.Duration(j)*time.Microsecond)) {
						b.Error("denied")
						return
					}
				}
			})
		})
		runtime.KeepAlive(a)
	}
}

// BenchmarkAcquireAPI is the whole public call, with address parsing,
// tenant formatting and a (non-recording) span, for reference.
func BenchmarkAcquireAPI(b *testing.B) {
	r, err := New(Config{Policy: benchPolicy}, clocktest.New(benchStart).Limiter())
	if err != nil {
		b.Fatal(err)
	}
	ips := make([]string, 1024)
	for i := range ips {
		ips[i] = ipv4(i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := r.Acquire(ctx, ips[i&1023], 1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemoryPerTenant(b *testing.B) {
	keys := benchKeys(benchTenants)
	for _, impl := range append(benchImpls, "tenant-sliding-log") {
		b.Run("impl="+impl, func(b *testing.B) {
			var perTenant float64
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				a := newBenchImpl(b, impl)
				populate(b, a, keys)
				runtime.GC()
				runtime.ReadMemStats(&after)
				perTenant = float64(after.HeapAlloc-before.HeapAlloc) / benchTenants
				runtime.KeepAlive(a)
			}
			b.ReportMetric(perTenant, "B/tenant")
		})
	}
}
