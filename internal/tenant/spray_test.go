package tenant

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/storetest"
)

// TestSprayMemory measures a Registry's memory under a spray of distinct
// IPv4 addresses against its bound (Config.MaxBytes) and fails when the
// live heap or the tenants remembered pass it. By default it sprays 50,000
// addresses at a MaxBytes of 1 MiB, under each algorithm, which the bound
// caps at 8,192 GCRA tenants and 171 sliding logs. RATELIMITER_SPRAY sets
// the number of addresses for one configuration per process instead, so
// that the peak RSS is its own:
//
//	RATELIMITER_SPRAY=10000000 RATELIMITER_SPRAY_ALGORITHM=sliding_log \
//	  go test -run TestSprayMemory -v -timeout 1h ./internal/tenant
//
// RATELIMITER_SPRAY_ALGORITHM (gcra by default), _LIMIT (100), _MAX_TENANTS
// and _MAX_BYTES (0: the defaults) set the policy; the period is an hour.
// Each address takes one permit at a time until it is denied, up to
// _GRANTS times (1 under GCRA, Limit under the sliding log by default, so
// that every remembered log grows its ring to the largest it can).
func TestSprayMemory(t *testing.T) {
	n := storetest.EnvInt(t, "RATELIMITER_SPRAY", 0)
	if n > 0 {
		alg := limiter.Algorithm(os.Getenv("RATELIMITER_SPRAY_ALGORITHM"))
		if alg == "" {
			alg = limiter.GCRA
		}
		spray(t, n, alg, storetest.EnvInt(t, "RATELIMITER_SPRAY_MAX_TENANTS", 0), int64(storetest.EnvInt(t, "RATELIMITER_SPRAY_MAX_BYTES", 0)))
		return
	}
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) { spray(t, 50_000, alg, 0, 1<<20) })
	}
}

func spray(t *testing.T, n int, alg limiter.Algorithm, maxTenants int, maxBytes int64) {
	limit := int64(storetest.EnvInt(t, "RATELIMITER_SPRAY_LIMIT", 100))
	grants := 1
	if alg == limiter.SlidingLog {
		grants = int(limit)
	}
	grants = storetest.EnvInt(t, "RATELIMITER_SPRAY_GRANTS", grants)
	cfg := Config{
		Policy:     limiter.Policy{Limit: limit, Period: time.Hour, Algorithm: alg},
		MaxTenants: maxTenants,
		MaxBytes:   maxBytes,
	}
	bound, err := Bound(cfg, TableBytes, TenantBytes(cfg.Policy))
	if err != nil {
		t.Fatal(err)
	}
	if maxBytes == 0 {
		maxBytes = DefaultMaxBytes
	}

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	c := newFakeClock()
	r := newRegistry(t, cfg, c)
	ctx := context.Background()
	start := time.Now()
	granted, full := 0, 0
	for i := range n {
		ip := ipv4Of(uint32(0x01000000 + i))
		for range grants {
			d, err := r.Acquire(ctx, ip, 1)
			if err != nil {
				t.Fatal(err)
			}
			c.Advance(time.Microsecond)
			if d.RegistryFull {
				full++
			}
			if !d.Allowed {
				break
			}
			granted++
		}
	}
	took := time.Since(start)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	tenants := r.Stats().Tenants
	live := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%s limit %d: %d addresses, %d grants, %d denied for room, in %s", alg, limit, n, granted, full, took.Round(time.Millisecond))
	t.Logf("tenants remembered: %d of a bound of %d (max bytes %d / %d bytes per tenant, max tenants %d)",
		tenants, bound, maxBytes, TenantBytes(cfg.Policy), cfg.MaxTenants)
	t.Logf("live heap of the registry: %d bytes (%.1f MiB, %.1f bytes per tenant, %.1f%% of max bytes)",
		live, float64(live)/(1<<20), float64(live)/float64(max(tenants, 1)), 100*float64(live)/float64(maxBytes))
	t.Logf("heap in use %.1f MiB, heap from the OS %.1f MiB, process RSS %s, peak RSS %s",
		float64(after.HeapInuse)/(1<<20), float64(after.HeapSys)/(1<<20), procStatus("VmRSS"), procStatus("VmHWM"))
	if tenants > bound {
		t.Errorf("tenants: got %d, want at most %d", tenants, bound)
	}
	if live > maxBytes {
		t.Errorf("live heap: got %d bytes, want at most max bytes %d", live, maxBytes)
	}
	runtime.KeepAlive(r)
}

// procStatus returns a field of /proc/self/status, such as "VmRSS".
func procStatus(field string) string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
