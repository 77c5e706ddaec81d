package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
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

// jointStore is a Store as keystest.RunJoint drives it: its clock is
// advanced to each instant asked for.
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
