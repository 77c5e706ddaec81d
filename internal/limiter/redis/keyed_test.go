package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/keystest"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// The keyed limiters' properties drive the table scripts (key_acquire.lua,
// key_available.lua, key_lowest.lua) and decide.lua at explicit instants,
// whole microseconds around the year 2100 (epochUS), so that no key's
// expiry fires during the test, and hold every answer to the reference
// model of a bounded table of keys (keystest.Model) at the same instants
// in nanoseconds. Time never runs backwards: the model forgets full
// buckets for good. The policies' periods are whole microseconds, Redis's
// resolution, so that instants, resets and the order of evictions agree
// to the nanosecond.

// raceBuild reports a test binary built with the race detector, which
// slows every round trip severalfold: the sequences are shortened then.
var raceBuild = func() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}()

// scaled is n steps, or half as many under the race detector.
func scaled(n int) int {
	if raceBuild {
		return n / 2
	}
	return n
}

// keyShapes are keys of every shape a keyed limiter must take as they
// are: prefixes of one another, the separators and hash-tag braces of
// the keys they are stored under, strings Lua would read as numbers or
// patterns, spaces, non-ASCII UTF-8, and keys of MaxKeyLen bytes.
var keyShapes = []string{
	"a", "ab", "abc", "b",
	"user:42", "a:b:{c}:d", "{tag}", "}{", "{", "}", "::",
	"123", "-0", "1e3", "0x10", "nan",
	"%d %s .*", "two words", "ünïcode", "ключ", "鍵🙂", "\u00a0",
	strings.Repeat("k", limiter.MaxKeyLen),
	strings.Repeat("é", limiter.MaxKeyLen/2),
	strings.Repeat("{", limiter.MaxKeyLen/2) + strings.Repeat("}", limiter.MaxKeyLen/2),
	strings.Repeat("鍵", 42) + ":}",
}

// putKeyed defines a keyed limiter through s.
func putKeyed(t testing.TB, s *Store, name, group string, p limiter.Policy, maxKeys int) {
	t.Helper()
	if _, err := s.Put(context.Background(), limiter.Definition{Name: name, Policy: p, Group: group, Keyed: true, MaxKeys: maxKeys}); err != nil {
		t.Fatalf("Put(keyed %q in %q, %+v, max_keys %d): %v", name, group, p, maxKeys, err)
	}
}

// keyedStep moves time forward (never back) the way traffic does: often
// not at all, so that keys tie; by a microsecond; to the instant the last
// decision named for its reset or its retry, or just before; by part of
// an emission interval or of a period, so that grants leave a window one
// by one; now and then past a period, so that every bucket refills.
func keyedStep(rng *rand.Rand, now int64, p limiter.Policy, reset, retry time.Duration) int64 {
	periodUS := int64(p.Period) / 1000
	intervalUS := max(periodUS/p.Limit, 1)
	ceilUS := func(d time.Duration) int64 { return (int64(d) + 999) / 1000 }
	switch x := rng.IntN(100); {
	case x < 20:
		return now
	case x < 30:
		return now + 1
	case x < 38:
		return now + ceilUS(reset)
	case x < 46:
		return now + max(ceilUS(retry)-rng.Int64N(2), 0)
	case x < 70:
		return now + rng.Int64N(intervalUS+1)
	case x < 96:
		return now + rng.Int64N(periodUS)
	default:
		return now + periodUS + rng.Int64N(periodUS)
	}
}

// keyedTally counts what TestKeyedMatchesModel compared and saw.
type keyedTally struct {
	acquires, allowed, availables, lowests, entries int
	keysFull, availFull, evictions                  int
}

func (n keyedTally) String() string {
	return fmt.Sprintf("%d acquisitions (%d allowed, %d keys full, %d evictions), %d availabilities (%d keys full), %d Lowest answers (%d entries) identical",
		n.acquires, n.allowed, n.keysFull, n.evictions, n.availables, n.availFull, n.lowests, n.entries)
}

// TestKeyedMatchesModel holds a keyed limiter of the Redis Store, through
// acquireKey, availableKey and lowest at explicit instants, to the
// reference model of a bounded table of keys at the same instants:
// identical decisions (Allowed, Remaining, Limit, RetryAfter, ResetAfter,
// ExceedsCapacity, KeysFull), availabilities and Lowest answers (keys,
// order and availabilities), for both algorithms, with a bound of keys
// that the keys drawn reach (so that keys are evicted and newcomers are
// denied with KeysFull) and one they never do. The keys are of every
// shape (keyShapes).
func TestKeyedMatchesModel(t *testing.T) {
	for _, k := range keyShapes {
		if err := limiter.CheckKey(k); err != nil {
			t.Fatalf("%q: %v", k, err)
		}
	}
	c := newClient(t, redistest.Standalone(t))
	var total keyedTally
	for _, tc := range []struct {
		p       limiter.Policy
		maxKeys int
	}{
		{limiter.Policy{Limit: 5, Period: time.Second}, 1000},
		{limiter.Policy{Limit: 7, Period: time.Second, Burst: 3}, 4}, // 1/7 s: TATs between microseconds
		{limiter.Policy{Limit: 2, Period: 300 * time.Millisecond}, 3},
		{limiter.Policy{Limit: 4, Period: time.Second, Algorithm: limiter.SlidingLog}, 1000},
		{limiter.Policy{Limit: 3, Period: time.Second, Algorithm: limiter.SlidingLog}, 4},
		{limiter.Policy{Limit: 2, Period: 250 * time.Millisecond, Algorithm: limiter.SlidingLog}, 3},
	} {
		for seed := range uint64(2) {
			name := fmt.Sprintf("%s/limit=%d/max=%d/seed=%d", tc.p.Normalize().Algorithm, tc.p.Limit, tc.maxKeys, seed)
			t.Run(name, func(t *testing.T) {
				n := runKeyedModel(t, c, tc.p, tc.maxKeys, seed, scaled(1500))
				t.Log(n)
				if tc.maxKeys < len(keyShapes) && (n.keysFull == 0 || n.availFull == 0 || n.evictions == 0) {
					t.Errorf("the bound of %d keys was not exercised: %s", tc.maxKeys, n)
				}
				if n.allowed == 0 || n.allowed == n.acquires {
					t.Errorf("the sequence does not exercise both grants and denials: %s", n)
				}
				total.acquires += n.acquires
				total.allowed += n.allowed
				total.availables += n.availables
				total.lowests += n.lowests
				total.entries += n.entries
				total.keysFull += n.keysFull
				total.availFull += n.availFull
				total.evictions += n.evictions
			})
		}
	}
	t.Log(total)
	if total.keysFull == 0 || total.evictions == 0 {
		t.Errorf("no acquisition was denied for keys full, or no key evicted: %s", total)
	}
}

func runKeyedModel(t *testing.T, c rueidis.Client, p limiter.Policy, maxKeys int, seed uint64, steps int) keyedTally {
	ctx := context.Background()
	s := newStore(t, c)
	const name = "per-key"
	putKeyed(t, s, name, "", p, maxKeys)
	m := keystest.NewModel(p, maxKeys)
	p = p.Normalize()
	capacity := keystest.Capacity(p)
	rng := rand.New(rand.NewPCG(seed, uint64(maxKeys)))
	now := epochUS + rng.Int64N(1e12)
	var n keyedTally
	var reset, retry time.Duration
	var history []string
	defer func() {
		if t.Failed() {
			for _, h := range history {
				t.Log(h)
			}
		}
	}()
	record := func(format string, args ...any) {
		history = append(history, fmt.Sprintf(format, args...))
		if len(history) > 30 {
			history = history[1:]
		}
	}
	for i := range steps {
		key := keyShapes[rng.IntN(len(keyShapes))]
		switch x := rng.IntN(100); {
		case x < 12:
			now = keyedStep(rng, now, p, reset, retry)
		case x < 22:
			k := 1 + rng.IntN(len(keyShapes)+2)
			switch rng.IntN(8) {
			case 0:
				k = limiter.MaxLowest
			case 1, 2, 3:
				k = 1 + rng.IntN(3)
			}
			got, err := s.lowest(ctx, name, k, us(now))
			if err != nil {
				t.Fatalf("step %d: Lowest(%d): %v", i, k, err)
			}
			want := m.Lowest(now*1000, k)
			record("%d at %dµs: Lowest(%d) -> %d entries", i, now, k, len(got))
			if len(got) != len(want) {
				t.Fatalf("step %d at %dµs: Lowest(%d)\n got %+v\nwant %+v", i, now, k, got, want)
			}
			for j := range got {
				if got[j].Key != want[j].Key || got[j].Availability != want[j].Availability {
					t.Fatalf("step %d at %dµs: Lowest(%d)[%d]: got %q %+v, want %q %+v", i, now, k, j, got[j].Key, got[j].Availability, want[j].Key, want[j].Availability)
				}
			}
			n.lowests++
			n.entries += len(got)
		case x < 37:
			got, err := s.availableKey(ctx, name, key, us(now))
			av, full := m.Available(key, now*1000)
			record("%d at %dµs: AvailableKey(%q) -> %+v", i, now, key, got)
			if want := (limiter.KeyAvailability{Availability: av, KeysFull: full}); err != nil || got != want {
				t.Fatalf("step %d at %dµs: AvailableKey(%q)\n got %+v, %v\nwant %+v", i, now, key, got, err, want)
			}
			n.availables++
			if full {
				n.availFull++
			}
		default:
			k := 1 + rng.Int64N(capacity)
			if rng.IntN(20) == 0 {
				k = capacity + 1
			}
			// The keys the model holds before: a key it did not hold,
			// granted while it held its bound, evicted one.
			var held map[string]bool
			if maxKeys < len(keyShapes) {
				held = map[string]bool{}
				for _, e := range m.Lowest(now*1000, maxKeys) {
					held[e.Key] = true
				}
			}
			got, err := s.acquireKey(ctx, name, key, k, us(now))
			d, full := m.Acquire(key, now*1000, k)
			record("%d at %dµs: AcquireKey(%q, %d) -> %+v", i, now, key, k, got)
			if want := (limiter.KeyDecision{Decision: d, KeysFull: full}); err != nil || got != want {
				t.Fatalf("step %d at %dµs: AcquireKey(%q, %d)\n got %+v, %v\nwant %+v", i, now, key, k, got, err, want)
			}
			n.acquires++
			switch {
			case d.Allowed:
				n.allowed++
				if held != nil && !held[key] && len(held) == maxKeys {
					n.evictions++
				}
			case full:
				n.keysFull++
			}
			reset = d.ResetAfter
			if d.RetryAfter > 0 {
				retry = d.RetryAfter
			}
		}
	}
	return n
}

// TestKeyedDecideMatchesModel holds random joint decisions at explicit
// instants to the models of keystest.RunJoint.
func TestKeyedDecideMatchesModel(t *testing.T) {
	c := newClient(t, redistest.Standalone(t))
	for _, bounded := range []bool{false, true} {
		for seed := range uint64(4) {
			t.Run(fmt.Sprintf("bounded=%v/seed=%d", bounded, seed), func(t *testing.T) {
				keystest.RunJoint(t, jointStore{newStore(t, c)}, bounded, seed, scaled(1500))
			})
		}
	}
}

// TestReservationsAcrossRedefinitions is keystest.RunReservations on one
// Redis server: reservations settled across replaced, deleted and
// re-created definitions, and after their permits drained or left the
// window, never let a definition grant past its contract.
func TestReservationsAcrossRedefinitions(t *testing.T) {
	c := newClient(t, redistest.Standalone(t))
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		for _, keyed := range []bool{false, true} {
			for seed := range uint64(6) {
				t.Run(fmt.Sprintf("%s/keyed=%v/seed=%d", alg, keyed, seed), func(t *testing.T) {
					keystest.RunReservations(t, jointStore{newStore(t, c)}, alg, keyed, seed, scaled(400))
				})
			}
		}
	}
}

// jointStore is a Store as keystest.RunJoint and RunReservations drive
// it, at explicit instants.
type jointStore struct{ s *Store }

func (j jointStore) Delete(name string) error { return j.s.Delete(context.Background(), name) }

func (j jointStore) Reserve(items []limiter.Item, nowUS int64) (limiter.Verdict, error) {
	return j.s.decideAt(context.Background(), items, call{mode: "take", ttl: time.Hour}, us(nowUS))
}

func (j jointStore) Settle(id string, actual []limiter.Item, nowUS int64) (limiter.Verdict, error) {
	return j.s.settleAt(context.Background(), id, actual, "", us(nowUS))
}

func (j jointStore) Start() int64 { return epochUS }

func (j jointStore) Put(def limiter.Definition) error {
	_, err := j.s.Put(context.Background(), def)
	return err
}

func (j jointStore) Decide(items []limiter.Item, mode limiter.Mode, nowUS int64) (limiter.Verdict, error) {
	return j.s.decideAt(context.Background(), items, call{mode: mode.String()}, us(nowUS))
}

func (j jointStore) Available(name string, nowUS int64) (limiter.Availability, error) {
	return j.s.available(context.Background(), name, us(nowUS))
}

func (j jointStore) AvailableKey(name, key string, nowUS int64) (limiter.KeyAvailability, error) {
	return j.s.availableKey(context.Background(), name, key, us(nowUS))
}

// TestKeyedDecideConcurrent: three replicas (three Stores over one
// prefix), on one Redis server and on a three-master Cluster, make
// concurrent joint Take decisions over a plain limiter and keys of two
// keyed limiters of one group (one of them bounded to exactly the keys
// used), and concurrent AcquireKey calls on keys of keyed limiters in no
// group. Periods are MaxPeriod, so that nothing refills while the test
// runs: at the end what each bucket holds (limit − remaining, through
// AvailableKey, Available and Lowest) must be exactly the permits of the
// allowed calls that named it, so that no denied call took anything and
// no allowed one was lost or taken twice, and never more than the limit.
func TestKeyedDecideConcurrent(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) {
		c := newClient(t, redistest.Standalone(t))
		t.Run("Joint", func(t *testing.T) { testKeyedJointReplicas(t, c) })
		t.Run("PerKey", func(t *testing.T) { testKeyedAcquireReplicas(t, c) })
	})
	t.Run("Cluster", func(t *testing.T) {
		c := newClient(t, redistest.Cluster(t)...)
		if n := len(c.Nodes()); n != 3 {
			t.Fatalf("the client sees %d nodes, want 3", n)
		}
		t.Run("Joint", func(t *testing.T) { testKeyedJointReplicas(t, c) })
		t.Run("PerKey", func(t *testing.T) { testKeyedAcquireReplicas(t, c) })
	})
}

// concurrentWorkers and concurrentCalls are the goroutines of a
// concurrent test, spread over the three replicas, and the calls each
// makes: 2,400 in all.
const concurrentWorkers, concurrentCalls = 24, 100

func testKeyedJointReplicas(t *testing.T, c rueidis.Client) {
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		t.Run(string(alg), func(t *testing.T) {
			ctx := context.Background()
			replicas := newReplicas(t, c, 3)
			const global, userLimit, ipLimit = 100_000, 60, 100
			users := []string{"u1", "user:{2}", "ключ-3", strings.Repeat("u", limiter.MaxKeyLen)}
			ips := []string{"10.0.0.1", "2001:db8::{1}"}
			putIn(t, replicas[0], "global", "g", limiter.Policy{Limit: global, Period: limiter.MaxPeriod})
			putKeyed(t, replicas[1], "per-user", "g", limiter.Policy{Limit: userLimit, Period: limiter.MaxPeriod, Algorithm: alg}, 10_000)
			// Exactly as many keys as are used: none ever needs eviction.
			putKeyed(t, replicas[2], "per-ip", "g", limiter.Policy{Limit: ipLimit, Period: limiter.MaxPeriod, Algorithm: alg}, len(ips))
			var (
				mu               sync.Mutex
				granted          = map[string]int64{}
				deniedBy         = map[string]int{} // checks that did not fit, by limiter
				allowed, refused int
				failed           []error
				wg               sync.WaitGroup
			)
			for w := range concurrentWorkers {
				s := replicas[w%len(replicas)]
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 2))
					for range concurrentCalls {
						// The first user half the time: its key binds
						// early, the IPs' keys later.
						u, ip := users[rng.IntN(len(users))], ips[rng.IntN(len(ips))]
						if rng.IntN(2) == 0 {
							u = users[0]
						}
						items := []limiter.Item{
							{Name: "per-ip", Key: ip, Permits: 1 + rng.Int64N(3)},
							{Name: "global", Permits: 1 + rng.Int64N(2)},
							{Name: "per-user", Key: u, Permits: 1 + rng.Int64N(2)},
						}
						if rng.IntN(4) == 0 {
							// One key named twice: decided on the sum.
							items = append(items, limiter.Item{Name: "per-user", Key: u, Permits: 1})
						}
						rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
						v, err := s.Decide(ctx, items, limiter.Take, "")
						mu.Lock()
						switch {
						case err != nil:
							failed = append(failed, err)
						case v.Allowed:
							allowed++
							for _, it := range items {
								granted[it.Name+"/"+it.Key] += it.Permits
							}
						default:
							refused++
							for _, ch := range v.Checks {
								if !ch.Fits {
									deniedBy[ch.Name]++
								}
							}
						}
						mu.Unlock()
						if err == nil && len(v.Checks) != len(items) {
							t.Errorf("%d checks for %d items", len(v.Checks), len(items))
						}
						if err == nil && !v.Allowed && !func() bool {
							for _, ch := range v.Checks {
								if !ch.Fits {
									return true
								}
							}
							return false
						}() {
							t.Errorf("a denial in which every item fits: %+v", v)
						}
					}
				})
			}
			wg.Wait()
			if len(failed) > 0 {
				t.Fatalf("%d decisions failed, the first: %v", len(failed), failed[0])
			}
			t.Logf("%d decisions allowed, %d denied, across 3 replicas; checks that did not fit: %v", allowed, refused, deniedBy)
			if allowed == 0 || refused == 0 || allowed+refused != concurrentWorkers*concurrentCalls {
				t.Errorf("%d allowed and %d denied of %d: want both", allowed, refused, concurrentWorkers*concurrentCalls)
			}
			if deniedBy["per-user"] == 0 || deniedBy["per-ip"] == 0 {
				t.Errorf("checks that did not fit: %v: want both keyed limiters to bind", deniedBy)
			}
			reader := replicas[1]
			for name, ks := range map[string][]string{"per-user": users, "per-ip": ips} {
				limit := int64(userLimit)
				if name == "per-ip" {
					limit = ipLimit
				}
				for _, k := range ks {
					a, err := reader.AvailableKey(ctx, name, k)
					if err != nil {
						t.Fatal(err)
					}
					if used := limit - a.Remaining; used != granted[name+"/"+k] || used > limit || a.KeysFull {
						t.Errorf("%s/%q: %d taken (%+v), %d granted by allowed decisions (limit %d)", name, k, used, a, granted[name+"/"+k], limit)
					}
				}
				checkLowestTaken(t, replicas[2], name, limit, granted)
			}
			a, err := reader.Available(ctx, "global")
			if err != nil {
				t.Fatal(err)
			}
			if used := global - a.Remaining; used != granted["global/"] {
				t.Errorf("global: %d taken, %d granted by allowed decisions", used, granted["global/"])
			}
		})
	}
}

// checkLowestTaken holds Lowest of the keyed limiter name to granted:
// every key granted anything listed, with what it was granted taken, the
// most taken first.
func checkLowestTaken(t *testing.T, s *Store, name string, limit int64, granted map[string]int64) {
	t.Helper()
	es, err := s.Lowest(context.Background(), name, limiter.MaxLowest)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for k, n := range granted {
		if strings.HasPrefix(k, name+"/") && n > 0 {
			want++
		}
	}
	if len(es) != want {
		t.Errorf("Lowest(%s): %d keys, %d were granted permits: %+v", name, len(es), want, es)
	}
	for i, e := range es {
		if used := limit - e.Remaining; used != granted[name+"/"+e.Key] {
			t.Errorf("Lowest(%s)[%d] %q: %d taken, %d granted", name, i, e.Key, used, granted[name+"/"+e.Key])
		}
		if i > 0 && e.Remaining < es[i-1].Remaining {
			t.Errorf("Lowest(%s): %q with %d left after %q with %d", name, e.Key, e.Remaining, es[i-1].Key, es[i-1].Remaining)
		}
	}
}

// testKeyedAcquireReplicas: concurrent AcquireKey on keys of two keyed
// limiters in no group (one per algorithm, bounded to exactly the keys
// used) through three replicas: per key, the grants never exceed the
// limit and add up exactly to what the bucket holds.
func testKeyedAcquireReplicas(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	replicas := newReplicas(t, c, 3)
	const limit = 50
	keys := []string{"{a}", "ключ:1", "b", strings.Repeat("鍵", 42) + ":}"}
	names := []string{"pk-gcra", "pk-log"}
	putKeyed(t, replicas[0], names[0], "", limiter.Policy{Limit: limit, Period: limiter.MaxPeriod}, len(keys))
	putKeyed(t, replicas[1], names[1], "", limiter.Policy{Limit: limit, Period: limiter.MaxPeriod, Algorithm: limiter.SlidingLog}, len(keys))
	var (
		mu               sync.Mutex
		granted          = map[string]int64{}
		allowed, refused int
		failed           []error
		wg               sync.WaitGroup
	)
	for w := range concurrentWorkers {
		s := replicas[w%len(replicas)]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for range concurrentCalls {
				name, key, n := names[rng.IntN(len(names))], keys[rng.IntN(len(keys))], 1+rng.Int64N(3)
				d, err := s.AcquireKey(ctx, name, key, n)
				mu.Lock()
				switch {
				case err != nil:
					failed = append(failed, err)
				case d.Allowed:
					allowed++
					granted[name+"/"+key] += n
				default:
					refused++
					if d.KeysFull {
						failed = append(failed, fmt.Errorf("%s/%q: denied for keys full with every key remembered: %+v", name, key, d))
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d acquisitions failed, the first: %v", len(failed), failed[0])
	}
	t.Logf("%d acquisitions allowed, %d denied, across 3 replicas", allowed, refused)
	if allowed == 0 || refused == 0 {
		t.Errorf("%d allowed and %d denied: want both", allowed, refused)
	}
	for _, name := range names {
		for _, k := range keys {
			a, err := replicas[2].AvailableKey(ctx, name, k)
			if err != nil {
				t.Fatal(err)
			}
			if used := limit - a.Remaining; used != granted[name+"/"+k] || used > limit {
				t.Errorf("%s/%q: %d taken (%+v), %d granted (limit %d)", name, k, used, a, granted[name+"/"+k], limit)
			}
		}
		checkLowestTaken(t, replicas[0], name, limit, granted)
	}
}

// TestKeyedSettlementWithoutRoom: a settlement that must charge a key its
// limiter has since forgotten, while the limiter holds max_keys limited
// keys, settles nothing and keeps the reservation; once room can be made
// it settles, as on the memory backend.
func TestKeyedSettlementWithoutRoom(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, newClient(t, redistest.Standalone(t)))
	putKeyed(t, s, "tokens", "", limiter.Policy{Limit: 2, Period: time.Second}, 1)
	now := int64(epochUS)
	v, err := s.decideAt(ctx, []limiter.Item{{Name: "tokens", Key: "a", Permits: 1}}, call{mode: "take", ttl: time.Minute, reservation: limiter.NewReservationID("k:tokens\x00a")}, us(now))
	if err != nil || !v.Allowed || v.Reservation == "" {
		t.Fatalf("reserve: %+v, %v", v, err)
	}
	id := v.Reservation
	now += 1_000_000 // a's bucket is full again: forgotten
	if d, err := s.acquireKey(ctx, "tokens", "b", 2, us(now)); err != nil || !d.Allowed {
		t.Fatalf("b takes the one room: %+v, %v", d, err)
	}
	settle := []limiter.Item{{Name: "tokens", Key: "a", Permits: 2}}
	v, err = s.settleAt(ctx, id, settle, "", us(now))
	if err != nil || v.Allowed || !v.Checks[0].KeysFull || v.Checks[0].RetryAfter != 500*time.Millisecond {
		t.Fatalf("settle charging a forgotten key with no room: %+v, %v, want keys full for 500ms", v, err)
	}
	now += 500_000 // b regains a permit: it can be evicted
	v, err = s.settleAt(ctx, id, settle, "", us(now))
	if err != nil || !v.Allowed || v.Checks[0].Remaining != 1 {
		t.Fatalf("settle once b has a permit: %+v, %v, want the charge of 1 made, 1 left", v, err)
	}
	if _, err := s.settleAt(ctx, id, settle, "", us(now)); !errors.Is(err, limiter.ErrReservationNotFound) {
		t.Errorf("settle again: %v, want ErrReservationNotFound", err)
	}
}
