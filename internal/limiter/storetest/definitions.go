package storetest

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

func testLifecycle(t *testing.T, s limiter.Store) {
	c := ctx(t)
	for _, p := range []limiter.Policy{
		{Limit: 9, Period: time.Minute},
		{Limit: 100, Period: 1500 * time.Millisecond, Burst: 10},
		{Limit: 7, Period: 1_000_003 * time.Nanosecond, Algorithm: limiter.SlidingLog},
		{Limit: limiter.MaxLimit, Period: limiter.MaxPeriod, Algorithm: limiter.GCRA, Burst: 1},
	} {
		name := fmt.Sprintf("l-%d-%d-%s", p.Limit, p.Period, p.Algorithm)
		if !put(t, s, name, p) {
			t.Errorf("first Put(%q): got created=false, want true", name)
		}
		def, err := s.Get(c, name)
		if err != nil || def.Name != name || def.Policy != p.Normalize() {
			t.Errorf("Get(%q): got %+v, %v, want %+v", name, def, err, p.Normalize())
		}
		if put(t, s, name, p) {
			t.Errorf("second Put(%q): got created=true, want false", name)
		}
		if err := s.Delete(c, name); err != nil {
			t.Fatalf("Delete(%q): %v", name, err)
		}
		_, err = s.Get(c, name)
		wantErr(t, fmt.Sprintf("Get(%q) after Delete", name), err, limiter.ErrNotFound)
	}
}

func testNotFound(t *testing.T, s limiter.Store) {
	c := ctx(t)
	_, err := s.Get(c, "missing")
	wantErr(t, "Get", err, limiter.ErrNotFound)
	_, err = s.Acquire(c, "missing", 1)
	wantErr(t, "Acquire", err, limiter.ErrNotFound)
	_, err = s.Available(c, "missing")
	wantErr(t, "Available", err, limiter.ErrNotFound)
	wantErr(t, "Delete", s.Delete(c, "missing"), limiter.ErrNotFound)
	// A deleted limiter is as unknown as one never created.
	put(t, s, "gone", limiter.Policy{Limit: 1, Period: hour})
	if err := s.Delete(c, "gone"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	_, err = s.Acquire(c, "gone", 1)
	wantErr(t, "Acquire after Delete", err, limiter.ErrNotFound)
	_, err = s.Available(c, "gone")
	wantErr(t, "Available after Delete", err, limiter.ErrNotFound)
	wantErr(t, "second Delete", s.Delete(c, "gone"), limiter.ErrNotFound)
	if defs, err := s.List(c, "", 10); err != nil || len(defs) != 0 {
		t.Errorf("List of an empty store: got %v, %v, want none", defs, err)
	}
}

func testListPages(t *testing.T, s limiter.Store) {
	c := ctx(t)
	var want []string
	for i := range 25 {
		name := fmt.Sprintf("l%02d", (i*7)%25) // out of order
		alg := algorithms[i%2]
		put(t, s, name, limiter.Policy{Limit: int64(i + 1), Period: hour, Algorithm: alg})
	}
	for i := range 25 {
		want = append(want, fmt.Sprintf("l%02d", i))
	}
	if err := s.Delete(c, "l13"); err != nil {
		t.Fatal(err)
	}
	want = slices.Delete(want, 13, 14)
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatalf("more than 10 pages: listed so far %v", got)
		}
		page, err := s.List(c, after, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 10 {
			t.Fatalf("page of %d, want at most 10", len(page))
		}
		for _, d := range page {
			got = append(got, d.Name)
			if d.Policy != d.Policy.Normalize() || d.Policy.Validate() != nil {
				t.Errorf("listed %q with policy %+v, want a valid, normalized one", d.Name, d.Policy)
			}
		}
		if len(page) < 10 {
			break
		}
		after = page[len(page)-1].Name
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("listed %v, want %v", got, want)
	}
	// The listed policies are the stored ones.
	page, err := s.List(c, "l06", 1)
	if err != nil || len(page) != 1 || page[0].Name != "l07" {
		t.Fatalf("List after l06, 1: got %+v, %v, want l07", page, err)
	}
	if def, _ := s.Get(c, "l07"); page[0].Policy != def.Policy {
		t.Errorf("List gives l07 %+v, Get gives %+v", page[0].Policy, def.Policy)
	}
	// After a name that is not a limiter, and past the end.
	if page, err := s.List(c, "l12z", 2); err != nil || len(page) != 2 || page[0].Name != "l14" || page[1].Name != "l15" {
		t.Errorf("List after l12z, 2: got %+v, %v, want l14, l15", page, err)
	}
	if page, err := s.List(c, "l24", 10); err != nil || len(page) != 0 {
		t.Errorf("List after the last name: got %+v, %v, want none", page, err)
	}
	// A store answers none for any max below 1, never panics: the Service
	// refuses them, but a store stands on its own.
	for _, max := range []int{0, -1, math.MinInt} {
		if page, err := s.List(c, "", max); err != nil || len(page) != 0 {
			t.Errorf("List of %d: got %+v, %v, want none", max, page, err)
		}
	}
}

// testReplace: re-applying the same policy keeps the state, so that a
// configuration push does not hand out a fresh limit; any other policy
// starts the limiter full.
func testReplace(t *testing.T, s limiter.Store) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			p := limiter.Policy{Limit: 9, Period: hour, Algorithm: alg}
			put(t, s, "r-"+string(alg), p)
			name := "r-" + string(alg)
			if d := acquire(t, s, name, 5); !d.Allowed {
				t.Fatalf("Acquire 5 of 9: got %+v", d)
			}
			if put(t, s, name, p) {
				t.Error("identical Put: got created=true, want false")
			}
			wantRemaining(t, s, name, 4)
			// The normalized spelling of the same policy is identical too.
			if alg == limiter.GCRA {
				put(t, s, name, limiter.Policy{Limit: 9, Period: hour, Burst: 9})
				wantRemaining(t, s, name, 4)
			}
			changed := []limiter.Policy{
				{Limit: 20, Period: hour, Algorithm: alg},
				{Limit: 20, Period: 2 * hour, Algorithm: alg},
			}
			if alg == limiter.GCRA {
				changed = append(changed, limiter.Policy{Limit: 20, Period: 2 * hour, Burst: 19})
			}
			for _, q := range changed {
				acquire(t, s, name, 1)
				if put(t, s, name, q) {
					t.Errorf("Put(%+v) over an existing limiter: got created=true, want false", q)
				}
				want := q.Normalize().Burst
				if alg == limiter.SlidingLog {
					want = q.Limit
				}
				wantRemaining(t, s, name, want)
			}
			// Switching the algorithm starts full as well.
			other := algorithms[0]
			if alg == other {
				other = algorithms[1]
			}
			acquire(t, s, name, 3)
			put(t, s, name, limiter.Policy{Limit: 20, Period: 2 * hour, Algorithm: other})
			wantRemaining(t, s, name, 20)
			def, err := s.Get(ctx(t), name)
			if err != nil || def.Policy.Algorithm != other {
				t.Errorf("Get after switching to %s: got %+v, %v", other, def, err)
			}
		})
	}
}

func testDeleteThenPut(t *testing.T, s limiter.Store) {
	for _, alg := range algorithms {
		name := "d-" + string(alg)
		p := limiter.Policy{Limit: 3, Period: hour, Algorithm: alg}
		put(t, s, name, p)
		acquire(t, s, name, 3)
		if err := s.Delete(ctx(t), name); err != nil {
			t.Fatal(err)
		}
		if !put(t, s, name, p) {
			t.Errorf("%s: Put after Delete: got created=false, want true", alg)
		}
		wantRemaining(t, s, name, 3)
		if page, err := s.List(ctx(t), "", 10); err != nil || !slices.ContainsFunc(page, func(d limiter.Definition) bool { return d.Name == name }) {
			t.Errorf("%s: List after Delete and Put: got %+v, %v, want %q listed", alg, page, err, name)
		}
	}
}

func testInvalidInput(t *testing.T, s limiter.Store) {
	c := ctx(t)
	for _, p := range []limiter.Policy{
		{Limit: 0, Period: time.Second},
		{Limit: 1, Period: time.Microsecond},
		{Limit: 5, Period: time.Second, Burst: 6},
		{Limit: 5, Period: time.Second, Algorithm: limiter.SlidingLog, Burst: 1},
		{Limit: 5, Period: time.Second, Algorithm: "leaky"},
	} {
		_, err := s.Put(c, limiter.Definition{Name: "bad", Policy: p})
		wantErr(t, fmt.Sprintf("Put(%+v)", p), err, limiter.ErrInvalidPolicy)
	}
	_, err := s.Get(c, "bad")
	wantErr(t, "Get after rejected Puts", err, limiter.ErrNotFound)
	put(t, s, "ok", limiter.Policy{Limit: 5, Period: hour})
	for _, n := range []int64{0, -1, limiter.MaxLimit + 1} {
		_, err := s.Acquire(c, "ok", n)
		wantErr(t, fmt.Sprintf("Acquire(%d)", n), err, limiter.ErrInvalidPermits)
	}
	wantRemaining(t, s, "ok", 5)
}
