package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/keystest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// TestKeyedDecideMatchesModel holds random joint decisions to the models
// of keystest.RunJoint, the clock moved to each instant it chooses.
func TestKeyedDecideMatchesModel(t *testing.T) {
	for _, bounded := range []bool{false, true} {
		for seed := range uint64(6) {
			t.Run(fmt.Sprintf("bounded=%v/seed=%d", bounded, seed), func(t *testing.T) {
				s, c := newStore(t)
				keystest.RunJoint(t, &jointStore{s: s, c: c}, bounded, seed, 3000)
			})
		}
	}
}

// TestReservationsAcrossRedefinitions settles reservations across
// replaced, deleted and re-created definitions, and after their permits
// drained or left the window, and holds each definition's grants to its
// contract (keystest.RunReservations).
func TestReservationsAcrossRedefinitions(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		for _, keyed := range []bool{false, true} {
			for seed := range uint64(50) {
				t.Run(fmt.Sprintf("%s/keyed=%v/seed=%d", alg, keyed, seed), func(t *testing.T) {
					s, c := newStore(t)
					keystest.RunReservations(t, &jointStore{s: s, c: c}, alg, keyed, seed, 400)
				})
			}
		}
	}
}

// jointStore is a Store as keystest.RunJoint and RunReservations drive
// it: its clock is advanced to each instant asked for.
type jointStore struct {
	s *memory.Store
	c *clocktest.Clock
}

func (j *jointStore) Start() int64 { return limiter.Nanos(j.c.Wall())/1000 + 1 }

// at moves the clock to nowUS, which is never earlier than it.
func (j *jointStore) at(nowUS int64) {
	j.c.Advance(time.Duration(nowUS*1000 - limiter.Nanos(j.c.Wall())))
}

func (j *jointStore) Put(def limiter.Definition) error {
	_, err := j.s.Put(context.Background(), def)
	return err
}

func (j *jointStore) Decide(items []limiter.Item, mode limiter.Mode, nowUS int64) (limiter.Verdict, error) {
	j.at(nowUS)
	return j.s.Decide(context.Background(), items, mode, "")
}

func (j *jointStore) Delete(name string) error { return j.s.Delete(context.Background(), name) }

func (j *jointStore) Reserve(items []limiter.Item, nowUS int64) (limiter.Verdict, error) {
	j.at(nowUS)
	return j.s.Reserve(context.Background(), items, time.Hour, "")
}

func (j *jointStore) Settle(id string, actual []limiter.Item, nowUS int64) (limiter.Verdict, error) {
	j.at(nowUS)
	return j.s.Settle(context.Background(), id, actual, "")
}

func (j *jointStore) Available(name string, nowUS int64) (limiter.Availability, error) {
	j.at(nowUS)
	return j.s.Available(context.Background(), name)
}

func (j *jointStore) AvailableKey(name, key string, nowUS int64) (limiter.KeyAvailability, error) {
	j.at(nowUS)
	return j.s.AvailableKey(context.Background(), name, key)
}

// TestKeyedDecideConcurrent runs joint decisions over a plain limiter and
// keys of two keyed limiters from many goroutines, in every order (keys of
// one limiter share shards, and both limiters' shards are locked in one
// decision), and checks that what each bucket holds is exactly what
// the allowed decisions took: nothing over a limit, nothing taken by a
// denied decision. Periods are long enough that nothing refills.
func TestKeyedDecideConcurrent(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	const limit = 150
	p := limiter.Policy{Limit: limit, Period: 8784 * time.Hour, Algorithm: limiter.SlidingLog}
	putDef(t, s, limiter.Definition{Name: "global", Policy: limiter.Policy{Limit: 100_000, Period: 8784 * time.Hour}, Group: "g"})
	putDef(t, s, limiter.Definition{Name: "per-user", Policy: p, Group: "g", Keyed: true, MaxKeys: 100_000}) // 64 shards
	putDef(t, s, limiter.Definition{Name: "per-ip", Policy: p, Group: "g", Keyed: true, MaxKeys: 1000})
	users, ips := []string{"u1", "u2", "u3"}, []string{"10.0.0.1", "10.0.0.2"}
	var (
		mu      sync.Mutex
		granted = map[string]int64{}
		wg      sync.WaitGroup
	)
	for w := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 300 {
				u, ip := users[rng.IntN(len(users))], ips[rng.IntN(len(ips))]
				items := []limiter.Item{{Name: "per-ip", Key: ip, Permits: 1}, {Name: "global", Permits: 1}, {Name: "per-user", Key: u, Permits: 1}}
				rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
				v, err := s.Decide(ctx, items, limiter.Take, "")
				if err != nil {
					t.Error(err)
					return
				}
				if v.Allowed {
					mu.Lock()
					granted["per-user/"+u]++
					granted["per-ip/"+ip]++
					granted["global"]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, u := range users {
		a, _ := s.AvailableKey(ctx, "per-user", u)
		if used := limit - a.Remaining; used != granted["per-user/"+u] {
			t.Errorf("per-user/%s: %d taken, %d granted by allowed decisions", u, used, granted["per-user/"+u])
		}
	}
	for _, ip := range ips {
		a, _ := s.AvailableKey(ctx, "per-ip", ip)
		if used := limit - a.Remaining; used != granted["per-ip/"+ip] || used > limit {
			t.Errorf("per-ip/%s: %d taken, %d granted by allowed decisions (limit %d)", ip, used, granted["per-ip/"+ip], limit)
		}
	}
	a, _ := s.Available(ctx, "global")
	if used := 100_000 - a.Remaining; used != granted["global"] {
		t.Errorf("global: %d taken, %d granted", used, granted["global"])
	}
	if granted["global"] != 2*limit {
		t.Errorf("%d decisions allowed, want %d: the two IPs' limits bind first", granted["global"], 2*limit)
	}
}

// TestDecideOneMatchesJoint holds the single-item path of Decide (an item
// taken without an idempotency key) to the joint path, on two stores under
// one clock: the item {L, K, n} on one, and {L, K, n-1} with {L, K, 1},
// which the joint path folds into the same n, on the other. Both must
// answer the same and keep the same state, for plain and keyed limiters
// of both algorithms, permits above capacity, and key tables at their
// bound.
func TestDecideOneMatchesJoint(t *testing.T) {
	ctx := context.Background()
	c := clocktest.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	one, joint := memory.New(c.Limiter(), 0), memory.New(c.Limiter(), 0)
	defs := []limiter.Definition{
		{Name: "plain-gcra", Policy: limiter.Policy{Limit: 5, Period: time.Second, Burst: 3}},
		{Name: "plain-log", Policy: limiter.Policy{Limit: 4, Period: time.Second, Algorithm: limiter.SlidingLog}},
		{Name: "keyed-gcra", Policy: limiter.Policy{Limit: 3, Period: time.Second}, Keyed: true, MaxKeys: 2},
		{Name: "keyed-log", Policy: limiter.Policy{Limit: 3, Period: time.Second, Algorithm: limiter.SlidingLog}, Keyed: true, MaxKeys: 2},
	}
	for _, d := range defs {
		putDef(t, one, d)
		putDef(t, joint, d)
	}
	keys := []string{"a", "b", "c", "d"}
	rng := rand.New(rand.NewPCG(7, 11))
	var allowed, denied, exceeds, full int
	for step := range 20_000 {
		if rng.IntN(4) == 0 {
			c.Advance(time.Duration(rng.Int64N(int64(400 * time.Millisecond))))
		}
		d := defs[rng.IntN(len(defs))]
		it := limiter.Item{Name: d.Name, Permits: 2 + rng.Int64N(keystest.Capacity(d.Policy)+1)}
		if d.Keyed {
			it.Key = keys[rng.IntN(len(keys))]
		}
		got, err := one.Decide(ctx, []limiter.Item{it}, limiter.Take, "")
		if err != nil {
			t.Fatal(err)
		}
		a, b := it, it
		a.Permits, b.Permits = it.Permits-1, 1
		want, err := joint.Decide(ctx, []limiter.Item{a, b}, limiter.Take, "")
		if err != nil {
			t.Fatal(err)
		}
		// The joint answer has a check per item; both hold the state of
		// the one (limiter, key), with each item's own permits.
		want.Checks = want.Checks[:1]
		want.Checks[0].Permits = it.Permits
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("step %d, %+v:\n single item %+v\n joint       %+v", step, it, got, want)
		}
		switch c := got.Checks[0]; {
		case got.Allowed:
			allowed++
		case c.KeysFull:
			full++
		case c.ExceedsCapacity:
			exceeds++
		default:
			denied++
		}
	}
	for _, d := range defs {
		for _, k := range keys {
			var x, y any
			if d.Keyed {
				x, _ = one.AvailableKey(ctx, d.Name, k)
				y, _ = joint.AvailableKey(ctx, d.Name, k)
			} else {
				x, _ = one.Available(ctx, d.Name)
				y, _ = joint.Available(ctx, d.Name)
			}
			if fmt.Sprint(x) != fmt.Sprint(y) {
				t.Errorf("%s/%s: %+v after single items, %+v after joint ones", d.Name, k, x, y)
			}
		}
	}
	// Every kind of answer was compared.
	if allowed == 0 || denied == 0 || exceeds == 0 || full == 0 {
		t.Errorf("answers: %d allowed, %d denied, %d above capacity, %d with the keys full; want each", allowed, denied, exceeds, full)
	}
}

// TestKeyedDecideChurn: decisions naming keys of three bounded tables (two
// GCRA, one sliding log), far more keys than the tables hold and a limit
// nobody reaches, from many goroutines at once, as the benchmark harness's
// random-key gRPC runs send them. Every key can be evicted, so room can
// always be made, and every decision must be allowed: the room made for a
// key stays that key's until it is decided, and a newcomer keeps looking
// while other newcomers take the key it would evict.
func TestKeyedDecideChurn(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	gcra := limiter.Policy{Limit: limiter.MaxLimit, Period: time.Second}
	log := limiter.Policy{Limit: limiter.MaxLimit, Period: time.Millisecond, Algorithm: limiter.SlidingLog}
	for name, p := range map[string]limiter.Policy{"a": gcra, "b": gcra, "c": log} {
		putDef(t, s, limiter.Definition{Name: name, Policy: p, Group: "g", Keyed: true, MaxKeys: 1000})
	}
	perWorker := 400
	if raceOn {
		perWorker = 60
	}
	var wg sync.WaitGroup
	var denied atomic.Int64
	for w := range 32 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for range perWorker {
				k := fmt.Sprint(rng.IntN(100_000))
				items := []limiter.Item{{Name: "a", Key: k, Permits: 1}, {Name: "b", Key: k, Permits: 1}, {Name: "c", Key: k, Permits: 1}}
				v, err := s.Decide(ctx, items, limiter.Take, "")
				if err != nil {
					t.Error(err)
					return
				}
				if !v.Allowed {
					if denied.Add(1) == 1 {
						t.Errorf("denied: %+v", v)
					}
				}
			}
		})
	}
	wg.Wait()
	if n := denied.Load(); n > 0 {
		t.Errorf("%d of %d decisions denied", n, 32*perWorker)
	}
}
