package storetest

import (
	"fmt"
	"sync"
	"testing"

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
	v, err := s.Decide(ctx(t), items, mode)
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
		_, err := s.Decide(ctx(t), tc.items, limiter.Take)
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
				putIn(t, s, n, "conc-"+string(alg), limiter.Policy{Limit: limit, Period: hour, Algorithm: alg})
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
						v, err := s.Decide(ctx(t), items, limiter.Take)
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
