package memory

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The benchmarks of Keys use the per-IP tenants' policy benchmark (1000
// permits per hour, so that every key stays partly used, hence remembered
// and indexed) over keys of three shapes: the tenants' 8-byte keys, 16-byte
// API-key-like keys and 36-byte UUIDs.

var (
	keysBenchPolicy = limiter.Policy{Limit: 1000, Period: time.Hour}
	keysBenchStart  = limiter.Nanos(time.Unix(1_700_000_000, 0))
)

// benchKeyShapes names the key shapes; keysOfShape makes n distinct keys.
var benchKeyShapes = []string{"ipv4-8B", "apikey-16B", "uuid-36B"}

func keysOfShape(shape string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		x := uint32(i) * 2654435761 // odd: a bijection, scattered
		switch shape {
		case "ipv4-8B":
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], 0xff00_0000_0000_0000|uint64(x))
			keys[i] = string(b[:])
		case "apikey-16B":
			keys[i] = fmt.Sprintf("key_%012x", x)
		default:
			keys[i] = fmt.Sprintf("%08x-0000-4000-8000-%012x", x, i)
		}
	}
	return keys
}

// BenchmarkKeysMemory reports the heap each of 1,000,000 keys takes, with
// one acquisition each.
func BenchmarkKeysMemory(b *testing.B) {
	const n = 1_000_000
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		for _, shape := range benchKeyShapes {
			keys := keysOfShape(shape, n)
			b.Run(fmt.Sprintf("alg=%s/key=%s", alg, shape), func(b *testing.B) {
				p := keysBenchPolicy
				p.Algorithm = alg
				var perKey float64
				for range b.N {
					var before, after runtime.MemStats
					runtime.GC()
					runtime.ReadMemStats(&before)
					ks := NewKeys(p, n)
					for i, k := range keys {
						if d, _ := ks.Acquire(k, keysBenchStart+int64(i), 1); !d.Allowed {
							b.Fatalf("key %d denied", i)
						}
					}
					runtime.GC()
					runtime.ReadMemStats(&after)
					perKey = float64(after.HeapAlloc-before.HeapAlloc) / n
					runtime.KeepAlive(ks)
				}
				b.ReportMetric(perKey, "B/key")
			})
		}
	}
}

// BenchmarkKeysAcquire acquires one permit of a uniformly random one of
// 1,000,000 remembered keys per operation, the clock advanced 1µs each.
func BenchmarkKeysAcquire(b *testing.B) {
	const n = 1_000_000
	for _, shape := range benchKeyShapes {
		keys := keysOfShape(shape, n)
		ks := NewKeys(keysBenchPolicy, n)
		for i, k := range keys {
			ks.Acquire(k, keysBenchStart+int64(i), 1)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		seq := make([]int32, 1<<22)
		for i := range seq {
			seq[i] = int32(rng.IntN(n))
		}
		now := keysBenchStart + int64(time.Second)
		b.Run("key="+shape, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				now += int64(time.Microsecond)
				if d, _ := ks.Acquire(keys[seq[i&(1<<22-1)]], now, 1); !d.Allowed {
					b.Fatal("denied")
				}
			}
		})
	}
}

// BenchmarkKeysLowest10 compares Lowest, which walks the GCRA index, with a
// scan of every key kept in a bounded heap, at 10,000 to 1,000,000 keys.
func BenchmarkKeysLowest10(b *testing.B) {
	ctx := context.Background()
	for _, shape := range []string{"ipv4-8B", "uuid-36B"} {
		for _, n := range []int{10_000, 100_000, 1_000_000} {
			now := keysBenchStart + int64(time.Second)
			ks := populatedKeys(shape, n)
			b.Run(fmt.Sprintf("key=%s/keys=%d/impl=index", shape, n), func(b *testing.B) {
				for b.Loop() {
					if es, err := ks.Lowest(ctx, now, 10); err != nil || len(es) != 10 {
						b.Fatal(len(es), err)
					}
				}
			})
			b.Run(fmt.Sprintf("key=%s/keys=%d/impl=scan", shape, n), func(b *testing.B) {
				for b.Loop() {
					if es := scanLowest(ks, now, 10); len(es) != 10 {
						b.Fatal(len(es))
					}
				}
			})
		}
	}
}

// populatedKeys is a GCRA Keys of n keys that took 1 to 100 permits each,
// so that TATs spread and tie.
func populatedKeys(shape string, n int) *Keys {
	ks := NewKeys(keysBenchPolicy, n)
	rng := rand.New(rand.NewPCG(3, 4))
	for i, k := range keysOfShape(shape, n) {
		ks.Acquire(k, keysBenchStart+int64(i/7), 1+rng.Int64N(100))
	}
	return ks
}

// scanLowest answers Lowest without the index: it computes every key's
// remaining permits and keeps the k lowest in a bounded heap.
func scanLowest(ks *Keys, now int64, k int) []limiter.KeyEntry {
	st := ks.gcra
	type row struct {
		av limiter.Availability
		r  gcraRanked
	}
	top := newTopK(k, func(a, b row) bool {
		if a.av.Remaining != b.av.Remaining {
			return a.av.Remaining < b.av.Remaining
		}
		return ranksBefore(a.r, b.r)
	})
	for i := range st.shards {
		s := &st.shards[i]
		s.mu.Lock()
		for j := range s.nslots {
			sl := s.slot(j)
			if sl.state != slotLive || sl.tat().FullAt(now) {
				continue
			}
			top.offer(row{st.rate.Available(sl.tat(), now), gcraRanked{sl.tat(), s.key(j)}})
		}
		s.mu.Unlock()
	}
	rows := top.sorted()
	es := make([]limiter.KeyEntry, len(rows))
	for i, x := range rows {
		es[i] = limiter.KeyEntry{Key: string(x.r.key.bytes()), Availability: x.av}
	}
	return es
}

// TestScanLowestAgrees keeps the benchmark's scan honest: it must give the
// index's answer.
func TestScanLowestAgrees(t *testing.T) {
	ks := populatedKeys("uuid-36B", 20_000)
	now := keysBenchStart + int64(time.Second)
	for _, k := range []int{1, 10, 1000} {
		got, err := ks.Lowest(context.Background(), now, k)
		if err != nil {
			t.Fatal(err)
		}
		want := scanLowest(ks, now, k)
		if len(got) != len(want) {
			t.Fatalf("Lowest(%d): got %d entries, want %d", k, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("Lowest(%d)[%d] = %+v, want %+v", k, i, got[i], want[i])
			}
		}
	}
}
