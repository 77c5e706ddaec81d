package tenant

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// TestConcurrentAcquire has many goroutines acquire from shared and
// distinct tenants while others read, with the clock stopped: no bucket
// refills, so each tenant must grant exactly its capacity, whoever asks.
func TestConcurrentAcquire(t *testing.T) {
	const (
		workers  = 8
		shared   = 5  // tenants every worker hits
		own      = 40 // tenants only one worker hits
		capacity = 10
	)
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			r := newRegistry(t, Config{Policy: limiter.Policy{Limit: capacity, Period: time.Hour, Algorithm: alg}}, newFakeClock())
			ctx := context.Background()
			var ips []string
			for i := range shared {
				ips = append(ips, fmt.Sprintf("2001:db8:%d::1", i))
			}
			for i := range workers * own {
				ips = append(ips, ipv4(i))
			}
			granted := make([]atomic.Int64, len(ips))
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					// Every worker hits the shared tenants and its own,
					// each more often than capacity allows.
					idx := []int{}
					for i := range shared {
						idx = append(idx, i)
					}
					for i := range own {
						idx = append(idx, shared+w*own+i)
					}
					for round := range 3 * capacity {
						for j, i := range idx {
							n := int64(1 + (round+j+w)%2)
							d, err := r.Acquire(ctx, ips[i], n)
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								granted[i].Add(n)
							}
						}
					}
				})
			}
			for range 2 {
				wg.Go(func() {
					for range 200 {
						if _, err := r.Lowest(ctx, 10); err != nil {
							t.Error(err)
						}
						if _, err := r.Available(ctx, ips[0]); err != nil {
							t.Error(err)
						}
						r.Stats()
					}
				})
			}
			wg.Wait()
			checkInvariants(t, r)
			for i, ip := range ips {
				// Requests alternate 1 and 2 permits and outnumber the
				// capacity, so the last permit is always asked for alone.
				if got := granted[i].Load(); got != capacity {
					t.Errorf("tenant %s granted %d permits, want exactly %d", ip, got, capacity)
				}
			}
			if got, want := r.Stats().Tenants, len(ips); got != want {
				t.Errorf("tenants: got %d, want %d", got, want)
			}
			es := mustLowest(t, r, MaxLowest)
			if len(es) != len(ips) {
				t.Fatalf("Lowest listed %d tenants, want %d", len(es), len(ips))
			}
			for _, e := range es {
				if e.Remaining != 0 {
					t.Errorf("Lowest: %+v, want 0 remaining", e)
				}
			}
		})
	}
}

// TestConcurrentSpray has goroutines spray distinct addresses at a small
// registry while a few tenants stay limited: the bound holds at every
// instant, and the limited tenants are never forgiven.
func TestConcurrentSpray(t *testing.T) {
	const maxTenants = 16
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			r := newRegistry(t, Config{Policy: limiter.Policy{Limit: 4, Period: time.Hour, Algorithm: alg}, MaxTenants: maxTenants}, newFakeClock())
			ctx := context.Background()
			victims := []string{"192.0.2.1", "192.0.2.2", "2001:db8::1"}
			for _, ip := range victims {
				if d := mustAcquire(t, r, ip, 4); !d.Allowed {
					t.Fatalf("acquire for %s: %+v", ip, d)
				}
			}
			var wg sync.WaitGroup
			var over atomic.Int64
			for w := range 6 {
				wg.Go(func() {
					for i := range 3000 {
						ip := ipv4Of(uint32(0x0b000000 + w<<16 + i))
						if _, err := r.Acquire(ctx, ip, 1); err != nil {
							t.Error(err)
							return
						}
						if s := r.Stats(); s.Tenants > maxTenants {
							over.Store(int64(s.Tenants))
						}
					}
				})
			}
			wg.Wait()
			checkInvariants(t, r)
			if got := over.Load(); got != 0 {
				t.Errorf("saw %d tenants, want at most %d", got, maxTenants)
			}
			for _, ip := range victims {
				if a := mustAvailable(t, r, ip); a.Remaining != 0 {
					t.Errorf("limited tenant %s: got %+v after the spray, want still 0 remaining", ip, a)
				}
			}
		})
	}
}
