package tenant

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// refModel is the reference the property tests hold a Registry to: a plain
// map from tenant to state, with the documented rules written out as
// directly as possible. Full buckets are dropped eagerly, so every tenant
// it holds is one the registry must remember.
type refModel struct {
	policy limiter.Policy
	rate   limiter.Rate
	window limiter.Window
	max    int
	bits   int
	tats   map[uint64]limiter.TAT // GCRA
	logs   map[uint64]*refLog     // SlidingLog
}

type refLog struct {
	log   limiter.Log
	reset int64
}

func newRefModel(cfg Config) *refModel {
	p := cfg.Policy.Normalize()
	m := &refModel{policy: p, max: cfg.MaxTenants, bits: cfg.IPv6Prefix, tats: map[uint64]limiter.TAT{}, logs: map[uint64]*refLog{}}
	if m.max == 0 {
		m.max = DefaultMaxTenants
	}
	if m.bits == 0 {
		m.bits = DefaultIPv6Prefix
	}
	if p.Algorithm == limiter.GCRA {
		m.rate = limiter.NewRate(p)
	} else {
		m.window = limiter.NewWindow(p)
	}
	return m
}

func (m *refModel) gcra() bool { return m.policy.Algorithm == limiter.GCRA }

func (m *refModel) prune(now int64) {
	for k, t := range m.tats {
		if t.FullAt(now) {
			delete(m.tats, k)
		}
	}
	for k, l := range m.logs {
		if l.reset <= now {
			delete(m.logs, k)
		}
	}
}

// size counts the tenants held, full buckets included until pruned.
func (m *refModel) size() int { return len(m.tats) + len(m.logs) }

func (m *refModel) acquire(key uint64, now, n int64) (limiter.Decision, bool) {
	if m.size() >= m.max {
		m.prune(now)
	}
	if m.gcra() {
		t, ok := m.tats[key]
		tat, d := m.rate.Acquire(t, now, n)
		if !d.Allowed {
			return d, false
		}
		if !ok && len(m.tats) == m.max {
			var vk uint64
			var vt limiter.TAT
			first := true
			for k, t := range m.tats {
				if c := t.Compare(vt); first || c < 0 || c == 0 && k > vk {
					vk, vt, first = k, t, false
				}
			}
			if m.rate.Available(vt, now).Remaining == 0 {
				_, vd := m.rate.Acquire(vt, now, 1)
				return limiter.Decision{Permits: n, Limit: m.policy.Limit, RetryAfter: vd.RetryAfter, ResetAfter: vd.RetryAfter}, true
			}
			delete(m.tats, vk)
		}
		m.tats[key] = tat
		return d, false
	}
	l, ok := m.logs[key]
	if !ok {
		l = &refLog{}
	}
	d := l.log.Acquire(m.window, now, n)
	if !d.Allowed {
		return d, false
	}
	l.reset = now + int64(d.ResetAfter)
	if !ok && len(m.logs) == m.max {
		var vk uint64
		var v *refLog
		for k, x := range m.logs {
			if v == nil || x.reset < v.reset || x.reset == v.reset && k > vk {
				vk, v = k, x
			}
		}
		if v.log.Available(m.window, now).Remaining == 0 {
			vd := v.log.Acquire(m.window, now, 1)
			return limiter.Decision{Permits: n, Limit: m.policy.Limit, RetryAfter: vd.RetryAfter, ResetAfter: vd.RetryAfter}, true
		}
		delete(m.logs, vk)
	}
	m.logs[key] = l
	return d, false
}

// available is what acquire would tell key about one permit, changing
// nothing the registry could tell apart: it may drop full buckets.
func (m *refModel) available(key uint64, now int64) (limiter.Availability, bool) {
	_, heldT := m.tats[key]
	_, heldL := m.logs[key]
	if !heldT && !heldL && m.size() >= m.max {
		m.prune(now)
	}
	if m.gcra() {
		if !heldT && len(m.tats) == m.max {
			var vt limiter.TAT
			first := true
			for _, t := range m.tats {
				if first || t.Compare(vt) < 0 {
					vt, first = t, false
				}
			}
			if m.rate.Available(vt, now).Remaining == 0 {
				_, vd := m.rate.Acquire(vt, now, 1)
				return limiter.Availability{Limit: m.policy.Limit, ResetAfter: vd.RetryAfter}, true
			}
		}
		return m.rate.Available(m.tats[key], now), false
	}
	if l, ok := m.logs[key]; ok {
		return l.log.Available(m.window, now), false
	}
	if len(m.logs) == m.max {
		var vk uint64
		var v *refLog
		for k, x := range m.logs {
			if v == nil || x.reset < v.reset || x.reset == v.reset && k > vk {
				vk, v = k, x
			}
		}
		if v.log.Available(m.window, now).Remaining == 0 {
			vd := v.log.Acquire(m.window, now, 1)
			return limiter.Availability{Limit: m.policy.Limit, ResetAfter: vd.RetryAfter}, true
		}
	}
	var empty limiter.Log
	return empty.Available(m.window, now), false
}

// lowest sorts every tenant by the documented order and keeps k.
func (m *refModel) lowest(now int64, k int) []Entry {
	m.prune(now)
	type row struct {
		key uint64
		tat limiter.TAT // GCRA only
		av  limiter.Availability
	}
	var rows []row
	for key, t := range m.tats {
		rows = append(rows, row{key, t, m.rate.Available(t, now)})
	}
	for key, l := range m.logs {
		rows = append(rows, row{key: key, av: l.log.Available(m.window, now)})
	}
	slices.SortFunc(rows, func(a, b row) int {
		if c := cmp.Compare(a.av.Remaining, b.av.Remaining); c != 0 {
			return c
		}
		if m.gcra() {
			if c := b.tat.Compare(a.tat); c != 0 {
				return c
			}
		} else if c := cmp.Compare(b.av.ResetAfter, a.av.ResetAfter); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	})
	var out []Entry
	for _, r := range rows[:min(k, len(rows))] {
		out = append(out, Entry{Tenant: formatKey(r.key, m.bits), Remaining: r.av.Remaining, Limit: r.av.Limit, ResetAfter: r.av.ResetAfter})
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

func runAgainstReference(t *testing.T, cfg Config, ips []string, mix opMix, seed uint64, steps int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x7e57))
	c := newFakeClock()
	r := newRegistry(t, cfg, c)
	m := newRefModel(cfg)
	ctx := context.Background()
	maxTenants := m.max
	p := r.Policy()
	capacity := p.Burst
	if p.Algorithm == limiter.SlidingLog {
		capacity = p.Limit
	}
	peak, depth := 0, 0
	defer func() { t.Logf("peak tenants: %d, deepest index: %d levels", peak, depth) }()
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
			depth = max(depth, indexDepth(r))
			if live := r.store.live(); live != s.Tenants {
				t.Fatalf("step %d: Stats().Tenants = %d, but the shards hold %d", i, s.Tenants, live)
			}
			m.prune(now)
			if s.Tenants < m.size() {
				t.Fatalf("step %d: Stats().Tenants = %d, want at least the %d tenants with permits taken", i, s.Tenants, m.size())
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
