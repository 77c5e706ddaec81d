package tenant

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/keystest"
)

// refModel is the reference the property tests hold a Registry to: the
// table's model over the tenants' keys, as the Registry writes them.
type refModel struct {
	*keystest.Model
	bits int
}

func newRefModel(cfg Config) *refModel {
	maxT := cfg.MaxTenants
	if maxT == 0 {
		maxT = DefaultMaxTenants
	}
	bits := cfg.IPv6Prefix
	if bits == 0 {
		bits = DefaultIPv6Prefix
	}
	return &refModel{Model: keystest.NewModel(cfg.Policy, maxT), bits: bits}
}

func (m *refModel) acquire(key uint64, now, n int64) (limiter.Decision, bool) {
	kb := keyOf(key)
	return m.Acquire(string(kb[:]), now, n)
}

func (m *refModel) available(key uint64, now int64) (limiter.Availability, bool) {
	kb := keyOf(key)
	return m.Available(string(kb[:]), now)
}

func (m *refModel) lowest(now int64, k int) []Entry {
	var out []Entry
	for _, e := range m.Lowest(now, k) {
		out = append(out, Entry{Tenant: formatKey(keyFrom(e.Key), m.bits), Remaining: e.Remaining, Limit: e.Limit, ResetAfter: e.ResetAfter})
	}
	return out
}

// propertyIPs are the addresses random sequences draw from: IPv4, the same
// IPv4 mapped into IPv6, several hosts of one /64 and prefixes that merge at
// /48.
var propertyIPs = func() []string {
	ips := []string{
		"::ffff:198.51.100.1", "::ffff:198.51.100.2",
		"2001:db8:0:1::1", "2001:db8:0:1::2", "2001:db8:0:1:ffff::",
		"2001:db8:0:2::1", "2001:db8:5::9", "2001:db8:5:1::9", "fe80::1", "::1",
	}
	for i := 1; i <= 14; i++ {
		ips = append(ips, fmt.Sprintf("198.51.100.%d", i))
	}
	return ips
}()

var propertyConfigs = []Config{
	{Policy: limiter.Policy{Limit: 5, Period: time.Second}},
	{Policy: limiter.Policy{Limit: 7, Period: time.Second}, IPv6Prefix: 48},          // 1/7 s: fractional TATs
	{Policy: limiter.Policy{Limit: 3, Period: 100 * time.Millisecond, Burst: 2}},     // burst below limit
	{Policy: limiter.Policy{Limit: 1_000_000_000, Period: time.Millisecond}},         // sub-nanosecond interval
	{Policy: limiter.Policy{Limit: 4, Period: time.Second}, MaxTenants: 5},           // eviction
	{Policy: limiter.Policy{Limit: 7, Period: time.Second, Burst: 3}, MaxTenants: 1}, // a single tenant
	{Policy: limiter.Policy{Limit: 2, Period: time.Second}, MaxTenants: 3, IPv6Prefix: 1},
	{Policy: limiter.Policy{Limit: 5, Period: time.Second, Algorithm: limiter.SlidingLog}},
	{Policy: limiter.Policy{Limit: 3, Period: 250 * time.Millisecond, Algorithm: limiter.SlidingLog}, IPv6Prefix: 48},
	{Policy: limiter.Policy{Limit: 4, Period: time.Second, Algorithm: limiter.SlidingLog}, MaxTenants: 5},
	{Policy: limiter.Policy{Limit: 2, Period: time.Second, Algorithm: limiter.SlidingLog}, MaxTenants: 1},
}

// step advances the clock by a random amount: often not at all, so that
// tenants tie on the same TAT, sometimes by less than a nanosecond's worth
// of permits, sometimes past the period so that every bucket refills.
func step(rng *rand.Rand, c *fakeClock, p limiter.Policy) {
	interval := p.Period / time.Duration(p.Limit)
	switch x := rng.IntN(100); {
	case x < 40:
	case x < 50:
		c.Advance(1)
	case x < 75:
		c.Advance(time.Duration(rng.Int64N(int64(interval) + 1)))
	case x < 97:
		c.Advance(time.Duration(rng.Int64N(int64(p.Period))))
	default:
		c.Advance(p.Period + time.Duration(rng.Int64N(int64(p.Period))))
	}
}

// manyIPs returns n distinct addresses, one in five IPv6, so that every
// shard holds enough tenants for a multi-level index.
func manyIPs(n int) []string {
	rng := rand.New(rand.NewPCG(42, 42))
	seen := map[string]bool{}
	var ips []string
	for len(ips) < n {
		var ip string
		if rng.IntN(5) == 0 {
			ip = fmt.Sprintf("2001:db8:%x:%x::%x", rng.IntN(1<<16), rng.IntN(1<<16), rng.IntN(1<<16))
		} else {
			ip = ipv4Of(0x0a000000 | rng.Uint32N(1<<24))
		}
		if !seen[ip] {
			seen[ip] = true
			ips = append(ips, ip)
		}
	}
	return ips
}

func TestLowestMatchesReference(t *testing.T) {
	for ci, cfg := range propertyConfigs {
		for seed := range uint64(4) {
			t.Run(fmt.Sprintf("%d/%s/max=%d/seed=%d", ci, cfg.Policy.Normalize().Algorithm, cfg.MaxTenants, seed), func(t *testing.T) {
				runAgainstReference(t, cfg, propertyIPs, defaultMix, seed, 4000)
			})
		}
	}
}

// TestLowestMatchesReferenceAtScale runs sequences over thousands of
// tenants: sometimes tens of thousands at once, so that each shard's index
// has several levels, sometimes a few hundred, so that tables are rebuilt as
// they grow and shrink.
func TestLowestMatchesReferenceAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: tens of thousands of tenants")
	}
	ips := manyIPs(40_000)
	tests := []struct {
		cfg  Config
		mix  opMix
		ips  int
		step int
	}{
		{Config{Policy: limiter.Policy{Limit: 5, Period: time.Second}}, opMix{lowest: 1, step: 10}, 3000, 30_000},
		{Config{Policy: limiter.Policy{Limit: 7, Period: time.Second, Burst: 4}, MaxTenants: 700}, opMix{lowest: 1, step: 10}, 3000, 30_000},
		{Config{Policy: limiter.Policy{Limit: 5, Period: time.Second, Algorithm: limiter.SlidingLog}, MaxTenants: 700}, opMix{lowest: 1, step: 10}, 3000, 30_000},
		{Config{Policy: limiter.Policy{Limit: 7, Period: time.Second}}, opMix{lowest: 0.05, step: 0.02}, 40_000, 60_000},
		{Config{Policy: limiter.Policy{Limit: 3, Period: time.Second}, MaxTenants: 20_000}, opMix{lowest: 0.05, step: 0.02}, 40_000, 60_000},
	}
	for ti, tt := range tests {
		for seed := range uint64(2) {
			steps := tt.step
			if raceEnabled {
				steps /= 5
			}
			t.Run(fmt.Sprintf("%d/%s/max=%d/seed=%d", ti, tt.cfg.Policy.Normalize().Algorithm, tt.cfg.MaxTenants, seed), func(t *testing.T) {
				runAgainstReference(t, tt.cfg, ips[:tt.ips], tt.mix, seed, steps)
			})
		}
	}
}

// opMix is how often, in percent, a random sequence asks for Lowest and
// lets time pass; the rest are acquisitions and, 15% of the time,
// Available.
type opMix struct{ lowest, step float64 }

var defaultMix = opMix{lowest: 15, step: 10}

// checkInvariants verifies the registry's table from scratch.
func checkInvariants(t testing.TB, r *Registry) {
	t.Helper()
	if err := r.keys.Check(); err != nil {
		t.Fatal(err)
	}
}

func runAgainstReference(t *testing.T, cfg Config, ips []string, mix opMix, seed uint64, steps int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x7e57))
	c := newFakeClock()
	r := newRegistry(t, cfg, c)
	m := newRefModel(cfg)
	ctx := context.Background()
	maxTenants := m.Max()
	p := r.Policy()
	capacity := p.Burst
	if p.Algorithm == limiter.SlidingLog {
		capacity = p.Limit
	}
	peak := 0
	defer func() { t.Logf("peak tenants: %d", peak) }()
	for i := range steps {
		now := limiter.Nanos(c.Wall())
		ip := ips[rng.IntN(len(ips))]
		key, err := parseKey(ip, m.bits)
		if err != nil {
			t.Fatal(err)
		}
		switch x := rng.Float64() * 100; {
		case x < mix.step:
			step(rng, c, p)
		case x < mix.step+mix.lowest:
			k := 1 + rng.IntN(min(len(ips)+2, 40))
			if rng.IntN(10) == 0 {
				k = MaxLowest
			}
			got := mustLowest(t, r, k)
			want := m.lowest(now, k)
			if !slices.Equal(got, want) {
				t.Fatalf("step %d: Lowest(%d)\n got %+v\nwant %+v", i, k, got, want)
			}
		case x < mix.step+mix.lowest+15:
			got := mustAvailable(t, r, ip)
			av, full := m.available(key, now)
			want := Availability{Tenant: formatKey(key, m.bits), Availability: av, RegistryFull: full}
			if got != want {
				t.Fatalf("step %d: Available(%q)\n got %+v\nwant %+v", i, ip, got, want)
			}
		default:
			// Permits of every magnitude, so that huge capacities see small
			// acquisitions too (TATs less than a nanosecond after now).
			n := 1 + rng.Int64N(min(capacity, int64(1)<<rng.IntN(31)))
			if rng.IntN(20) == 0 && capacity < limiter.MaxLimit {
				n = capacity + 1
			}
			got, err := r.Acquire(ctx, ip, n)
			if err != nil {
				t.Fatalf("step %d: Acquire(%q, %d): %v", i, ip, n, err)
			}
			wantD, wantFull := m.acquire(key, now, n)
			want := Decision{Tenant: formatKey(key, m.bits), Decision: wantD, RegistryFull: wantFull}
			if got != want {
				t.Fatalf("step %d: Acquire(%q, %d)\n got %+v\nwant %+v", i, ip, n, got, want)
			}
		}
		s := r.Stats()
		peak = max(peak, s.Tenants)
		if s.Tenants > maxTenants || s.IndexEntries < s.Tenants {
			t.Fatalf("step %d: Stats() = %+v, want tenants <= %d <= index entries", i, s, maxTenants)
		}
		// The full checks cost O(n): every so often.
		if i%(5+len(ips)/20) == 0 || i == steps-1 {
			checkInvariants(t, r)
			if live := r.keys.Live(); live != s.Tenants {
				t.Fatalf("step %d: Stats().Tenants = %d, but the shards hold %d", i, s.Tenants, live)
			}
			m.Prune(now)
			if s.Tenants < m.Size() {
				t.Fatalf("step %d: Stats().Tenants = %d, want at least the %d tenants with permits taken", i, s.Tenants, m.Size())
			}
		}
	}
}

// TestMaxTenantsRule checks the bound on its own terms, without a model:
// the registry never holds more than MaxTenants tenants, a tenant is only
// ever evicted while it has permits left, and under GCRA a newcomer is only
// denied for room when every remembered tenant is limited.
func TestMaxTenantsRule(t *testing.T) {
	for _, alg := range algorithms {
		for _, maxT := range []int{1, 3, 8} {
			t.Run(fmt.Sprintf("%s/max=%d", alg, maxT), func(t *testing.T) {
				cfg := Config{Policy: limiter.Policy{Limit: 3, Period: time.Second, Algorithm: alg}, MaxTenants: maxT}
				rng := rand.New(rand.NewPCG(uint64(maxT), 1))
				c := newFakeClock()
				r := newRegistry(t, cfg, c)
				ips := propertyIPs[len(propertyIPs)-12:]
				evictions, denials := 0, 0
				for i := range 3000 {
					if rng.IntN(6) == 0 {
						step(rng, c, r.Policy())
						continue
					}
					before := make(map[string]Availability, len(ips))
					for _, ip := range ips {
						before[ip] = mustAvailable(t, r, ip)
					}
					ip := ips[rng.IntN(len(ips))]
					d := mustAcquire(t, r, ip, 1+rng.Int64N(2))
					tracked := 0
					for _, other := range ips {
						b := before[other]
						if b.RegistryFull {
							// Not remembered: what it could take follows the
							// tenant it would evict.
							continue
						}
						if b.ResetAfter > 0 {
							tracked++
						}
						if other == ip {
							continue
						}
						after := mustAvailable(t, r, other)
						if after == b {
							continue
						}
						if b.Remaining == 0 {
							t.Fatalf("step %d: acquiring for %s changed limited tenant %s from %+v to %+v", i, ip, other, b, after)
						}
						evictions++
					}
					if d.RegistryFull {
						denials++
						if tracked != maxT {
							t.Fatalf("step %d: newcomer %s denied for room with %d of %d tenants remembered", i, ip, tracked, maxT)
						}
						if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
							t.Fatalf("step %d: denial for room = %+v, want not allowed, 0 remaining, a positive RetryAfter", i, d)
						}
						if alg == limiter.GCRA {
							for _, other := range ips {
								if b := before[other]; b.ResetAfter > 0 && b.Remaining > 0 {
									t.Fatalf("step %d: newcomer %s denied for room while %s has %d permits left", i, ip, other, b.Remaining)
								}
							}
						}
					}
					if s := r.Stats(); s.Tenants > maxT {
						t.Fatalf("step %d: %d tenants remembered, want at most %d", i, s.Tenants, maxT)
					}
				}
				if evictions == 0 || denials == 0 {
					t.Errorf("got %d evictions and %d denials for room, want the sequence to exercise both", evictions, denials)
				}
			})
		}
	}
}
