package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// lose deletes the keys of s's limiters names and its name index, as a
// Redis that restarted empty would have lost them, and the scripts of every
// node.
func lose(t *testing.T, c rueidis.Client, s *Store, names ...string) {
	t.Helper()
	ctx := context.Background()
	for _, name := range names {
		if err := c.Do(ctx, c.B().Del().Key(s.keys(name)...).Build()).Error(); err != nil {
			t.Fatalf("DEL %s: %v", name, err)
		}
	}
	if err := c.Do(ctx, c.B().Del().Key(s.names).Build()).Error(); err != nil {
		t.Fatalf("DEL %s: %v", s.names, err)
	}
	flushScripts(t, c)
}

// listed returns the names List shows.
func listed(t *testing.T, s *Store) []string {
	t.Helper()
	defs, err := s.List(context.Background(), "", 100)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var names []string
	for _, d := range defs {
		names = append(names, d.Name)
	}
	return names
}

var (
	hourly  = limiter.Policy{Limit: 5, Period: time.Hour}
	logged  = limiter.Policy{Limit: 7, Period: time.Hour, Algorithm: limiter.SlidingLog}
	replace = limiter.Policy{Limit: 50, Period: time.Minute}
)

// Create creates what is absent, leaves what exists as it is, policy and
// state, and lists what it created.
func testCreate(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	defs := []limiter.Definition{{Name: "a", Policy: hourly}, {Name: "b", Policy: logged}}

	steps := []struct {
		name    string
		before  func()
		created []string
	}{
		{name: "absent", before: func() {}, created: []string{"a", "b"}},
		{name: "present", before: func() {
			put(t, s, "a", replace)
			if _, err := s.Acquire(ctx, "b", 3); err != nil {
				t.Fatal(err)
			}
		}, created: nil},
		{name: "lost", before: func() { lose(t, c, s, "a", "b") }, created: []string{"a", "b"}},
	}
	for _, step := range steps {
		step.before()
		created, err := s.Create(ctx, defs...)
		if err != nil || !slices.Equal(created, step.created) {
			t.Fatalf("%s: Create: got %v, %v, want %v", step.name, created, err, step.created)
		}
		if got := listed(t, s); !slices.Equal(got, []string{"a", "b"}) {
			t.Errorf("%s: List after Create: got %v, want [a b]", step.name, got)
		}
		wantA, wantB := hourly, int64(7)
		if step.name == "present" {
			wantA, wantB = replace, 4
		}
		if got, err := s.Get(ctx, "a"); err != nil || got.Policy != wantA.Normalize() {
			t.Errorf("%s: Get(a): got %+v, %v, want %+v", step.name, got, err, wantA.Normalize())
		}
		if got, err := s.Available(ctx, "b"); err != nil || got.Remaining != wantB {
			t.Errorf("%s: Available(b): got %+v, %v, want %d remaining", step.name, got, err, wantB)
		}
	}
}

// A Lazy store's calls that find a declared limiter missing create it and
// decide as if it had never gone; undeclared names stay unknown; a
// declared limiter replaced through Put stays replaced.
func testLazyDeclared(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	l := NewLazy([]limiter.Definition{{Name: "d", Policy: hourly}, {Name: "e", Policy: logged}}, time.Minute)
	l.Set(s)
	l.Declare(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)))

	lose(t, c, s, "d", "e")
	if d, err := l.Acquire(ctx, "d", 2); err != nil || !d.Allowed || d.Remaining != 3 {
		t.Errorf("Acquire(d, 2) after Redis lost it: got %+v, %v, want allowed, 3 remaining", d, err)
	}
	if a, err := l.Available(ctx, "e"); err != nil || a.Remaining != 7 {
		t.Errorf("Available(e) after Redis lost it: got %+v, %v, want 7 remaining", a, err)
	}
	lose(t, c, s, "d", "e")
	if def, err := l.Get(ctx, "e"); err != nil || def.Policy != logged.Normalize() {
		t.Errorf("Get(e) after Redis lost it: got %+v, %v, want %+v", def, err, logged.Normalize())
	}
	if _, err := l.Acquire(ctx, "nowhere", 1); !errors.Is(err, limiter.ErrNotFound) {
		t.Errorf("Acquire(nowhere): got %v, want ErrNotFound", err)
	}

	lose(t, c, s, "d", "e")
	reqs := []limiter.Request{{Name: "e", Permits: 3}, {Name: "nowhere", Permits: 1}, {Name: "d", Permits: 1}, {Name: "e", Permits: 5}}
	out := make([]limiter.Result, len(reqs))
	l.AcquireBatch(ctx, reqs, out)
	want := []struct {
		allowed   bool
		remaining int64
		notFound  bool
	}{{true, 4, false}, {false, 0, true}, {true, 4, false}, {false, 4, false}}
	for i, w := range want {
		r := out[i]
		if errors.Is(r.Err, limiter.ErrNotFound) != w.notFound || (!w.notFound && (r.Err != nil || r.Decision.Allowed != w.allowed || r.Decision.Remaining != w.remaining)) {
			t.Errorf("batch result %d after Redis lost d and e: got %+v, want allowed=%v remaining=%d notFound=%v", i, r, w.allowed, w.remaining, w.notFound)
		}
	}
	if got := listed(t, s); !slices.Equal(got, []string{"d", "e"}) {
		t.Errorf("List after the calls: got %v, want [d e]", got)
	}

	// Replaced through the API: a call never finds it missing, and Create
	// leaves it.
	if _, err := l.Put(ctx, limiter.Definition{Name: "d", Policy: replace}); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Acquire(ctx, "d", 1); err != nil || d.Limit != replace.Limit {
		t.Errorf("Acquire(d) after it was replaced: got %+v, %v, want the replacement's limit %d", d, err, replace.Limit)
	}
	// Deleted through the API: the rule is "declared means created if
	// absent", so its next use brings it back, with the declared policy.
	if err := l.Delete(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Acquire(ctx, "d", 1); err != nil || d.Limit != hourly.Limit {
		t.Errorf("Acquire(d) after it was deleted: got %+v, %v, want the declared limit %d", d, err, hourly.Limit)
	}
}

// A batch that found a declared limiter both present and missing keeps its
// results: deciding the missing ones again would decide them after later
// requests on the same limiter.
func testRestoreBatchKeepsOrder(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	found := limiter.Result{Decision: limiter.Decision{Allowed: true, Limit: 5, Remaining: 4}}
	missing := limiter.Result{Err: notFound("acquire", "d")}
	for _, tc := range []struct {
		name string
		out  []limiter.Result
	}{
		{name: "missing first", out: []limiter.Result{missing, found}},
		{name: "found first", out: []limiter.Result{found, missing}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, c)
			l := NewLazy([]limiter.Definition{{Name: "d", Policy: hourly}}, time.Minute)
			l.Set(s)
			reqs := []limiter.Request{{Name: "d", Permits: 1}, {Name: "d", Permits: 1}}
			out := slices.Clone(tc.out)
			l.restoreBatch(ctx, s, reqs, out)
			for i := range out {
				if errors.Is(out[i].Err, limiter.ErrNotFound) != errors.Is(tc.out[i].Err, limiter.ErrNotFound) || out[i].Decision != tc.out[i].Decision {
					t.Errorf("result %d after restoreBatch: got %+v, want it unchanged, %+v", i, out[i], tc.out[i])
				}
			}
			if _, err := s.Get(ctx, "d"); !errors.Is(err, limiter.ErrNotFound) {
				t.Errorf("Get(d): got %v, want ErrNotFound: nothing created", err)
			}
		})
	}
}

// Keep brings back a declared limiter that nothing uses, and leaves a
// replaced one replaced.
func testKeep(t *testing.T, c rueidis.Client) {
	ctx, cancel := context.WithCancel(context.Background())
	s := newStore(t, c)
	l := NewLazy([]limiter.Definition{{Name: "d", Policy: hourly}, {Name: "e", Policy: logged}}, time.Minute)
	l.Set(s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Keep(ctx, 10*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitListed := func(step string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !slices.Equal(listed(t, s), []string{"d", "e"}) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: List: got %v 10s on, want [d e]", step, listed(t, s))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitListed("start")
	put(t, s, "d", replace)
	// e's return shows that Keep checked after d was replaced.
	lose(t, c, s, "e")
	waitListed("after e was lost")
	if def, err := s.Get(ctx, "d"); err != nil || def.Policy != replace.Normalize() {
		t.Errorf("Get(d) after Keep ran: got %+v, %v, want the replacement %+v", def, err, replace.Normalize())
	}
}

// Until Set, every call fails as unavailable, and nothing waits.
func TestLazyNotConnected(t *testing.T) {
	l := NewLazy([]limiter.Definition{{Name: "d", Policy: hourly}}, time.Second)
	ctx := context.Background()
	calls := []struct {
		name string
		call func() error
	}{
		{"Put", func() error { _, err := l.Put(ctx, limiter.Definition{Name: "d", Policy: hourly}); return err }},
		{"Get", func() error { _, err := l.Get(ctx, "d"); return err }},
		{"List", func() error { _, err := l.List(ctx, "", 10); return err }},
		{"Delete", func() error { return l.Delete(ctx, "d") }},
		{"Acquire", func() error { _, err := l.Acquire(ctx, "d", 1); return err }},
		{"Available", func() error { _, err := l.Available(ctx, "d"); return err }},
		{"AcquireBatch", func() error {
			out := make([]limiter.Result, 2)
			l.AcquireBatch(ctx, []limiter.Request{{Name: "d", Permits: 1}, {Name: "x", Permits: 1}}, out)
			return errors.Join(out[0].Err, out[1].Err)
		}},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, ErrNotConnected) || !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("got %v, want ErrNotConnected, which wraps ErrUnavailable", err)
			}
		})
	}
}

// Declared limiters count against the maximum as those created through
// the API do: Create brings back none that would pass it, and leaves what
// is there alone.
func testCreateWithinBound(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s, err := New(c, fmt.Sprintf("t%d:", prefixes.Add(1)), 2)
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, "x", hourly)
	put(t, s, "y", hourly)
	created, err := s.Create(ctx, limiter.Definition{Name: "a", Policy: hourly}, limiter.Definition{Name: "x", Policy: logged})
	if !errors.Is(err, limiter.ErrTooManyLimiters) || len(created) != 0 {
		t.Fatalf("Create(a, x) with 2 of 2 names taken: got %v, %v; want nothing created and ErrTooManyLimiters", created, err)
	}
	if got := listed(t, s); !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("List after Create: got %v, want [x y]", got)
	}
	if got, err := s.Get(ctx, "x"); err != nil || got.Policy != hourly.Normalize() {
		t.Errorf("Get(x): got %+v, %v; want the policy put, %+v", got, err, hourly.Normalize())
	}
	if err := s.Delete(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	if created, err := s.Create(ctx, limiter.Definition{Name: "a", Policy: hourly}); err != nil || !slices.Equal(created, []string{"a"}) {
		t.Errorf("Create(a) after a delete made room: got %v, %v; want [a]", created, err)
	}
}
