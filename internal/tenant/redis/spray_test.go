package redis

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/storetest"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// TestSprayMemory measures Redis's used_memory under a spray of distinct
// IPv4 addresses against the bound (Config.MaxBytes), and fails when the
// tenants held or the memory they take pass it. By default it sprays 20,000
// addresses at a MaxBytes of 1 MiB (a bound of 1,365 GCRA tenants);
// RATELIMITER_SPRAY sets the number of addresses instead:
//
//	RATELIMITER_SPRAY=1000000 go test -run TestSprayMemory -v -timeout 1h ./internal/tenant/redis
//
// RATELIMITER_SPRAY_ALGORITHM (gcra by default), _LIMIT (100), _MAX_TENANTS
// and _MAX_BYTES (0: the defaults) set the policy, whose period is an hour;
// each address takes one permit at a time until it is denied, up to
// _GRANTS times (1 by default).
func TestSprayMemory(t *testing.T) {
	n, defaultBytes := storetest.EnvInt(t, "RATELIMITER_SPRAY", 0), 0
	if n <= 0 {
		n, defaultBytes = 20_000, 1<<20
	}
	alg := limiter.Algorithm(os.Getenv("RATELIMITER_SPRAY_ALGORITHM"))
	if alg == "" {
		alg = limiter.GCRA
	}
	cfg := tenant.Config{
		Policy:     limiter.Policy{Limit: int64(storetest.EnvInt(t, "RATELIMITER_SPRAY_LIMIT", 100)), Period: time.Hour, Algorithm: alg},
		MaxTenants: storetest.EnvInt(t, "RATELIMITER_SPRAY_MAX_TENANTS", 0),
		MaxBytes:   int64(storetest.EnvInt(t, "RATELIMITER_SPRAY_MAX_BYTES", defaultBytes)),
	}
	grants := storetest.EnvInt(t, "RATELIMITER_SPRAY_GRANTS", 1)
	bound, err := tenant.Bound(cfg, TableBytes, TenantBytes(cfg.Policy))
	if err != nil {
		t.Fatal(err)
	}
	maxBytes := cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = tenant.DefaultMaxBytes
	}
	c := newClient(t, redistest.Standalone(t))
	ts := newTenants(t, c, cfg)
	before := usedMemory(t, c)

	var next, granted, full atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 64 { // concurrent calls share pipelined connections
		wg.Go(func() {
			ctx := context.Background()
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				ip := fmt.Sprintf("%d.%d.%d.%d", 1+i>>24, i>>16&255, i>>8&255, i&255)
				for range grants {
					d, err := ts.Acquire(ctx, ip, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if d.RegistryFull {
						full.Add(1)
					}
					if !d.Allowed {
						break
					}
					granted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	after := usedMemory(t, c)
	idx, _ := members(t, c, ts)
	used := after - before
	t.Logf("%s limit %d: %d addresses, %d grants, %d denied for room, in %s", alg, cfg.Policy.Limit, n, granted.Load(), full.Load(), took.Round(time.Millisecond))
	t.Logf("tenants remembered: %d of a bound of %d (%d a shard; max bytes %d / %d bytes per tenant, max tenants %d)",
		idx, bound, ts.shardMax, maxBytes, TenantBytes(cfg.Policy), cfg.MaxTenants)
	t.Logf("used_memory grew by %d bytes (%.1f MiB, %.1f bytes per tenant, %.1f%% of max bytes); used_memory %d, before %d",
		used, float64(used)/(1<<20), float64(used)/float64(max(idx, 1)), 100*float64(used)/float64(maxBytes), after, before)
	if idx > int64(bound+numShards-1) {
		t.Errorf("tenants: got %d, want at most %d", idx, bound+numShards-1)
	}
	if used > maxBytes {
		t.Errorf("used_memory grew by %d bytes, want at most max bytes %d", used, maxBytes)
	}
}

func usedMemory(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("INFO memory has no used_memory: %q", info)
	return 0
}
