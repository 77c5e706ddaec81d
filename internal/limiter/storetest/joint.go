package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

func putIn(t *testing.T, s limiter.Store, name, group string, p limiter.Policy) {
	t.Helper()
	if _, err := s.Put(ctx(t), limiter.Definition{Name: name, Policy: p, Group: group}); err != nil {
		t.Fatalf("Put(%q in %q, %+v): %v", name, group, p, err)
	}
}

func decide(t *testing.T, s limiter.Store, mode limiter.Mode, items ...limiter.Item) limiter.Verdict {
	t.Helper()
	v, err := s.Decide(ctx(t), items, mode, "")
	if err != nil {
		t.Fatalf("Decide(%+v): %v", items, err)
	}
	return v
}

// testDecide: a burst limit and a daily quota on one action, then the
// quota short: a decision either takes from both or from neither.
func testDecide(t *testing.T, s limiter.Store) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			g := "checkout-" + string(alg)
			burst, daily := "burst-"+string(alg), "daily-"+string(alg)
			putIn(t, s, burst, g, limiter.Policy{Limit: 5, Period: hour, Algorithm: alg})
			putIn(t, s, daily, g, limiter.Policy{Limit: 8, Period: 24 * hour, Algorithm: alg})
			both := func(n int64) []limiter.Item {
				return []limiter.Item{{Name: burst, Permits: n}, {Name: daily, Permits: n}}
			}
			v := decide(t, s, limiter.Take, both(3)...)
			if !v.Allowed || v.ExceedsCapacity || v.RetryAfter != 0 || len(v.Checks) != 2 {
				t.Fatalf("3 of both: got %+v, want allowed", v)
			}
			if c := v.Checks[0]; c.Name != burst || c.Permits != 3 || !c.Fits || c.Remaining != 2 || c.Limit != 5 || c.ResetAfter <= 0 {
				t.Errorf("3 of both: burst's check %+v, want it to fit with 2 of 5 left", c)
			}
			if c := v.Checks[1]; c.Name != daily || !c.Fits || c.Remaining != 5 || c.Limit != 8 {
				t.Errorf("3 of both: daily's check %+v, want it to fit with 5 of 8 left", c)
			}
			wantRemaining(t, s, burst, 2)
			wantRemaining(t, s, daily, 5)

			// 3 more: the burst limit has 2, so nothing is taken from either.
			v = decide(t, s, limiter.Take, both(3)...)
			if v.Allowed || v.ExceedsCapacity || v.RetryAfter <= 0 || v.RetryAfter > hour {
				t.Fatalf("3 more of both: got %+v, want denied with a retry time", v)
			}
			if c := v.Checks[0]; c.Fits || c.Remaining != 2 || c.RetryAfter != v.RetryAfter {
				t.Errorf("3 more: burst's check %+v, want the denial, 2 left, the verdict's retry %s", c, v.RetryAfter)
			}
			if c := v.Checks[1]; !c.Fits || c.Remaining != 5 || c.RetryAfter != 0 {
				t.Errorf("3 more: daily's check %+v, want it to fit, 5 left, untouched", c)
			}
			wantRemaining(t, s, burst, 2)
			wantRemaining(t, s, daily, 5)

			// A peek answers the same and takes nothing.
			for range 3 {
				if p := decide(t, s, limiter.Peek, both(2)...); !p.Allowed || p.Checks[0].Remaining != 2 || p.Checks[1].Remaining != 5 {
					t.Fatalf("peek 2 of both: got %+v, want allowed with 2 and 5 left", p)
				}
			}
			wantRemaining(t, s, burst, 2)
			wantRemaining(t, s, daily, 5)

			// Items on one limiter are summed: 1 + 1 of the burst limit fits.
			v = decide(t, s, limiter.Take, limiter.Item{Name: burst, Permits: 1}, limiter.Item{Name: daily, Permits: 2}, limiter.Item{Name: burst, Permits: 1})
			if !v.Allowed || v.Checks[0].Remaining != 0 || v.Checks[2].Remaining != 0 || v.Checks[2].Permits != 1 || v.Checks[1].Remaining != 3 {
				t.Fatalf("1+1 of burst and 2 of daily: got %+v, want allowed, 0 and 3 left", v)
			}
			wantRemaining(t, s, burst, 0)
			wantRemaining(t, s, daily, 3)

			// More than a limiter can ever hold exceeds its capacity.
			v = decide(t, s, limiter.Take, limiter.Item{Name: daily, Permits: 1}, limiter.Item{Name: burst, Permits: 6})
			if v.Allowed || !v.ExceedsCapacity || v.RetryAfter != 0 || !v.Checks[1].ExceedsCapacity || v.Checks[0].ExceedsCapacity {
				t.Errorf("6 of a burst of 5: got %+v, want denied, exceeding the burst limiter's capacity", v)
			}
			wantRemaining(t, s, daily, 3)
		})
	}
}

// testDecideRefusals: what a decision refuses changes nothing.
func testDecideRefusals(t *testing.T, s limiter.Store) {
	p := limiter.Policy{Limit: 4, Period: hour}
	putIn(t, s, "ra", "g1", p)
	putIn(t, s, "rb", "g1", p)
	putIn(t, s, "rc", "g2", p)
	putIn(t, s, "rd", "", p)
	putIn(t, s, "re", "", p)
	for _, tc := range []struct {
		name  string
		items []limiter.Item
		want  error
	}{
		{"groups differ", []limiter.Item{{Name: "ra", Permits: 1}, {Name: "rc", Permits: 1}}, limiter.ErrCrossGroup},
		{"one in no group", []limiter.Item{{Name: "ra", Permits: 1}, {Name: "rd", Permits: 1}}, limiter.ErrCrossGroup},
		{"both in no group", []limiter.Item{{Name: "rd", Permits: 1}, {Name: "re", Permits: 1}}, limiter.ErrCrossGroup},
		{"unknown limiter", []limiter.Item{{Name: "ra", Permits: 1}, {Name: "nope", Permits: 1}}, limiter.ErrNotFound},
	} {
		_, err := s.Decide(ctx(t), tc.items, limiter.Take, "")
		wantErr(t, tc.name, err, tc.want)
	}
	for _, name := range []string{"ra", "rb", "rc", "rd", "re"} {
		wantRemaining(t, s, name, 4)
	}
	// One limiter in no group is a decision of its own.
	if v := decide(t, s, limiter.Take, limiter.Item{Name: "rd", Permits: 1}, limiter.Item{Name: "rd", Permits: 2}); !v.Allowed || v.Checks[0].Remaining != 1 {
		t.Errorf("1+2 of one limiter in no group: got %+v, want allowed, 1 left", v)
	}
}

// testGroups: a limiter's group is part of its definition and stays with
// it until it is deleted.
func testGroups(t *testing.T, s limiter.Store) {
	p := limiter.Policy{Limit: 4, Period: hour}
	putIn(t, s, "grp-a", "team", p)
	def, err := s.Get(ctx(t), "grp-a")
	if err != nil || def.Group != "team" {
		t.Fatalf("Get: got %+v, %v, want group team", def, err)
	}
	defs, err := s.List(ctx(t), "grp-", 10)
	if err != nil || len(defs) != 1 || defs[0].Group != "team" {
		t.Fatalf("List: got %+v, %v, want grp-a in team", defs, err)
	}
	acquire(t, s, "grp-a", 3)
	for _, other := range []string{"", "other"} {
		_, err := s.Put(ctx(t), limiter.Definition{Name: "grp-a", Policy: p, Group: other})
		wantErr(t, fmt.Sprintf("moving to %q", other), err, limiter.ErrGroupConflict)
	}
	wantRemaining(t, s, "grp-a", 1)
	// Replacing it in its group keeps its state, as for any limiter.
	putIn(t, s, "grp-a", "team", p)
	wantRemaining(t, s, "grp-a", 1)
	if err := s.Delete(ctx(t), "grp-a"); err != nil {
		t.Fatal(err)
	}
	putIn(t, s, "grp-a", "other", p)
	if def, err := s.Get(ctx(t), "grp-a"); err != nil || def.Group != "other" {
		t.Fatalf("Get after moving: got %+v, %v, want group other", def, err)
	}
	wantRemaining(t, s, "grp-a", 4)
	// And out of any group.
	if err := s.Delete(ctx(t), "grp-a"); err != nil {
		t.Fatal(err)
	}
	putIn(t, s, "grp-a", "", p)
	if def, err := s.Get(ctx(t), "grp-a"); err != nil || def.Group != "" {
		t.Fatalf("Get after leaving: got %+v, %v, want no group", def, err)
	}
	// A limiter in no group cannot join one in place either.
	_, err = s.Put(ctx(t), limiter.Definition{Name: "grp-a", Policy: p, Group: "team"})
	wantErr(t, "joining a group", err, limiter.ErrGroupConflict)
}

// testConcurrentDecide: concurrent decisions over overlapping limiters of
// one group, in every order. Each limiter must hold exactly the permits of
// the allowed decisions that named it, and never more than its limit: a
// decision that was denied took nothing from any of them.
func testConcurrentDecide(t *testing.T, s limiter.Store) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			const limit = 60
			names := []string{"c0-" + string(alg), "c1-" + string(alg), "c2-" + string(alg)}
			for _, n := range names {
				putIn(t, s, n, "conc-"+string(alg), limiter.Policy{Limit: limit, Period: limiter.MaxPeriod, Algorithm: alg})
			}
			sets := [][]int{{0, 1}, {1, 0}, {1, 2}, {2, 1}, {0, 2}, {2, 0}, {0, 1, 2}, {2, 1, 0}}
			var (
				mu      sync.Mutex
				granted = make([]int64, len(names))
				wg      sync.WaitGroup
			)
			for w := range 8 {
				wg.Go(func() {
					for k := range 40 {
						set := sets[(w+k)%len(sets)]
						items := make([]limiter.Item, len(set))
						for i, j := range set {
							items[i] = limiter.Item{Name: names[j], Permits: 1 + int64(j)}
						}
						v, err := s.Decide(ctx(t), items, limiter.Take, "")
						if err != nil {
							t.Error(err)
							return
						}
						if v.Allowed {
							mu.Lock()
							for _, j := range set {
								granted[j] += 1 + int64(j)
							}
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			for j, n := range names {
				used := limit - available(t, s, n).Remaining
				if used != granted[j] || used > limit {
					t.Errorf("%s: %d permits taken, %d granted by allowed decisions, limit %d", n, used, granted[j], limit)
				}
			}
		})
	}
}

// testChargeRefund: an LLM gateway's token budget. It acquires an
// estimate, then charges the excess once the real cost is known, going
// into debt past the limit; a refund gives back what was not used, never
// beyond full.
func testChargeRefund(t *testing.T, s limiter.Store) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			name := "tokens-" + string(alg)
			putIn(t, s, name, "", limiter.Policy{Limit: 1000, Period: 24 * hour, Algorithm: alg})
			item := func(n int64) limiter.Item { return limiter.Item{Name: name, Permits: n} }
			if v := decide(t, s, limiter.Take, item(300)); !v.Allowed || v.Checks[0].Remaining != 700 {
				t.Fatalf("acquire an estimate of 300: got %+v", v)
			}
			// The answer cost 1,500: the excess of 1,200 puts it in debt.
			v := decide(t, s, limiter.Charge, item(1200))
			if !v.Allowed || !v.Checks[0].Fits || v.Checks[0].Remaining != 0 || v.Checks[0].ResetAfter <= 0 {
				t.Fatalf("charge 1,200 with 700 left: got %+v, want applied, 0 left", v)
			}
			if d := acquire(t, s, name, 1); d.Allowed || d.RetryAfter <= 0 {
				t.Fatalf("acquire 1 in debt: got %+v, want denied with a wait", d)
			}
			wantRemaining(t, s, name, 0)
			// A refund of 600 pays off the debt of 500 and gives 100 back.
			if v := decide(t, s, limiter.Refund, item(600)); !v.Allowed || v.Checks[0].Remaining != 100 {
				t.Fatalf("refund 600 of a debt of 500: got %+v, want 100 left", v)
			}
			// A refund never fills a limiter past full.
			if v := decide(t, s, limiter.Refund, item(5000)); !v.Allowed || v.Checks[0].Remaining != 1000 || v.Checks[0].ResetAfter != 0 {
				t.Fatalf("refund 5,000: got %+v, want full, 1,000 left", v)
			}
			if d := acquire(t, s, name, 1000); !d.Allowed {
				t.Fatalf("acquire 1,000 of a full limiter: got %+v", d)
			}
		})
	}
	// A refund on a sliding log gives back the newest grants first: the
	// older ones still leave the window at their own time.
	putIn(t, s, "log-newest", "", limiter.Policy{Limit: 10, Period: hour, Algorithm: limiter.SlidingLog})
	acquire(t, s, "log-newest", 4)
	first := available(t, s, "log-newest").ResetAfter
	acquire(t, s, "log-newest", 5)
	if v := decide(t, s, limiter.Refund, limiter.Item{Name: "log-newest", Permits: 5}); v.Checks[0].Remaining != 6 || v.Checks[0].ResetAfter > first {
		t.Errorf("refund the newest 5: got %+v, want 6 left, full again no later than the first grant's %s", v, first)
	}
	// Charges and refunds of several limiters apply to all, as one step.
	putIn(t, s, "cr-a", "cr", limiter.Policy{Limit: 10, Period: hour})
	putIn(t, s, "cr-b", "cr", limiter.Policy{Limit: 10, Period: hour, Algorithm: limiter.SlidingLog})
	v := decide(t, s, limiter.Charge, limiter.Item{Name: "cr-a", Permits: 4}, limiter.Item{Name: "cr-b", Permits: 15})
	if !v.Allowed || v.Checks[0].Remaining != 6 || v.Checks[1].Remaining != 0 {
		t.Errorf("charge 4 and 15: got %+v, want 6 and 0 left", v)
	}
	_, err := s.Decide(ctx(t), []limiter.Item{{Name: "cr-a", Permits: 1}, {Name: "rd-nope", Permits: 1}}, limiter.Charge, "")
	wantErr(t, "charge an unknown limiter", err, limiter.ErrNotFound)
	wantRemaining(t, s, "cr-a", 6)
}

// testOnce: a decision with an idempotency key is made once; its retries
// get its answer back and change nothing, whatever happened since.
func testOnce(t *testing.T, s limiter.Store) {
	p := limiter.Policy{Limit: 10, Period: hour}
	putIn(t, s, "once-a", "once", p)
	putIn(t, s, "once-b", "once", p)
	putIn(t, s, "once-solo", "", p)
	both := []limiter.Item{{Name: "once-a", Permits: 3}, {Name: "once-b", Permits: 4}}
	first, err := s.Decide(ctx(t), both, limiter.Take, "k-1")
	if err != nil || !first.Allowed || first.Replayed {
		t.Fatalf("first decision: got %+v, %v, want allowed, not replayed", first, err)
	}
	acquire(t, s, "once-a", 1) // the state moves on
	for range 3 {
		again, err := s.Decide(ctx(t), both, limiter.Take, "k-1")
		if err != nil || !again.Replayed || again.Allowed != first.Allowed || !slices.Equal(again.Checks, first.Checks) {
			t.Fatalf("retry: got %+v, %v, want the first answer %+v, replayed", again, err, first)
		}
	}
	wantRemaining(t, s, "once-a", 6)
	wantRemaining(t, s, "once-b", 6)
	// The same key for another request decides nothing.
	for _, other := range []struct {
		items []limiter.Item
		mode  limiter.Mode
	}{
		{[]limiter.Item{{Name: "once-a", Permits: 3}}, limiter.Take},
		{[]limiter.Item{{Name: "once-b", Permits: 4}, {Name: "once-a", Permits: 3}}, limiter.Take},
		{both, limiter.Charge},
	} {
		_, err := s.Decide(ctx(t), other.items, other.mode, "k-1")
		wantErr(t, "the key for another request", err, limiter.ErrOnceMismatch)
	}
	wantRemaining(t, s, "once-a", 6)
	// Keys belong to where the limiters live: the same key elsewhere is
	// another key.
	if v, err := s.Decide(ctx(t), []limiter.Item{{Name: "once-solo", Permits: 2}}, limiter.Take, "k-1"); err != nil || v.Replayed || v.Checks[0].Remaining != 8 {
		t.Fatalf("k-1 on a limiter in no group: got %+v, %v, want a fresh decision", v, err)
	}
	// A denial is remembered as a denial, and charges and refunds once.
	big := []limiter.Item{{Name: "once-a", Permits: 7}}
	if v, err := s.Decide(ctx(t), big, limiter.Take, "k-2"); err != nil || v.Allowed {
		t.Fatalf("7 of 6: got %+v, %v, want denied", v, err)
	}
	acquire(t, s, "once-a", 1)
	if v, err := s.Decide(ctx(t), big, limiter.Take, "k-2"); err != nil || v.Allowed || !v.Replayed {
		t.Fatalf("retry of the denial: got %+v, %v, want the denial replayed", v, err)
	}
	charge := []limiter.Item{{Name: "once-b", Permits: 5}}
	for i := range 3 {
		if v, err := s.Decide(ctx(t), charge, limiter.Charge, "k-3"); err != nil || v.Checks[0].Remaining != 1 || v.Replayed != (i > 0) {
			t.Fatalf("charge 5 of 6, call %d: got %+v, %v, want 1 left", i, v, err)
		}
	}
	for i := range 3 {
		if v, err := s.Decide(ctx(t), charge, limiter.Refund, "k-4"); err != nil || v.Checks[0].Remaining != 6 || v.Replayed != (i > 0) {
			t.Fatalf("refund 5, call %d: got %+v, %v, want 6 left", i, v, err)
		}
	}
	wantRemaining(t, s, "once-b", 6)
	// An unknown limiter records nothing under the key.
	_, err = s.Decide(ctx(t), []limiter.Item{{Name: "once-a", Permits: 1}, {Name: "once-nope", Permits: 1}}, limiter.Take, "k-5")
	wantErr(t, "an unknown limiter", err, limiter.ErrNotFound)
	putIn(t, s, "once-nope", "once", p)
	if v, err := s.Decide(ctx(t), []limiter.Item{{Name: "once-a", Permits: 1}, {Name: "once-nope", Permits: 1}}, limiter.Take, "k-5"); err != nil || v.Replayed || !v.Allowed {
		t.Fatalf("k-5 once the limiter exists: got %+v, %v, want a fresh decision", v, err)
	}
}

// testConcurrentOnce: many concurrent calls with one key decide once.
func testConcurrentOnce(t *testing.T, s limiter.Store) {
	putIn(t, s, "conc-once", "", limiter.Policy{Limit: 1000, Period: limiter.MaxPeriod})
	items := []limiter.Item{{Name: "conc-once", Permits: 7}}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		replayed int
	)
	for range 16 {
		wg.Go(func() {
			for range 10 {
				v, err := s.Decide(ctx(t), items, limiter.Take, "same")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if v.Replayed {
					replayed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if replayed != 159 {
		t.Errorf("%d of 160 calls replayed, want all but the first", replayed)
	}
	wantRemaining(t, s, "conc-once", 993)
}

// testReservations: reserve an estimate, then settle to the real cost:
// the excess is charged and the rest refunded, limiter by limiter, once.
func testReservations(t *testing.T, s limiter.Store) {
	p := limiter.Policy{Limit: 1000, Period: limiter.MaxPeriod}
	putIn(t, s, "rv-minute", "rv", p)
	putIn(t, s, "rv-day", "rv", limiter.Policy{Limit: 5000, Period: 24 * hour, Algorithm: limiter.SlidingLog})
	putIn(t, s, "rv-other", "", p)
	reserve := func(n int64, once string) limiter.Verdict {
		t.Helper()
		v, err := s.Reserve(ctx(t), []limiter.Item{{Name: "rv-minute", Permits: n}, {Name: "rv-day", Permits: n}}, time.Minute, once)
		if err != nil {
			t.Fatalf("Reserve(%d): %v", n, err)
		}
		return v
	}
	settle := func(id string, actual []limiter.Item) (limiter.Verdict, error) {
		return s.Settle(ctx(t), id, actual, "")
	}
	both := func(n int64) []limiter.Item {
		return []limiter.Item{{Name: "rv-minute", Permits: n}, {Name: "rv-day", Permits: n}}
	}

	// Spent more than reserved: the excess goes into debt on the minute.
	v := reserve(300, "")
	if !v.Allowed || v.Reservation == "" || v.Checks[0].Remaining != 700 {
		t.Fatalf("reserve 300: got %+v, want allowed with a reservation", v)
	}
	got, err := settle(v.Reservation, both(1500))
	if err != nil || !got.Allowed || got.Checks[0].Remaining != 0 || got.Checks[1].Remaining != 3500 {
		t.Fatalf("settle at 1,500: got %+v, %v, want 0 and 3,500 left", got, err)
	}
	_, err = settle(v.Reservation, both(1500))
	wantErr(t, "settling twice", err, limiter.ErrReservationNotFound)
	if _, err := s.Decide(ctx(t), both(1500), limiter.Refund, ""); err != nil { // full again
		t.Fatal(err)
	}

	// Spent less: the rest comes back; a limiter not named stays charged.
	v = reserve(300, "")
	got, err = settle(v.Reservation, []limiter.Item{{Name: "rv-minute", Permits: 100}})
	if err != nil || got.Checks[0].Remaining != 900 || len(got.Checks) != 1 {
		t.Fatalf("settle the minute at 100: got %+v, %v, want 900 left", got, err)
	}
	wantRemaining(t, s, "rv-day", 4700)

	// Cancelled: everything comes back.
	v = reserve(200, "")
	got, err = s.Settle(ctx(t), v.Reservation, nil, "")
	if err != nil || len(got.Checks) != 2 || got.Checks[0].Remaining != 900 || got.Checks[1].Remaining != 4700 {
		t.Fatalf("cancel: got %+v, %v, want 900 and 4,700 left", got, err)
	}

	// A settlement naming a limiter the reservation does not hold changes
	// nothing, and the reservation can still be settled.
	v = reserve(100, "")
	_, err = settle(v.Reservation, []limiter.Item{{Name: "rv-minute", Permits: 1}, {Name: "rv-other", Permits: 1}})
	wantErr(t, "settling another limiter", err, limiter.ErrInvalidReservation)
	wantRemaining(t, s, "rv-minute", 800)
	wantRemaining(t, s, "rv-other", 1000)
	if _, err := settle(v.Reservation, both(100)); err != nil {
		t.Fatalf("settle after the refusal: %v", err)
	}

	// A denial reserves nothing.
	if v := reserve(5000, ""); v.Allowed || v.Reservation != "" {
		t.Fatalf("reserve 5,000 of 800: got %+v, want denied without a reservation", v)
	}
	// With an idempotency key a retry names the same reservation.
	first := reserve(10, "rv-key")
	again := reserve(10, "rv-key")
	if !again.Replayed || again.Reservation != first.Reservation || first.Reservation == "" {
		t.Fatalf("reserve retried: got %q (replayed %v), want %q", again.Reservation, again.Replayed, first.Reservation)
	}
	wantRemaining(t, s, "rv-minute", 790)
	for _, bad := range []string{"", "x", "g.rv.nothex", "l.rv-other.00000000000000000000000000000000"} {
		_, err := settle(bad, both(1))
		wantErr(t, fmt.Sprintf("settling %q with rv-minute and rv-day", bad), err, limiter.ErrInvalidReservation)
	}
	_, err = settle("l.rv-other.00000000000000000000000000000000", []limiter.Item{{Name: "rv-other", Permits: 1}})
	wantErr(t, "an unknown reservation", err, limiter.ErrReservationNotFound)
	_, err = settle("g.rv.00000000000000000000000000000000", both(1))
	wantErr(t, "an unknown reservation of a group", err, limiter.ErrReservationNotFound)
	if _, err := settle(first.Reservation, both(10)); err != nil {
		t.Fatal(err)
	}

	// Past its TTL a reservation stays charged and cannot be settled.
	short, err := s.Reserve(ctx(t), []limiter.Item{{Name: "rv-other", Permits: 40}}, 100*time.Millisecond, "")
	if err != nil || !short.Allowed {
		t.Fatalf("reserve 40 for 100 ms: %+v, %v", short, err)
	}
	time.Sleep(300 * time.Millisecond)
	_, err = settle(short.Reservation, []limiter.Item{{Name: "rv-other", Permits: 0}})
	wantErr(t, "settling past the TTL", err, limiter.ErrReservationNotFound)
	wantRemaining(t, s, "rv-other", 960)
}

// testConcurrentSettle: a reservation settled from many goroutines at once
// is settled exactly once.
func testConcurrentSettle(t *testing.T, s limiter.Store) {
	putIn(t, s, "cs", "", limiter.Policy{Limit: 100, Period: limiter.MaxPeriod})
	v, err := s.Reserve(ctx(t), []limiter.Item{{Name: "cs", Permits: 50}}, time.Minute, "")
	if err != nil || !v.Allowed {
		t.Fatal(v, err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		settled int
	)
	for range 16 {
		wg.Go(func() {
			_, err := s.Settle(ctx(t), v.Reservation, []limiter.Item{{Name: "cs", Permits: 10}}, "")
			switch {
			case err == nil:
				mu.Lock()
				settled++
				mu.Unlock()
			case !errors.Is(err, limiter.ErrReservationNotFound):
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if settled != 1 {
		t.Errorf("settled %d times, want once", settled)
	}
	wantRemaining(t, s, "cs", 90)
}

// testSettleAfterRedefinition: a reservation is bound to each limiter as
// defined when it was made. Once a limiter is replaced by another policy,
// or deleted and created again, settling or cancelling the reservation
// gives it nothing back and charges it nothing: the new limiter starts
// full, so a refund of what the old one granted would let it grant more
// than its limit in one period. The limiters it still holds as they were
// are settled as usual.
func testSettleAfterRedefinition(t *testing.T, s limiter.Store) {
	for _, alg := range algorithms {
		for _, keyed := range []bool{false, true} {
			for _, how := range []string{"replaced", "re-created"} {
				t.Run(fmt.Sprintf("%s/keyed=%v/%s", alg, keyed, how), func(t *testing.T) {
					name := fmt.Sprintf("sr-%s-%v-%s", alg, keyed, how)
					kept := name + "-kept"
					key := ""
					if keyed {
						key = "k"
					}
					def := func(n string, limit int64) limiter.Definition {
						return limiter.Definition{Name: n, Group: name, Keyed: keyed, Policy: limiter.Policy{Limit: limit, Period: hour, Algorithm: alg}}
					}
					for _, d := range []limiter.Definition{def(name, 5), def(kept, 100)} {
						if _, err := s.Put(ctx(t), d); err != nil {
							t.Fatal(err)
						}
					}
					items := []limiter.Item{{Name: name, Key: key, Permits: 3}, {Name: kept, Key: key, Permits: 3}}
					v, err := s.Reserve(ctx(t), items, time.Minute, "")
					if err != nil || !v.Allowed {
						t.Fatalf("reserve 3 of each: %+v, %v", v, err)
					}
					if how == "re-created" {
						if err := s.Delete(ctx(t), name); err != nil {
							t.Fatal(err)
						}
						if _, err := s.Put(ctx(t), def(name, 5)); err != nil {
							t.Fatal(err)
						}
					} else if _, err := s.Put(ctx(t), def(name, 6)); err != nil {
						t.Fatal(err)
					}
					limit := map[string]int64{"replaced": 6, "re-created": 5}[how]
					take := func(n int64) limiter.Verdict {
						t.Helper()
						v, err := s.Decide(ctx(t), []limiter.Item{{Name: name, Key: key, Permits: n}}, limiter.Take, "")
						if err != nil {
							t.Fatal(err)
						}
						return v
					}
					if v := take(limit); !v.Allowed {
						t.Fatalf("take %d of the new limiter: got %+v, want allowed (it starts full)", limit, v)
					}
					got, err := s.Settle(ctx(t), v.Reservation, nil, "")
					if err != nil {
						t.Fatalf("cancel: %v", err)
					}
					if len(got.Checks) != 2 || got.Checks[0].Remaining != 0 || got.Checks[1].Remaining != 100 {
						t.Errorf("cancel: got %+v, want the new limiter as it stands (0 left) and the kept one refunded (100 left)", got.Checks)
					}
					if v := take(1); v.Allowed {
						t.Errorf("a take after the cancel: allowed, want denied: %d granted in one period on a limit of %d", limit+1, limit)
					}
				})
			}
		}
	}
}

// testSettleHeld: a settlement gives back only what the reservation still
// holds. Once its permits have drained from a GCRA bucket, or left a
// sliding log's window, cancelling it gives nothing back: a refund then
// would hand over room that later grants hold, and the bucket would grant
// twice its limit at once.
func testSettleHeld(t *testing.T, s limiter.Store) {
	const period = time.Second
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			name := "held-" + string(alg)
			putIn(t, s, name, "", limiter.Policy{Limit: 5, Period: period, Algorithm: alg})
			one := func(n int64) []limiter.Item { return []limiter.Item{{Name: name, Permits: n}} }
			// A slow machine may let a period pass between the take and
			// the check that follows it; such a round proves nothing and
			// is made again.
			for round := 0; ; round++ {
				v, err := s.Reserve(ctx(t), one(5), time.Hour, "")
				if err != nil || !v.Allowed {
					t.Fatalf("reserve 5: %+v, %v", v, err)
				}
				time.Sleep(period + 100*time.Millisecond) // the reservation has drained
				start := time.Now()
				if v := decide(t, s, limiter.Take, one(5)...); !v.Allowed {
					t.Fatalf("take 5 a period after the reservation: got %+v, want allowed", v)
				}
				if _, err := s.Settle(ctx(t), v.Reservation, nil, ""); err != nil {
					t.Fatalf("cancel: %v", err)
				}
				after := decide(t, s, limiter.Take, one(1)...)
				if time.Since(start) >= period/2 {
					if round == 2 {
						t.Fatalf("three rounds each took longer than %v", period/2)
					}
					time.Sleep(period) // full again
					continue
				}
				if after.Allowed {
					t.Errorf("a take after cancelling a drained reservation: allowed, want denied: 6 granted at once on a limit of 5")
				}
				return
			}
		})
	}
}
