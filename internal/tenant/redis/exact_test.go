package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// The exactness properties drive Tenants with explicit instants and an
// in-memory tenant.Registry, whose clock reads the same instants, with the
// same random sequence of acquisitions, availabilities and Lowest queries,
// and require identical answers at every step. The Registry is the
// reference: its own property tests hold it to a brute-force model, and its
// sliding-log Lowest scans every tenant. The instants are whole
// microseconds, Redis's resolution, around the year 2100, far from the
// test's real time, so that no key's expiry (an absolute instant) fires
// during the test; time never runs backwards, as the Registry forgets full
// tenants for good.

// epochUS is 2100-01-01T00:00:00Z in microseconds.
const epochUS = 4_102_444_800_000_000

var gcraConfigs = []tenant.Config{
	{Policy: limiter.Policy{Limit: 5, Period: time.Second}},
	{Policy: limiter.Policy{Limit: 7, Period: time.Second}, IPv6Prefix: 48},                 // 1/7 s: TATs between microseconds
	{Policy: limiter.Policy{Limit: 3, Period: 100 * time.Millisecond, Burst: 2}},            // burst below limit
	{Policy: limiter.Policy{Limit: limiter.MaxLimit, Period: time.Millisecond}},             // a picosecond per permit
	{Policy: limiter.Policy{Limit: 999_999_937, Period: limiter.MaxPeriod, Burst: 999_999}}, // the largest tolerance
	{Policy: limiter.Policy{Limit: 13, Period: time.Second + 999}},                          // not whole microseconds
	{Policy: limiter.Policy{Limit: 2, Period: time.Second}, IPv6Prefix: 1},                  // two IPv6 tenants
}

var logConfigs = []tenant.Config{
	{Policy: limiter.Policy{Limit: 5, Period: time.Second, Algorithm: limiter.SlidingLog}},
	{Policy: limiter.Policy{Limit: 3, Period: 250 * time.Millisecond, Algorithm: limiter.SlidingLog}, IPv6Prefix: 48},
	{Policy: limiter.Policy{Limit: 1, Period: time.Millisecond + 1, Algorithm: limiter.SlidingLog}},
	{Policy: limiter.Policy{Limit: 40, Period: time.Second + 999, Algorithm: limiter.SlidingLog}},
	{Policy: limiter.Policy{Limit: limiter.MaxLimit, Period: time.Hour, Algorithm: limiter.SlidingLog}},
}

// propertyIPs are the addresses random sequences draw from: IPv4, the same
// IPv4 mapped into IPv6, several hosts of one /64 and prefixes that merge
// at /48 (and all of IPv6 but ::1 in one tenant at /1).
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

// opMix is how often, in percent, a random sequence asks for Lowest, asks
// for Available and lets time pass; the rest are acquisitions.
type opMix struct{ lowest, available, step float64 }

// tally counts what a property test compared, for the log.
type tally struct{ sequences, acquires, availables, lowests, entries, checks int }

func (n tally) String() string {
	return fmt.Sprintf("%d sequences: %d acquisitions, %d availabilities, %d Lowest answers (%d entries) identical; index checked %d times",
		n.sequences, n.acquires, n.availables, n.lowests, n.entries, n.checks)
}

// crowdedIPs are addresses of tenants in two shards only, IPv4 and IPv6,
// so that each shard's script orders many tenants itself rather than
// leaving it to the merge.
var crowdedIPs = func() []string {
	var ips []string
	for i := 0; len(ips) < 24; i++ {
		ip := fmt.Sprintf("198.51.100.%d", i)
		if i%3 == 0 {
			ip = fmt.Sprintf("2001:db8:%x::1", i)
		}
		if key, _, _ := tenant.Key(ip, 64); shardOf(key) < 2 {
			ips = append(ips, ip)
		}
	}
	return ips
}()

func testMatchesRegistry(t *testing.T, c rueidis.Client, configs []tenant.Config) {
	var n tally
	for ci, cfg := range configs {
		for seed, ips := range [][]string{propertyIPs, crowdedIPs} {
			t.Run(fmt.Sprintf("%d/seed=%d", ci, seed), func(t *testing.T) {
				runAgainstRegistry(t, c, cfg, ips, opMix{lowest: 15, available: 15, step: 10}, uint64(seed), 1200, &n)
			})
		}
	}
	t.Log(n)
}

// oneShardIPs are addresses of tenants all in shard 0, IPv4 and IPv6, so
// that the shard's bound is the whole bound of the Registry they are
// compared with (see redisConfig).
var oneShardIPs = func() []string {
	var ips []string
	for i := 0; len(ips) < 12; i++ {
		ip := fmt.Sprintf("198.51.100.%d", i)
		if i%3 == 0 {
			ip = fmt.Sprintf("2001:db8:%x::1", i)
		}
		if key, _, _ := tenant.Key(ip, 64); shardOf(key) == 0 {
			ips = append(ips, ip)
		}
	}
	return ips
}()

// redisConfig is the Config of Tenants that answer as a Registry of cfg
// does for tenants ips: the same, but for a MaxTenants, which each shard
// holds its share of. So with a MaxTenants every ip must be in one shard.
func redisConfig(t *testing.T, cfg tenant.Config, ips []string) tenant.Config {
	t.Helper()
	if cfg.MaxTenants == 0 {
		return cfg
	}
	for _, ip := range ips {
		if key, _, _ := tenant.Key(ip, cfg.IPv6Prefix); shardOf(key) != 0 {
			t.Fatalf("%s is in shard %d: a bound of tenants is compared in shard 0 only", ip, shardOf(key))
		}
	}
	cfg.MaxTenants *= numShards
	return cfg
}

// testBoundMatchesRegistry: at the bound of tenants, acquisitions and
// availabilities answer as the Registry's, which its own tests hold to a
// model: a newcomer evicts the tenant with the most permits left, or is
// denied with RegistryFull when it is limited, and Available says so.
func testBoundMatchesRegistry(t *testing.T, c rueidis.Client) {
	var n tally
	for ci, cfg := range []tenant.Config{
		{Policy: limiter.Policy{Limit: 4, Period: time.Second}, MaxTenants: 5},
		{Policy: limiter.Policy{Limit: 7, Period: time.Second, Burst: 3}, MaxTenants: 1},
		{Policy: limiter.Policy{Limit: 1, Period: time.Hour}, MaxTenants: 3},
		{Policy: limiter.Policy{Limit: 4, Period: time.Second, Algorithm: limiter.SlidingLog}, MaxTenants: 5},
		{Policy: limiter.Policy{Limit: 2, Period: time.Second, Algorithm: limiter.SlidingLog}, MaxTenants: 1},
		{Policy: limiter.Policy{Limit: 1, Period: time.Hour, Algorithm: limiter.SlidingLog}, MaxTenants: 3},
	} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%d/seed=%d", ci, seed), func(t *testing.T) {
				runAgainstRegistry(t, c, cfg, oneShardIPs, opMix{lowest: 10, available: 25, step: 10}, seed, 1500, &n)
			})
		}
	}
	t.Log(n)
}

// testLowestAtScale runs sequences over a thousand tenants, many of them
// holding grants that are leaving the window, so that the sliding log's
// walk reads past stale bounds, lowers them, and pages through its index.
func testLowestAtScale(t *testing.T, c rueidis.Client) {
	rng := rand.New(rand.NewPCG(42, 42))
	ips := make([]string, 0, 1000)
	for i := range cap(ips) {
		if i%5 == 0 {
			ips = append(ips, fmt.Sprintf("2001:db8:%x:%x::1", rng.IntN(1<<16), i))
		} else {
			ips = append(ips, fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
		}
	}
	var n tally
	for ci, cfg := range []tenant.Config{
		{Policy: limiter.Policy{Limit: 20, Period: time.Second, Algorithm: limiter.SlidingLog}},
		{Policy: limiter.Policy{Limit: 3, Period: 200 * time.Millisecond, Algorithm: limiter.SlidingLog}},
		{Policy: limiter.Policy{Limit: 20, Period: time.Second}},
	} {
		t.Run(strconv.Itoa(ci), func(t *testing.T) {
			runAgainstRegistry(t, c, cfg, ips, opMix{lowest: 4, available: 5, step: 1}, 7, 3000, &n)
		})
	}
	t.Log(n)
}

func runAgainstRegistry(t *testing.T, c rueidis.Client, cfg tenant.Config, ips []string, mix opMix, seed uint64, steps int, n *tally) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0x7e57))
	now := epochUS + rng.Int64N(1e12)
	reg, err := tenant.New(cfg, microClock(&now))
	if err != nil {
		t.Fatal(err)
	}
	ts := newTenants(t, c, redisConfig(t, cfg, ips))
	p := reg.Policy()
	capacity := p.Burst
	if p.Algorithm == limiter.SlidingLog {
		capacity = p.Limit
	}
	n.sequences++
	us := func() string { return strconv.FormatInt(now, 10) }
	// The last decision's times to reset and retry: stepping exactly to
	// them finds buckets full, or a grant leaving, at that very instant.
	var reset, retry time.Duration
	if raceEnabled {
		steps /= 2
	}
	for i := range steps {
		// The full check reads every key: every so often.
		if i%max(100, len(ips)) == 0 {
			checkIndex(t, c, ts, now)
			n.checks++
		}
		ip := ips[rng.IntN(len(ips))]
		switch x := rng.Float64() * 100; {
		case x < mix.step:
			now = step(rng, now, p, reset, retry)
		case x < mix.step+mix.lowest:
			// Often a second query at the same instant, which reads the
			// bounds the first one lowered.
			for again := true; again; again = rng.IntN(2) == 0 {
				k := 1 + rng.IntN(min(len(ips)+2, 40))
				switch rng.IntN(10) {
				case 0:
					k = tenant.MaxLowest
				case 1, 2, 3, 4:
					k = 1 + rng.IntN(3)
				}
				got, err := ts.lowest(ctx, k, us())
				if err != nil {
					t.Fatalf("step %d: Lowest(%d): %v", i, k, err)
				}
				want, _ := reg.Lowest(ctx, k)
				if !slices.Equal(got, want) {
					t.Fatalf("step %d, now %dµs: Lowest(%d)\n got %+v\nwant %+v", i, now, k, got, want)
				}
				n.lowests++
				n.entries += len(got)
			}
		case x < mix.step+mix.lowest+mix.available:
			got, err := ts.available(ctx, ip, us())
			want, _ := reg.Available(ctx, ip)
			if err != nil || got != want {
				t.Fatalf("step %d, now %dµs: Available(%q)\n got %+v, %v\nwant %+v", i, now, ip, got, err, want)
			}
			n.availables++
		default:
			// Permits of every magnitude, so that huge capacities see small
			// acquisitions too.
			k := 1 + rng.Int64N(min(capacity, int64(1)<<rng.IntN(31)))
			if rng.IntN(20) == 0 && capacity < limiter.MaxLimit {
				k = capacity + 1
			}
			got, err := ts.acquire(ctx, ip, k, us())
			want, _ := reg.Acquire(ctx, ip, k)
			if err != nil || got != want {
				t.Fatalf("step %d, now %dµs: Acquire(%q, %d)\n got %+v, %v\nwant %+v", i, now, ip, k, got, err, want)
			}
			n.acquires++
			reset = got.ResetAfter
			if got.RetryAfter > 0 {
				retry = got.RetryAfter
			}
		}
	}
}

// step moves time forward the way traffic does: often not at all, so that
// tenants tie; by a microsecond; to the instant the last decision said its
// bucket would be full or a retry would succeed, or just before; by part of
// an emission interval; by part of a period, so that grants leave the
// window one by one; now and then past the period, so that every bucket
// refills.
func step(rng *rand.Rand, now int64, p limiter.Policy, reset, retry time.Duration) int64 {
	intervalUS := int64(p.Period) / p.Limit / 1000
	periodUS := int64(p.Period) / 1000
	ceilUS := func(d time.Duration) int64 { return (int64(d) + 999) / 1000 }
	switch x := rng.IntN(100); {
	case x < 30:
		return now
	case x < 40:
		return now + 1
	case x < 45:
		return now + ceilUS(reset)
	case x < 50:
		return now + max(ceilUS(retry)-rng.Int64N(2), 0)
	case x < 75:
		return now + rng.Int64N(intervalUS+1)
	case x < 97:
		return now + rng.Int64N(periodUS)
	default:
		return now + periodUS + rng.Int64N(periodUS)
	}
}

// testLoweredBounds: a query reads bounds an earlier one lowered to the
// exact counts, and must still find the tenants that rank first. In one
// shard, X took 5 then 2 permits, Y took 2 before X's second grant and Z 2
// after it. Once X's 5 have left the window all three hold 2 and rank by
// their newest grant: Z, X, Y. The first query reads X, whose bound (7) is
// loose, and lowers it to 2; the next ones must read it again before Y.
func testLoweredBounds(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	cfg := policy(10, time.Second, limiter.SlidingLog)
	ts := newTenants(t, c, cfg)
	now := int64(epochUS)
	reg, err := tenant.New(cfg, microClock(&now))
	if err != nil {
		t.Fatal(err)
	}
	take := func(ip string, n, at int64) {
		t.Helper()
		now = at
		got := mustAcquire(t, ts, ip, n, at)
		if want, _ := reg.Acquire(ctx, ip, n); got != want {
			t.Fatalf("Acquire(%q, %d): got %+v, Registry %+v", ip, n, got, want)
		}
	}
	var ips []string // X, Y and Z, in one shard
	for i := 0; len(ips) < 3; i++ {
		ip := fmt.Sprintf("192.0.2.%d", i)
		if key, _, _ := tenant.Key(ip, 64); shardOf(key) == 0 {
			ips = append(ips, ip)
		}
	}
	x, y, z := ips[0], ips[1], ips[2]
	take(x, 5, epochUS)
	take(y, 2, epochUS+500_000)
	take(x, 2, epochUS+600_000)
	take(z, 2, epochUS+700_000)
	now = epochUS + 1_100_000
	for q, k := range []int{1, 2, 1, 3, 2, 1, 3} {
		ts.table.SetWalkBudget(q % 2) // runs of one member, or none beyond k
		got := mustLowest(t, ts, k, now)
		want, _ := reg.Lowest(ctx, k)
		if !slices.Equal(got, want) {
			t.Fatalf("Lowest(%d)\n got %+v\nwant %+v", k, got, want)
		}
	}
	if es := mustLowest(t, ts, 3, now); len(es) != 3 || es[0].Tenant != z || es[1].Tenant != x || es[2].Tenant != y {
		t.Errorf("Lowest(3): got %+v, want %s, %s, %s", es, z, x, y)
	}
}

// testWalkBudget builds the sliding log's worst case on purpose: hundreds
// of tenants in two shards each took a large grant, then a small one, and
// the queries run while the large grants leave the window, so that every
// bound is loose. With budgets of a few members per run, walks run out and
// are sent again, each run saving what it learned; every answer must still
// be the Registry's, and the index must stay sound.
func testWalkBudget(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	var ips []string
	for i := 0; len(ips) < 300; i++ {
		ip := fmt.Sprintf("10.77.%d.%d", i/256, i%256)
		if key, _, _ := tenant.Key(ip, 64); shardOf(key) < 2 {
			ips = append(ips, ip)
		}
	}
	var n tally
	for seed := range uint64(2) {
		rng := rand.New(rand.NewPCG(seed, 99))
		cfg := policy(20, time.Second, limiter.SlidingLog)
		ts := newTenants(t, c, cfg)
		now := int64(epochUS)
		reg, err := tenant.New(cfg, microClock(&now))
		if err != nil {
			t.Fatal(err)
		}
		take := func(ip string, k int64) {
			t.Helper()
			got, err := ts.acquire(ctx, ip, k, us(now))
			want, _ := reg.Acquire(ctx, ip, k)
			if err != nil || got != want {
				t.Fatalf("now %dµs: Acquire(%q, %d)\n got %+v, %v\nwant %+v", now, ip, k, got, err, want)
			}
			n.acquires++
		}
		for _, phase := range []struct{ from, least, most int64 }{{0, 8, 15}, {500_000, 1, 5}} {
			for _, ip := range ips {
				now = epochUS + phase.from + rng.Int64N(400_000)
				// Instants out of order are fine: a log takes its newest.
				take(ip, phase.least+rng.Int64N(phase.most-phase.least+1))
			}
		}
		now = epochUS + 1_000_000
		for range 80 {
			now += rng.Int64N(25_000)
			if rng.IntN(3) == 0 {
				take(ips[rng.IntN(len(ips))], 1+rng.Int64N(3))
			}
			budget := rng.IntN(4)
			ts.table.SetWalkBudget(budget)
			k := 1 + rng.IntN(5)
			if rng.IntN(8) == 0 {
				k = 50
			}
			got := mustLowest(t, ts, k, now)
			want, _ := reg.Lowest(ctx, k)
			if !slices.Equal(got, want) {
				t.Fatalf("now %dµs: Lowest(%d) with budget %d\n got %+v\nwant %+v", now, k, budget, got, want)
			}
			n.lowests++
			n.entries += len(got)
		}
		checkIndex(t, c, ts, now)
		n.sequences++
		n.checks++
		t.Logf("seed %d: %d shard runs sent again", seed, ts.table.Reruns())
		if ts.table.Reruns() == 0 {
			t.Error("no walk ran out of its budget")
		}
	}
	t.Log(n)
}

// microClock is a limiter.Clock that reads *now, in microseconds since the
// Unix epoch.
func microClock(now *int64) *limiter.Clock {
	return limiter.NewClockAt(time.Unix(0, 0), func() time.Duration { return time.Duration(*now) * time.Microsecond })
}
