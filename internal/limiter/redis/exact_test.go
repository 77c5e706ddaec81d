package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The exactness properties drive the scripts with explicit instants and the
// Go algorithms (limiter.Rate, limiter.Log) with the same instants in
// nanoseconds, and require identical decisions, availabilities and states
// at every step. The instants are whole microseconds, Redis's resolution,
// around the year 2100: far from the test's real time, so that the keys'
// expiry (an absolute instant) never fires during the test.

// epochUS is 2100-01-01T00:00:00Z in microseconds.
const epochUS = 4_102_444_800_000_000

// counts tallies what a property test compared, for the log.
type counts struct{ policies, acquires, availables, states int }

func (n counts) String() string {
	return fmt.Sprintf("%d policies, %d acquisitions, %d availabilities, %d states compared", n.policies, n.acquires, n.availables, n.states)
}

// gcraPolicies are the policies at and around the bounds, then random ones.
func gcraPolicies(rng *rand.Rand, random int) []limiter.Policy {
	limits := []int64{1, 2, 3, 7, 999, 1000, 1001, 4097, 999_999_937, limiter.MaxLimit}
	periods := []time.Duration{
		limiter.MinPeriod, limiter.MinPeriod + 1, 1_000_003, time.Second + 999, time.Hour,
		limiter.MaxPeriod - 1, limiter.MaxPeriod,
	}
	var ps []limiter.Policy
	for _, l := range limits {
		for _, p := range periods {
			for _, b := range []int64{1, l, 1 + rng.Int64N(l)} {
				ps = append(ps, limiter.Policy{Limit: l, Period: p, Burst: b})
			}
		}
	}
	for range random {
		l := randLimit(rng)
		ps = append(ps, limiter.Policy{Limit: l, Period: randPeriod(rng), Burst: 1 + rng.Int64N(l)})
	}
	return ps
}

// randLimit is log-uniform over [1, MaxLimit], so that small limits are as
// likely as large ones.
func randLimit(rng *rand.Rand) int64 {
	return min(int64(1)<<rng.IntN(30)+rng.Int64N(int64(1)<<rng.IntN(30)), limiter.MaxLimit)
}

// randPeriod is log-uniform over [MinPeriod, MaxPeriod], whole
// microseconds or not.
func randPeriod(rng *rand.Rand) time.Duration {
	p := int64(limiter.MinPeriod) + rng.Int64N(int64(1)<<(20+rng.IntN(35)))
	if rng.IntN(2) == 0 {
		p -= p % 1000
	}
	return time.Duration(min(p, int64(limiter.MaxPeriod)))
}

// nextNow moves the instant the way traffic does: not at all, by one
// microsecond, to the instant a denial named (and just before it), by an
// emission interval or a period, at random, and now and then backwards.
func nextNow(rng *rand.Rand, now int64, p limiter.Policy, retry time.Duration) int64 {
	interval := max(int64(p.Period)/p.Limit/1000, 1)
	periodUS := (int64(p.Period) + 999) / 1000
	retryUS := (int64(retry) + 999) / 1000
	switch rng.IntN(10) {
	case 0:
		return now
	case 1:
		return now + 1
	case 2:
		return now + retryUS
	case 3:
		return now + max(retryUS-1, 0)
	case 4:
		return now + interval*(1+rng.Int64N(3))
	case 5:
		return now + periodUS + rng.Int64N(3) - 1
	case 6:
		return now - rng.Int64N(interval+1)
	case 7:
		return now + rng.Int64N(interval+1)
	default:
		return now + rng.Int64N(periodUS+1)
	}
}

// randPermits picks a permit count at the edges of the capacity, or at
// random.
func randPermits(rng *rand.Rand, capacity int64) int64 {
	switch rng.IntN(6) {
	case 0:
		return 1
	case 1:
		return capacity
	case 2:
		return min(capacity+1, limiter.MaxLimit)
	case 3:
		return 1 + rng.Int64N(limiter.MaxLimit)
	default:
		return 1 + rng.Int64N(capacity)
	}
}

func us(now int64) string { return strconv.FormatInt(now, 10) }

// groupPermits is the permits of one script run: usually one acquisition,
// as Acquire sends alone; sometimes up to 6, as a group of concurrent
// acquisitions or a batch's run is sent, decided at one instant.
func groupPermits(rng *rand.Rand, capacity int64) []int64 {
	ks := make([]int64, 1, 6)
	ks[0] = randPermits(rng, capacity)
	if rng.IntN(3) == 0 {
		for range 1 + rng.IntN(5) {
			ks = append(ks, randPermits(rng, capacity))
		}
	}
	return ks
}

// decideGroup takes each of ks from the limiter name, in order, in one run
// of the acquire script at now microseconds.
func decideGroup(t *testing.T, s *Store, name string, ks []int64, now int64) []limiter.Result {
	t.Helper()
	out := make([]limiter.Result, len(ks))
	s.decide(context.Background(), name, ks, us(now), out)
	return out
}

func testGCRAMatchesGo(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	rng := rand.New(rand.NewPCG(7, 11))
	steps := 40
	var n counts
	for i, p := range gcraPolicies(rng, 300) {
		p = p.Normalize()
		name := fmt.Sprintf("g%d", i)
		put(t, s, name, p)
		n.policies++
		r := limiter.NewRate(p)
		var tat limiter.TAT
		now := epochUS + rng.Int64N(1e12)
		var retry time.Duration
		for step := range steps {
			where := fmt.Sprintf("policy %+v, step %d, now %dµs", p, step, now)
			if rng.IntN(4) == 0 {
				got, err := s.available(ctx, name, us(now))
				if want := r.Available(tat, now*1000); err != nil || got != want {
					t.Fatalf("%s: Available: got %+v, %v, Go gives %+v", where, got, err, want)
				}
				n.availables++
			} else {
				ks := groupPermits(rng, p.Burst)
				for i, got := range decideGroup(t, s, name, ks, now) {
					var want limiter.Decision
					tat, want = r.Acquire(tat, now*1000, ks[i])
					if got.Err != nil || got.Decision != want {
						t.Fatalf("%s: Acquire(%d), %d of the group %v: got %+v, Go gives %+v", where, ks[i], i, ks, got, want)
					}
					n.acquires++
					if !want.Allowed && !want.ExceedsCapacity {
						retry = want.RetryAfter
					}
				}
				if st := gcraState(t, c, s, name, p); st != tat {
					t.Fatalf("%s: after Acquire%v: stored TAT %+v, Go's %+v", where, ks, st, tat)
				}
				n.states++
			}
			now = nextNow(rng, now, p, retry)
		}
	}
	t.Log(n)
}

// gcraState reads the stored TAT ("µs units", units of 1/limit ns below
// the microsecond) as a limiter.TAT.
func gcraState(t *testing.T, c rueidis.Client, s *Store, name string, p limiter.Policy) limiter.TAT {
	t.Helper()
	v, err := c.Do(context.Background(), c.B().Get().Key(s.stateKey(name)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return limiter.TAT{}
	}
	if err != nil {
		t.Fatalf("GET state: %v", err)
	}
	a, b, ok := strings.Cut(v, " ")
	tatUS, err1 := strconv.ParseInt(a, 10, 64)
	units, err2 := strconv.ParseInt(b, 10, 64)
	if !ok || err1 != nil || err2 != nil || units < 0 || units >= 1000*p.Limit {
		t.Fatalf("malformed state %q", v)
	}
	return limiter.TAT{NS: tatUS*1000 + units/p.Limit, Frac: uint32(units % p.Limit)}
}

func logPolicies(rng *rand.Rand, random int) []limiter.Policy {
	limits := []int64{1, 2, 5, 100, 4096, 4097, 999_999_937, limiter.MaxLimit}
	periods := []time.Duration{limiter.MinPeriod, limiter.MinPeriod + 1, 1_000_003, time.Second + 999, time.Hour, limiter.MaxPeriod - 1, limiter.MaxPeriod}
	var ps []limiter.Policy
	for _, l := range limits {
		for _, p := range periods {
			ps = append(ps, limiter.Policy{Limit: l, Period: p, Algorithm: limiter.SlidingLog})
		}
	}
	for range random {
		ps = append(ps, limiter.Policy{Limit: randLimit(rng), Period: randPeriod(rng), Algorithm: limiter.SlidingLog})
	}
	return ps
}

func testSlidingLogMatchesGo(t *testing.T, c rueidis.Client) {
	rng := rand.New(rand.NewPCG(13, 17))
	var n counts
	for i, p := range logPolicies(rng, 150) {
		runLog(t, c, fmt.Sprintf("s%d", i), p, rng, 60, &n)
	}
	t.Log(n)
}

// runLog drives one sliding log in Redis and in Go for the given number of
// steps and compares every answer and the number of entries.
func runLog(t *testing.T, c rueidis.Client, name string, p limiter.Policy, rng *rand.Rand, steps int, n *counts) {
	t.Helper()
	ctx := context.Background()
	s := newStore(t, c)
	put(t, s, name, p)
	n.policies++
	w := limiter.NewWindow(p)
	var log limiter.Log
	now := epochUS + rng.Int64N(1e12)
	var retry time.Duration
	// Go's Log.Available forgets the grants that have left the window,
	// while the read-only script leaves them to the next acquisition: the
	// two differ only if time then runs back to before they had left. Time
	// runs back here, but never to before an Available.
	var floor int64
	for step := range steps {
		where := fmt.Sprintf("policy %+v, step %d, now %dµs", p, step, now)
		if rng.IntN(4) == 0 {
			floor = now
			got, err := s.available(ctx, name, us(now))
			if want := log.Available(w, now*1000); err != nil || got != want {
				t.Fatalf("%s: Available: got %+v, %v, Go gives %+v", where, got, err, want)
			}
			n.availables++
		} else {
			ks := groupPermits(rng, p.Limit)
			if rng.IntN(3) == 0 {
				ks = []int64{1 + rng.Int64N(min(p.Limit, 3))} // many small grants: many entries
			}
			for i, got := range decideGroup(t, s, name, ks, now) {
				want := log.Acquire(w, now*1000, ks[i])
				if got.Err != nil || got.Decision != want {
					t.Fatalf("%s: Acquire(%d), %d of the group %v: got %+v, Go gives %+v", where, ks[i], i, ks, got, want)
				}
				n.acquires++
				if !want.Allowed && !want.ExceedsCapacity {
					retry = want.RetryAfter
				}
			}
			if entries := logEntries(t, c, s, name); entries != log.Len() {
				t.Fatalf("%s: after Acquire%v: %d entries stored, Go holds %d", where, ks, entries, log.Len())
			}
			n.states++
		}
		now = max(nextNow(rng, now, p, retry), floor)
	}
}

// logEntries is the number of grant entries of a stored sliding log.
func logEntries(t *testing.T, c rueidis.Client, s *Store, name string) int {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Zcard().Key(s.stateKey(name)).Build()).AsInt64()
	if err != nil {
		t.Fatalf("ZCARD state: %v", err)
	}
	return int(max(n-1, 0)) // all but the running total's base
}

// testSlidingLogMerges fills a log past MaxLogEntries with grants at
// distinct instants, so that both implementations merge their oldest
// entries, then lets time pass through the merged region.
func testSlidingLogMerges(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	p := limiter.Policy{Limit: 10_000, Period: time.Second, Algorithm: limiter.SlidingLog}
	s := newStore(t, c)
	put(t, s, "m", p)
	w := limiter.NewWindow(p)
	var log limiter.Log
	now := int64(epochUS)
	check := func(k int64) {
		t.Helper()
		got, err := s.acquire(ctx, "m", k, us(now))
		if want := log.Acquire(w, now*1000, k); err != nil || got != want {
			t.Fatalf("now %dµs: Acquire(%d): got %+v, %v, Go gives %+v", now, k, got, err, want)
		}
	}
	for i := range limiter.MaxLogEntries + 500 {
		check(1 + int64(i%2))
		now += 100
	}
	if got, want := logEntries(t, c, s, "m"), log.Len(); got != want || want != limiter.MaxLogEntries {
		t.Fatalf("entries: got %d, Go %d, want %d", got, want, limiter.MaxLogEntries)
	}
	// The first 500 grants were merged into the entry at +50ms. Jump to
	// where it and the 300 entries after it have left the window (many
	// script batches at once), then walk on through the window's end.
	now = epochUS + int64(p.Period/time.Microsecond) + 80_000
	check(1)
	for i := range 300 {
		now += 1000 + int64(i%7)*300
		check(1000)
		check(1)
	}
	if got, want := logEntries(t, c, s, "m"), log.Len(); got != want {
		t.Fatalf("entries: got %d, Go %d", got, want)
	}
}

// testSlidingLogRebase moves a log's running totals close to where the
// script rebases them, and checks that the answers do not change.
func testSlidingLogRebase(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	p := limiter.Policy{Limit: 50, Period: time.Second, Algorithm: limiter.SlidingLog}
	s := newStore(t, c)
	put(t, s, "r", p)
	w := limiter.NewWindow(p)
	var log limiter.Log
	rng := rand.New(rand.NewPCG(3, 5))
	now := int64(epochUS)
	key := s.stateKey("r")
	shift := rueidis.NewLuaScript(`
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  redis.call('ZINCRBY', KEYS[1], ARGV[1], m)
end
return 0`)
	base := func() (float64, bool) {
		t.Helper()
		b, err := c.Do(ctx, c.B().Zscore().Key(key).Member("b").Build()).AsFloat64()
		if rueidis.IsRedisNil(err) {
			return 0, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return b, true
	}
	rebased := 0
	for round := range 20 {
		// Shift every running total, the base included, to about 2^40:
		// just below, where nothing changes, or just above, where the next
		// grant rebases them.
		above := false
		if b, ok := base(); ok {
			delta := fmt.Sprintf("%.0f", float64(int64(1)<<40)-b-100+float64(rng.Int64N(200)))
			if err := shift.Exec(ctx, c, []string{key}, []string{delta}).Error(); err != nil {
				t.Fatal(err)
			}
			shifted, _ := base()
			above = shifted >= 1<<40
		}
		for range 20 {
			k := 1 + rng.Int64N(10)
			got, err := s.acquire(ctx, "r", k, us(now))
			if want := log.Acquire(w, now*1000, k); err != nil || got != want {
				t.Fatalf("round %d, now %dµs: Acquire(%d): got %+v, %v, Go gives %+v", round, now, k, got, err, want)
			}
			now += rng.Int64N(100_000)
		}
		if b, ok := base(); above && ok && b < 1<<40 {
			rebased++
		}
	}
	if rebased == 0 {
		t.Error("no round rebased the running totals")
	}
	t.Logf("%d of 20 rounds rebased", rebased)
}
