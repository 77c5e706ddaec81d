package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// RunBound runs the checks of a store's bound on the number of limiters.
// newStores must return two stores over one new, empty set of limiters,
// holding at most maxLimiters of them, released by t's cleanup: for a
// shared backend two replicas' stores, for an in-process one the same
// store twice.
func RunBound(t *testing.T, newStores func(t *testing.T, maxLimiters int) (limiter.Store, limiter.Store)) {
	t.Run("AtTheBound", func(t *testing.T) {
		t.Parallel()
		s, _ := newStores(t, 3)
		testAtTheBound(t, s)
	})
	t.Run("ConcurrentCreates", func(t *testing.T) {
		t.Parallel()
		a, b := newStores(t, 20)
		testConcurrentCreates(t, a, b, 20)
	})
}

// testAtTheBound: at the bound, creating is refused with nothing created,
// replacing still works, and a deletion makes room for one.
func testAtTheBound(t *testing.T, s limiter.Store) {
	c := ctx(t)
	p := limiter.Policy{Limit: 5, Period: hour}
	for _, name := range []string{"a", "b", "c"} {
		if !put(t, s, name, p) {
			t.Fatalf("Put(%q) below the bound: got created=false, want true", name)
		}
	}
	refused := func(name string) {
		t.Helper()
		created, err := s.Put(c, limiter.Definition{Name: name, Policy: p})
		if created || !errors.Is(err, limiter.ErrTooManyLimiters) {
			t.Errorf("Put(%q) at the bound: got %v, %v, want an error wrapping %v", name, created, err, limiter.ErrTooManyLimiters)
		}
		if _, err := s.Get(c, name); !errors.Is(err, limiter.ErrNotFound) {
			t.Errorf("Get(%q) after a refused Put: got %v, want %v", name, err, limiter.ErrNotFound)
		}
	}
	refused("d")
	// Replacing, with the same policy or another, needs no room.
	if put(t, s, "b", p) {
		t.Error("Put(b) again at the bound: got created=true, want false")
	}
	other := limiter.Policy{Limit: 7, Period: hour, Algorithm: limiter.SlidingLog}
	if put(t, s, "c", other) {
		t.Error("Put(c) with another policy at the bound: got created=true, want false")
	}
	if def, err := s.Get(c, "c"); err != nil || def.Policy != other.Normalize() {
		t.Errorf("Get(c) after its replacement: got %+v, %v, want policy %+v", def, err, other.Normalize())
	}
	if got := names(t, s); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("List at the bound: got %v, want [a b c]", got)
	}
	if err := s.Delete(c, "a"); err != nil {
		t.Fatal(err)
	}
	if !put(t, s, "d", p) {
		t.Error("Put(d) after a deletion: got created=false, want true")
	}
	refused("e")
	if got := names(t, s); !slices.Equal(got, []string{"b", "c", "d"}) {
		t.Errorf("List at the bound: got %v, want [b c d]", got)
	}
}

// testConcurrentCreates: creations racing through two stores over the same
// limiters never pass the bound together, nor stop short of it.
func testConcurrentCreates(t *testing.T, a, b limiter.Store, maxLimiters int) {
	c := ctx(t)
	const workers, each = 8, 10
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created []string
	)
	for w := range workers {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Go(func() {
			for i := range each {
				name := fmt.Sprintf("w%d-%02d", w, i)
				ok, err := s.Put(c, limiter.Definition{Name: name, Policy: limiter.Policy{Limit: 1, Period: hour}})
				switch {
				case ok && err == nil:
					mu.Lock()
					created = append(created, name)
					mu.Unlock()
				case !errors.Is(err, limiter.ErrTooManyLimiters):
					t.Errorf("Put(%q): got %v, %v, want created or an error wrapping %v", name, ok, err, limiter.ErrTooManyLimiters)
				}
			}
		})
	}
	wg.Wait()
	slices.Sort(created)
	if len(created) != maxLimiters {
		t.Errorf("created %d limiters, want exactly the bound, %d", len(created), maxLimiters)
	}
	for _, s := range []limiter.Store{a, b} {
		if got := names(t, s); !slices.Equal(got, created) {
			t.Errorf("List: got %v, want the created %v", got, created)
		}
	}
}

// names lists every limiter's name.
func names(t *testing.T, s limiter.Store) []string {
	t.Helper()
	defs, err := s.List(ctx(t), "", 1000)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var out []string
	for _, d := range defs {
		out = append(out, d.Name)
	}
	return out
}
