package bolt

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// What a data directory costs, measured:
//
//	go test -run '^$' -bench . -benchmem -count 6 ./internal/limiter/bolt | tee bolt.txt
//	benchstat bolt.txt

// millionTenants holds 1,000,000 tenants.
var millionTenants = tenant.Config{Policy: limiter.Policy{Limit: 100, Period: time.Hour}, MaxTenants: 1_000_000, MaxBytes: 1 << 30}

// million makes a Store whose tenants hold 1,000,000 addresses, each with
// permits taken, on the file in dir.
func million(b *testing.B, dir string) (*Store, *tenant.Registry) {
	b.Helper()
	clock := limiter.NewClock()
	reg, err := tenant.New(millionTenants, clock)
	if err != nil {
		b.Fatal(err)
	}
	s, err := Open(dir, memory.New(clock, 0), Options{Clock: clock, Tenants: reg})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var ip [4]byte
	for i := range 1_000_000 {
		binary.BigEndian.PutUint32(ip[:], 0x0a000000+uint32(i))
		if _, err := reg.Acquire(ctx, netip.AddrFrom4(ip).String(), 1+int64(i%50)); err != nil {
			b.Fatal(err)
		}
	}
	return s, reg
}

// BenchmarkSnapshot1M is one periodic snapshot of 1,000,000 tenants: the
// state read from the tables and written, synced, to the file.
func BenchmarkSnapshot1M(b *testing.B) {
	s, reg := million(b, b.TempDir())
	defer s.Close()
	for b.Loop() {
		if err := s.Save(false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(reg.AppendState(nil))), "state-bytes")
}

// BenchmarkStart1M is a start-up on a file holding 1,000,000 tenants: the
// file opened and checked, and the state restored.
func BenchmarkStart1M(b *testing.B) {
	dir := b.TempDir()
	s, _ := million(b, dir)
	if err := s.Save(true); err != nil {
		b.Fatal(err)
	}
	s.Close()
	for b.Loop() {
		clock := limiter.NewClock()
		reg, err := tenant.New(millionTenants, clock)
		if err != nil {
			b.Fatal(err)
		}
		s, err := Open(dir, memory.New(clock, 0), Options{Clock: clock, Tenants: reg})
		if err != nil {
			b.Fatal(err)
		}
		r, err := s.Restore(nil)
		if err != nil || r.Crashed {
			b.Fatalf("restored %+v, %v", r, err)
		}
		b.StopTimer()
		if got := reg.Stats().Tenants; got != 1_000_000 {
			b.Fatalf("restored %d tenants, want 1000000", got)
		}
		s.Close() // a clean shutdown, so that the next start is one too
		b.StartTimer()
	}
}

// BenchmarkPut is a definition created or replaced: written and synced
// before it returns.
func BenchmarkPut(b *testing.B) {
	clock := limiter.NewClock()
	s, err := Open(b.TempDir(), memory.New(clock, 0), Options{Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var n int64
	for b.Loop() {
		n++
		if _, err := s.Put(ctx, limiter.Definition{Name: "api", Policy: limiter.Policy{Limit: 1 + n%1000, Period: time.Minute}}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquire is a decision on the memory store alone and on the same
// store kept in a data directory, and in one while 1,000,000 tenants are
// saved over and over beside it (a snapshot every 10 s is the default):
// decisions never wait for the disk.
func BenchmarkAcquire(b *testing.B) {
	def := limiter.Definition{Name: "api", Policy: limiter.Policy{Limit: 1_000_000_000, Period: time.Second}}
	ctx := context.Background()
	run := func(b *testing.B, store limiter.Store) {
		if _, err := store.Put(ctx, def); err != nil {
			b.Fatal(err)
		}
		svc := limiter.NewService(store)
		for b.Loop() {
			if d, err := svc.Acquire(ctx, "api", 1); err != nil || !d.Allowed {
				b.Fatalf("%+v %v", d, err)
			}
		}
	}
	b.Run("store=memory", func(b *testing.B) { run(b, memory.New(nil, 0)) })
	b.Run("store=data-dir", func(b *testing.B) {
		clock := limiter.NewClock()
		s, err := Open(b.TempDir(), memory.New(clock, 0), Options{Clock: clock})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		run(b, s)
	})
	b.Run("store=data-dir-saving-1M", func(b *testing.B) {
		s, _ := million(b, b.TempDir())
		defer s.Close()
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
					if err := s.Save(false); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
		run(b, s)
		close(stop)
		<-done
	})
}

// BenchmarkChecksum is the checksum of one chunk of saved state (1 MiB),
// as Save writes it and Open and Restore check it.
func BenchmarkChecksum(b *testing.B) {
	chunk := make([]byte, chunkSize)
	key := binary.BigEndian.AppendUint64(nil, 0)
	b.SetBytes(chunkSize)
	for b.Loop() {
		checksum("state/tenants", key, chunk)
	}
}
