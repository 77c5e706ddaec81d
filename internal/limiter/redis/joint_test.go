package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// newReplicas returns n Stores over one new prefix, as n replicas of the
// service see one Redis.
func newReplicas(t testing.TB, c rueidis.Client, n int) []*Store {
	t.Helper()
	prefix := fmt.Sprintf("t%d:", prefixes.Add(1))
	replicas := make([]*Store, n)
	for i := range replicas {
		s, err := New(c, prefix, 0)
		if err != nil {
			t.Fatal(err)
		}
		replicas[i] = s
	}
	return replicas
}

func putIn(t testing.TB, s *Store, name, group string, p limiter.Policy) {
	t.Helper()
	if _, err := s.Put(context.Background(), limiter.Definition{Name: name, Policy: p, Group: group}); err != nil {
		t.Fatalf("Put(%q in %q, %+v): %v", name, group, p, err)
	}
}

// testDecideMatchesGo drives joint decisions, charges and refunds on
// groups of two to four limiters (both algorithms, policies at the bounds
// and at random) in Redis at explicit instants, and the same calls on
// in-process limiters with limiter.DecideAll at the same instants, and
// requires identical checks at every step: the script takes all or
// nothing, charges and refunds exactly as the Go code does, whose own
// property test holds it to the brute-force model.
func testDecideMatchesGo(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	rng := rand.New(rand.NewPCG(19, 23))
	pool := append(gcraPolicies(rng, 40), logPolicies(rng, 40)...)
	groups, steps := 60, 40
	var decisions, checks int
	for gi := range groups {
		group := fmt.Sprintf("jg%d", gi)
		k := 2 + rng.IntN(3)
		names := make([]string, k)
		ls := make([]*limiter.Limiter, k)
		ps := make([]limiter.Policy, k)
		for j := range k {
			ps[j] = pool[rng.IntN(len(pool))].Normalize()
			names[j] = fmt.Sprintf("%s-%d", group, j)
			putIn(t, s, names[j], group, ps[j])
			l, err := limiter.New(ps[j])
			if err != nil {
				t.Fatal(err)
			}
			ls[j] = l
		}
		now := epochUS + rng.Int64N(1e12)
		var retry time.Duration
		for step := range steps {
			n := 1 + rng.IntN(5)
			items := make([]limiter.Item, n)
			for i := range items {
				j := rng.IntN(k)
				capacity := ps[j].Limit
				if ps[j].Algorithm == limiter.GCRA {
					capacity = ps[j].Burst
				}
				items[i] = limiter.Item{Name: names[j], Permits: randPermits(rng, max(capacity/int64(n), 1))}
			}
			mode := limiter.Take
			switch r := rng.IntN(8); {
			case r < 2:
				mode = limiter.Peek
			case r < 3:
				mode = limiter.Charge
			case r < 4:
				mode = limiter.Refund
			}
			got, err := s.decideAt(ctx, items, call{mode: mode.String()}, us(now))
			if err != nil {
				t.Fatalf("group %s step %d: Decide(%+v): %v", group, step, items, err)
			}
			dnames, totals, index := limiter.Totals(items)
			dls := make([]*limiter.Limiter, len(dnames))
			for d, name := range dnames {
				for j := range names {
					if names[j] == name {
						dls[d] = ls[j]
					}
				}
			}
			want := limiter.NewVerdict(items, limiter.DecideAll(now*1000, dls, totals, mode), index)
			if got.Allowed != want.Allowed || got.ExceedsCapacity != want.ExceedsCapacity || got.RetryAfter != want.RetryAfter {
				t.Fatalf("group %s step %d at %dµs: Decide(%+v, mode %d): got %+v, Go gives %+v", group, step, now, items, mode, got, want)
			}
			for i := range want.Checks {
				if got.Checks[i] != want.Checks[i] {
					t.Fatalf("group %s step %d at %dµs: Decide(%+v, mode %d): check %d: got %+v, Go gives %+v", group, step, now, items, mode, i, got.Checks[i], want.Checks[i])
				}
				checks++
			}
			decisions++
			if !want.Allowed && !want.ExceedsCapacity {
				retry = want.RetryAfter
			}
			now = nextNow(rng, now, ps[rng.IntN(k)], retry)
		}
	}
	t.Logf("%d groups, %d joint decisions, %d checks compared", groups, decisions, checks)
}

// testDecideReplicas: three replicas (three Stores over one prefix) make
// 2,000 concurrent joint decisions, each asking 1, 2 and 3 permits of
// three limiters of one group whose limits are 500, 700 and 3,000 per
// MaxPeriod, so that a bucket regains a permit every few hours at most and
// nothing refills while the test runs.
// Whatever the order, a sequential model admits exactly 350 of them (the
// second limiter binds) and takes 350, 700 and 1,050 permits: any permit
// taken by a denied decision, or any decision admitted over a limit, shows.
func testDecideReplicas(t *testing.T, c rueidis.Client) {
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		t.Run(string(alg), func(t *testing.T) {
			replicas := newReplicas(t, c, 3)
			limits := []int64{500, 700, 3000}
			names := []string{"rep-a", "rep-b", "rep-c"}
			for j, name := range names {
				putIn(t, replicas[j], name, "rep", limiter.Policy{Limit: limits[j], Period: limiter.MaxPeriod, Algorithm: alg})
			}
			items := []limiter.Item{{Name: names[0], Permits: 1}, {Name: names[1], Permits: 2}, {Name: names[2], Permits: 3}}
			const total, workers = 2000, 24
			var (
				mu      sync.Mutex
				allowed int
				failed  []error
				wg      sync.WaitGroup
			)
			next := make(chan struct{}, total)
			for range total {
				next <- struct{}{}
			}
			close(next)
			for w := range workers {
				s := replicas[w%len(replicas)]
				wg.Go(func() {
					for range next {
						v, err := s.Decide(context.Background(), items, limiter.Take, "")
						mu.Lock()
						if err != nil {
							failed = append(failed, err)
						} else if v.Allowed {
							allowed++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(failed) > 0 {
				t.Fatalf("%d decisions failed, the first: %v", len(failed), failed[0])
			}
			if allowed != 350 {
				t.Errorf("%d of %d decisions allowed, the sequential model allows 350", allowed, total)
			}
			for j, name := range names {
				a, err := replicas[(j+1)%3].Available(context.Background(), name)
				if err != nil {
					t.Fatal(err)
				}
				if used, want := limits[j]-a.Remaining, int64(350*(j+1)); used != want {
					t.Errorf("%s: %d permits taken, the model takes %d", name, used, want)
				}
			}
			t.Logf("%s: %d of %d allowed across 3 replicas", alg, allowed, total)
		})
	}
}

// testRelocation: a replica that believes a limiter lives where it no
// longer does (deleted and created in another group through another
// replica) finds it where it now lives, for every call.
func testRelocation(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	r := newReplicas(t, c, 2)
	a, b := r[0], r[1]
	p := limiter.Policy{Limit: 10, Period: time.Hour}
	moves := []struct{ from, to string }{{"", "g1"}, {"g1", "g2"}, {"g2", ""}}
	for i, m := range moves {
		name := fmt.Sprintf("mv%d", i)
		putIn(t, a, name, m.from, p)
		// b meets the limiter where it is.
		if d, err := b.Acquire(ctx, name, 1); err != nil || !d.Allowed {
			t.Fatalf("%s in %q: Acquire through b: %+v, %v", name, m.from, d, err)
		}
		if err := a.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
		putIn(t, a, name, m.to, p)
		putIn(t, a, name+"-peer", m.to, p)
		calls := []struct {
			what string
			call func() error
		}{
			{"Acquire", func() error {
				d, err := b.Acquire(ctx, name, 2)
				if err == nil && (!d.Allowed || d.Remaining != 8) {
					err = fmt.Errorf("got %+v, want 2 taken from a full limiter", d)
				}
				return err
			}},
			{"Available", func() error {
				av, err := b.Available(ctx, name)
				if err == nil && av.Remaining != 8 {
					err = fmt.Errorf("got %+v, want 8 left", av)
				}
				return err
			}},
			{"Get", func() error {
				def, err := b.Get(ctx, name)
				if err == nil && def.Group != m.to {
					err = fmt.Errorf("got %+v, want group %q", def, m.to)
				}
				return err
			}},
			{"AcquireBatch", func() error {
				out := make([]limiter.Result, 2)
				b.AcquireBatch(ctx, []limiter.Request{{Name: name, Permits: 1}, {Name: name, Permits: 1}}, out)
				for _, r := range out {
					if r.Err != nil {
						return r.Err
					}
				}
				if out[1].Decision.Remaining != 6 {
					return fmt.Errorf("got %+v, want 6 left", out)
				}
				return nil
			}},
		}
		if m.to != "" {
			calls = append(calls, struct {
				what string
				call func() error
			}{"Decide", func() error {
				v, err := b.Decide(ctx, []limiter.Item{{Name: name, Permits: 1}, {Name: name + "-peer", Permits: 1}}, limiter.Take, "")
				if err == nil && (!v.Allowed || v.Checks[0].Remaining != 5) {
					err = fmt.Errorf("got %+v, want allowed with 5 left", v)
				}
				return err
			}})
		}
		for _, cl := range calls {
			if err := cl.call(); err != nil {
				t.Errorf("move %q → %q: %s through the replica that knew the old place: %v", m.from, m.to, cl.what, err)
			}
		}
		// And Delete through b, which learnt the new place.
		if err := a.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
		putIn(t, a, name, m.from, p)
		if err := b.Delete(ctx, name); err != nil {
			t.Errorf("move back to %q: Delete through b: %v", m.from, err)
		}
		if _, err := a.Get(ctx, name); err == nil {
			t.Errorf("%s still exists after b deleted it", name)
		}
	}
}

// testChargeRefundReplicas: concurrent charges and refunds through three
// replicas add up exactly. The limiter starts 4,000 permits in debt (a
// limit of 1,000 a day, charged 5,000), so that in any order the 1,000
// charges of 1 and 1,000 refunds of 2 that follow never reach full or the
// debt cap: it must end exactly 3,000 in debt, which a refund of 3,000
// pays off to the permit.
func testChargeRefundReplicas(t *testing.T, c rueidis.Client) {
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		t.Run(string(alg), func(t *testing.T) {
			ctx := context.Background()
			replicas := newReplicas(t, c, 3)
			putIn(t, replicas[0], "debt", "", limiter.Policy{Limit: 1000, Period: 24 * time.Hour, Algorithm: alg})
			one := func(n int64) []limiter.Item { return []limiter.Item{{Name: "debt", Permits: n}} }
			if _, err := replicas[0].Decide(ctx, one(5000), limiter.Charge, ""); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 2000)
			for w := range 20 {
				s := replicas[w%3]
				wg.Go(func() {
					for k := range 100 {
						mode, n := limiter.Charge, int64(1)
						if (w+k)%2 == 0 {
							mode, n = limiter.Refund, 2
						}
						if _, err := s.Decide(ctx, one(n), mode, ""); err != nil {
							errs <- err
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			v, err := replicas[1].Decide(ctx, one(2999), limiter.Refund, "")
			if err != nil || v.Checks[0].Remaining != 0 {
				t.Fatalf("refund 2,999 of a debt of 3,000: got %+v, %v, want still none left", v, err)
			}
			v, err = replicas[2].Decide(ctx, one(2), limiter.Refund, "")
			if err != nil || v.Checks[0].Remaining != 1 {
				t.Fatalf("refund 2 more: got %+v, %v, want 1 left", v, err)
			}
		})
	}
}

// testOnceReplicas: calls with one idempotency key through three replicas
// at once decide once: the script checks and records the key in the same
// atomic step as the decision.
func testOnceReplicas(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	replicas := newReplicas(t, c, 3)
	putIn(t, replicas[0], "oa", "og", limiter.Policy{Limit: 1000, Period: limiter.MaxPeriod})
	putIn(t, replicas[1], "ob", "og", limiter.Policy{Limit: 1000, Period: limiter.MaxPeriod, Algorithm: limiter.SlidingLog})
	items := []limiter.Item{{Name: "oa", Permits: 3}, {Name: "ob", Permits: 5}}
	var (
		wg       sync.WaitGroup
		replayed atomic.Int64
	)
	for w := range 30 {
		s := replicas[w%3]
		wg.Go(func() {
			for k := range 20 {
				v, err := s.Decide(ctx, items, limiter.Take, fmt.Sprintf("key-%d", k%4))
				if err != nil {
					t.Error(err)
					return
				}
				if v.Replayed {
					replayed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := replayed.Load(); got != 600-4 {
		t.Errorf("%d of 600 calls with 4 keys replayed, want all but 4", got)
	}
	for name, want := range map[string]int64{"oa": 1000 - 4*3, "ob": 1000 - 4*5} {
		if a, err := replicas[2].Available(ctx, name); err != nil || a.Remaining != want {
			t.Errorf("%s: %+v, %v, want %d left: 4 decisions", name, a, err, want)
		}
	}
}

// testSettleReplicas: reservations made through one replica and settled
// from all three at once are each settled exactly once.
func testSettleReplicas(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	replicas := newReplicas(t, c, 3)
	putIn(t, replicas[0], "sa", "sg", limiter.Policy{Limit: 10000, Period: limiter.MaxPeriod})
	putIn(t, replicas[0], "sb", "sg", limiter.Policy{Limit: 10000, Period: limiter.MaxPeriod, Algorithm: limiter.SlidingLog})
	const reservations = 20
	ids := make([]string, reservations)
	for k := range ids {
		v, err := replicas[0].Reserve(ctx, []limiter.Item{{Name: "sa", Permits: 100}, {Name: "sb", Permits: 100}}, time.Minute, "")
		if err != nil || !v.Allowed || v.Reservation == "" {
			t.Fatalf("reserve %d: %+v, %v", k, v, err)
		}
		ids[k] = v.Reservation
	}
	var (
		wg      sync.WaitGroup
		settled atomic.Int64
	)
	for w := range 24 {
		s := replicas[w%3]
		wg.Go(func() {
			for _, id := range ids {
				// Each reservation of 100 settled at 40 on sa and 130 on sb.
				_, err := s.Settle(ctx, id, []limiter.Item{{Name: "sa", Permits: 40}, {Name: "sb", Permits: 130}}, "")
				switch {
				case err == nil:
					settled.Add(1)
				case !errors.Is(err, limiter.ErrReservationNotFound):
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if got := settled.Load(); got != reservations {
		t.Errorf("%d settlements succeeded, want one per reservation, %d", got, reservations)
	}
	for name, want := range map[string]int64{"sa": 10000 - reservations*40, "sb": 10000 - reservations*130} {
		if a, err := replicas[1].Available(ctx, name); err != nil || a.Remaining != want {
			t.Errorf("%s: %+v, %v, want %d left", name, a, err, want)
		}
	}
}

// testDecideBatch holds decide.lua's batches to its single decisions:
// random rounds of 2 to 8 decisions (takes, peeks, charges and refunds,
// some under an idempotency key used twice in a round) on three plain
// limiters and two keyed ones of one group, both algorithms, small limits,
// and tables of 3 keys over 5, so that keys are evicted and denied for
// want of room between the decisions of one round. Each round runs on one
// Store as one batch, and on another, with the same definitions under
// another prefix, as one call per decision, at the same instant: every
// reply must be identical. The single path is held to the Go code and the
// model by the other tests.
func testDecideBatch(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(29, 31))
	batched, single := newStore(t, c), newStore(t, c)
	const group = "bg"
	var names, keyed []string
	for j := range 5 {
		alg := limiter.GCRA
		if j%2 == 1 {
			alg = limiter.SlidingLog
		}
		limit := []int64{1, 2, 3, 5, 10}[rng.IntN(5)]
		p := limiter.Policy{Limit: limit, Period: []time.Duration{time.Second, time.Hour}[rng.IntN(2)], Algorithm: alg}
		if alg == limiter.GCRA {
			p.Burst = 1 + rng.Int64N(limit)
		}
		name := fmt.Sprintf("b%d", j)
		for _, s := range []*Store{batched, single} {
			if j < 3 {
				putIn(t, s, name, group, p)
			} else {
				putKeyed(t, s, name, group, p, 3)
			}
		}
		if j < 3 {
			names = append(names, name)
		} else {
			keyed = append(keyed, name)
		}
	}
	modes := []limiter.Mode{limiter.Take, limiter.Take, limiter.Take, limiter.Peek, limiter.Charge, limiter.Refund}
	now := int64(epochUS)
	var decisions, denied, full int
	for round := range scaled(300) {
		nowMicros := us(now)
		k := 2 + rng.IntN(7)
		var calls, singles []scriptCall
		var once string
		for i := range k {
			n := 1 + rng.IntN(3)
			items := make([]limiter.Item, n)
			for m := range items {
				if rng.IntN(2) == 0 {
					items[m] = limiter.Item{Name: names[rng.IntN(len(names))]}
				} else {
					items[m] = limiter.Item{Name: keyed[rng.IntN(len(keyed))], Key: fmt.Sprintf("key%d", rng.IntN(5))}
				}
				items[m].Permits = 1 + rng.Int64N(3)
			}
			mode := modes[rng.IntN(len(modes))]
			cl := call{mode: mode.String()}
			if i == 0 && rng.IntN(3) == 0 {
				once = fmt.Sprintf("once-%d", round)
			}
			if once != "" && (i == 0 || rng.IntN(3) == 0) {
				cl.once, cl.fingerprint = once, fingerprint(items, mode, once)
			}
			parts, _ := limiter.Parts(items)
			groups := make([]string, len(items))
			for m := range groups {
				groups[m] = group
			}
			scope := limiter.Scope(items, groups)
			_, b := batched.scriptCall(parts, group, scope, cl, nowMicros)
			_, s := single.scriptCall(parts, group, scope, cl, nowMicros)
			calls, singles = append(calls, b), append(singles, s)
		}
		got := make([]scriptReply, k)
		batched.runDecisions(ctx, "", calls, got)
		for i, sc := range singles {
			var want [1]scriptReply
			single.runDecisions(ctx, "", []scriptCall{sc}, want[:])
			if got[i].err != nil || want[0].err != nil || !slices.Equal(got[i].v, want[0].v) {
				t.Fatalf("round %d at %dµs, decision %d of %d (%v): batched %v, %v; alone %v, %v",
					round, now, i+1, k, sc.args, got[i].v, got[i].err, want[0].v, want[0].err)
			}
			decisions++
			if v := want[0].v; len(v) > checkFields && v[0] == 1 {
				for j := 0; 1+checkFields*(j+1) <= len(v); j++ {
					f := v[1+checkFields*j:]
					if f[0] == 0 {
						denied++
					}
					if f[8] == 1 {
						full++
					}
				}
			}
		}
		now += []int64{0, 1, 1000, 100_000, 1_000_000, 3_600_000_000}[rng.IntN(6)]
	}
	if denied == 0 || full == 0 {
		t.Errorf("%d decisions: %d checks denied, %d keys full: want some of each", decisions, denied, full)
	}
	t.Logf("%d decisions in batches identical to alone (%d checks denied, %d keys full)", decisions, denied, full)
}

// testDecideBatchFailsAlone: a decision of a batch that raises an error in
// decide.lua (here a limiter whose state is a key of the wrong type) fails
// alone, with the error it gets alone, and the batch's other decisions,
// before and after it, are made as they would be alone.
func testDecideBatchFailsAlone(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	batched, single := newStore(t, c), newStore(t, c)
	const group = "fg"
	p := limiter.Policy{Limit: 5, Period: time.Hour}
	for _, s := range []*Store{batched, single} {
		putIn(t, s, "ok", group, p)
		putIn(t, s, "broken", group, p)
		state := s.keysIn("broken", group)[1]
		if err := c.Do(ctx, c.B().Lpush().Key(state).Element("not a bucket").Build()).Error(); err != nil {
			t.Fatalf("LPUSH %s: %v", state, err)
		}
	}
	nowMicros := us(epochUS)
	items := [][]limiter.Item{
		{{Name: "ok", Permits: 2}},
		{{Name: "ok", Permits: 1}, {Name: "broken", Permits: 1}},
		{{Name: "ok", Permits: 2}},
		{{Name: "ok", Permits: 2}},
	}
	var calls, singles []scriptCall
	for _, its := range items {
		parts, _ := limiter.Parts(its)
		groups := make([]string, len(its))
		for m := range groups {
			groups[m] = group
		}
		scope := limiter.Scope(its, groups)
		cl := call{mode: limiter.Take.String()}
		_, b := batched.scriptCall(parts, group, scope, cl, nowMicros)
		_, s := single.scriptCall(parts, group, scope, cl, nowMicros)
		calls, singles = append(calls, b), append(singles, s)
	}
	got := make([]scriptReply, len(calls))
	batched.runDecisions(ctx, "", calls, got)
	for i, sc := range singles {
		var want [1]scriptReply
		single.runDecisions(ctx, "", []scriptCall{sc}, want[:])
		if i == 1 {
			// Alone, Redis adds where in the script the error arose.
			if got[i].err == nil || want[0].err == nil || !strings.HasPrefix(got[i].err.Error(), "WRONGTYPE") || !strings.HasPrefix(want[0].err.Error(), "WRONGTYPE") {
				t.Errorf("decision %d, on a broken state: batched %v, %v; alone %v, %v; want WRONGTYPE errors", i+1, got[i].v, got[i].err, want[0].v, want[0].err)
			}
			continue
		}
		if got[i].err != nil || want[0].err != nil || !slices.Equal(got[i].v, want[0].v) {
			t.Errorf("decision %d: batched %v, %v; alone %v, %v", i+1, got[i].v, got[i].err, want[0].v, want[0].err)
		}
	}
	// 2 and 2 of 5 fit, the last 2 do not: the batch went on past the
	// failure, and the failed decision took nothing.
	if got[3].err == nil && (len(got[3].v) < 2 || got[3].v[1] != 0) {
		t.Errorf("decision 4: got %v, want a denial", got[3].v)
	}
}
