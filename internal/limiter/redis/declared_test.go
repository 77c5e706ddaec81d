package redis

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
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

// TestDeclaredGroupsAndKeys checks declared limiters in groups and keyed
// ones, on a standalone Redis and on a Redis Cluster, where a group's keys
// and a keyed limiter's tables must share a slot.
func TestDeclaredGroupsAndKeys(t *testing.T) {
	for _, tt := range []struct {
		name  string
		addrs func(testing.TB) []string
	}{
		{"Standalone", func(t testing.TB) []string { return []string{redistest.Standalone(t)} }},
		{"Cluster", redistest.Cluster},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, tt.addrs(t)...)
			t.Run("CreateGroupedKeyed", func(t *testing.T) { testCreateGroupedKeyed(t, c) })
			t.Run("CreateDropsStaleKeys", func(t *testing.T) { testCreateDropsStaleKeys(t, c) })
			t.Run("LazyDeclaredGroupedKeyed", func(t *testing.T) { testLazyDeclaredGroupedKeyed(t, c) })
			t.Run("DeclareGroupConflict", func(t *testing.T) { testDeclareGroupConflict(t, c) })
		})
	}
}

// Declared limiters of one group, one of them keyed, and a keyed one in no
// group.
var (
	perUser  = limiter.Definition{Name: "per-user", Policy: hourly, Group: "search", Keyed: true, MaxKeys: 3}
	total    = limiter.Definition{Name: "total", Policy: limiter.Policy{Limit: 8, Period: time.Hour}, Group: "search"}
	perRoute = limiter.Definition{Name: "per-route", Policy: logged, Keyed: true} // MaxKeys: the default
	grouped  = []limiter.Definition{perUser, total, perRoute}
)

// loseAll deletes every key under s's prefix, the directory of groups
// included, as a Redis that restarted empty would have lost them, and the
// scripts of every node.
func loseAll(t *testing.T, c rueidis.Client, s *Store) {
	t.Helper()
	ctx := context.Background()
	for addr, node := range c.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(s.prefix+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Fatalf("SCAN on %s: %v", addr, err)
			}
			for _, key := range e.Elements {
				if err := c.Do(ctx, c.B().Del().Key(key).Build()).Error(); err != nil {
					t.Fatalf("DEL %s: %v", key, err)
				}
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	flushScripts(t, c)
}

// checkDefinitions fails t unless s, and a Store of another replica that
// has met none of them, find defs as declared: in their groups, keyed with
// their bounds of keys, and listed.
func checkDefinitions(t *testing.T, c rueidis.Client, s *Store, step string, defs ...limiter.Definition) {
	t.Helper()
	ctx := context.Background()
	other, err := New(c, s.prefix, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct {
		name string
		s    *Store
	}{{"this replica", s}, {"another replica", other}} {
		for _, want := range defs {
			want = want.Normalize()
			if got, err := st.s.Get(ctx, want.Name); err != nil || got != want {
				t.Errorf("%s: Get(%s) through %s: got %+v, %v; want %+v", step, want.Name, st.name, got, err, want)
			}
		}
	}
	listed, err := other.List(ctx, "", 100)
	if err != nil {
		t.Fatalf("%s: List: %v", step, err)
	}
	byName := make(map[string]limiter.Definition)
	for _, d := range listed {
		byName[d.Name] = d
	}
	for _, want := range defs {
		if got := byName[want.Name]; got != want.Normalize() {
			t.Errorf("%s: List through another replica: got %+v for %s, want %+v", step, got, want.Name, want.Normalize())
		}
	}
}

// generation returns the generation of the keyed limiter def.
func generation(t *testing.T, c rueidis.Client, s *Store, def limiter.Definition) string {
	t.Helper()
	gen, err := c.Do(context.Background(), c.B().Hget().Key(s.keysIn(def.Name, def.Group)[0]).Field(fieldGen).Build()).ToString()
	if err != nil {
		t.Fatalf("HGET gen of %s: %v", def.Name, err)
	}
	return gen
}

// Create makes declared limiters as Put does: a group's limiters under its
// keys and in the directory, where another replica finds them, and a keyed
// one with its bound of keys and a generation; after Redis lost them all,
// directory included, it makes them so again.
func testCreateGroupedKeyed(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	for _, step := range []string{"absent", "lost"} {
		if step == "lost" {
			loseAll(t, c, s)
		}
		created, err := s.Create(ctx, grouped...)
		if err != nil || !slices.Equal(created, []string{"per-user", "total", "per-route"}) {
			t.Fatalf("%s: Create: got %v, %v; want all three created", step, created, err)
		}
		checkDefinitions(t, c, s, step, grouped...)
		if generation(t, c, s, perUser) == "" || generation(t, c, s, perRoute) == "" {
			t.Errorf("%s: a keyed limiter was created without a generation", step)
		}

		// The group decides together, keys included.
		items := []limiter.Item{{Name: "per-user", Key: "u1", Permits: 2}, {Name: "total", Permits: 2}}
		v, err := s.Decide(ctx, items, limiter.Take, "")
		if err != nil || !v.Allowed || v.Checks[0].Remaining != 3 || v.Checks[1].Remaining != 6 {
			t.Errorf("%s: Decide(per-user u1 2, total 2): got %+v, %v; want allowed, 3 and 6 remaining", step, v, err)
		}
		// per-user remembers at most 3 keys: a fourth, all of them
		// limited, finds no room.
		for _, key := range []string{"u1", "u2", "u3"} {
			if d, err := s.AcquireKey(ctx, "per-user", key, 5-map[string]int64{"u1": 2}[key]); err != nil || !d.Allowed {
				t.Fatalf("%s: AcquireKey(per-user, %s): got %+v, %v; want allowed", step, key, d, err)
			}
		}
		if d, err := s.AcquireKey(ctx, "per-user", "u4", 1); err != nil || d.Allowed || !d.KeysFull {
			t.Errorf("%s: AcquireKey(per-user, u4) with 3 keys limited: got %+v, %v; want denied, keys full", step, d, err)
		}
		if d, err := s.AcquireKey(ctx, "per-route", "/v1/search", 7); err != nil || !d.Allowed || d.Remaining != 0 {
			t.Errorf("%s: AcquireKey(per-route, /v1/search, 7): got %+v, %v; want allowed, 0 remaining", step, d, err)
		}
		if _, err := s.Acquire(ctx, "per-route", 1); !errors.Is(err, limiter.ErrKeyMismatch) {
			t.Errorf("%s: Acquire(per-route) without a key: got %v, want ErrKeyMismatch", step, err)
		}
	}

	// Present: left as they are, state and generation included.
	gen := generation(t, c, s, perUser)
	created, err := s.Create(ctx, grouped...)
	if err != nil || len(created) != 0 {
		t.Fatalf("present: Create: got %v, %v; want nothing created", created, err)
	}
	if got := generation(t, c, s, perUser); got != gen {
		t.Errorf("present: per-user's generation went from %s to %s, want it kept", gen, got)
	}
	if a, err := s.AvailableKey(ctx, "per-user", "u1"); err != nil || a.Remaining != 0 {
		t.Errorf("present: AvailableKey(per-user, u1): got %+v, %v; want its state kept, 0 remaining", a, err)
	}
}

// A keyed limiter that lost its definition but not its table of keys (a
// Delete interrupted, or keys evicted one by one) is created with a new
// generation and an empty table: its keys start full, and its old keys take
// no room.
func testCreateDropsStaleKeys(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	if _, err := s.Create(ctx, perUser); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b", "c"} {
		if d, err := s.AcquireKey(ctx, "per-user", key, 5); err != nil || !d.Allowed {
			t.Fatalf("AcquireKey(%s, 5): got %+v, %v; want allowed", key, d, err)
		}
	}
	gen := generation(t, c, s, perUser)
	lose(t, c, s, "per-user") // its definition and the name index, not its table
	if created, err := s.Create(ctx, perUser); err != nil || !slices.Equal(created, []string{"per-user"}) {
		t.Fatalf("Create after the definition was lost: got %v, %v; want [per-user]", created, err)
	}
	if got := generation(t, c, s, perUser); got == gen {
		t.Errorf("generation after Create: got the lost definition's %s, want a new one", got)
	}
	for _, key := range []string{"a", "d", "e"} {
		if d, err := s.AcquireKey(ctx, "per-user", key, 1); err != nil || !d.Allowed || d.Remaining != 4 {
			t.Errorf("AcquireKey(%s, 1) after Create: got %+v, %v; want allowed from a full bucket, 4 remaining", key, d, err)
		}
	}
}

// A Lazy store brings declared limiters of a group, keyed ones included,
// back as they were declared when a call finds them missing, and a
// replica that declares them again keeps their state.
func testLazyDeclaredGroupedKeyed(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	l := NewLazy(grouped, time.Minute)
	l.Set(s)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	l.Declare(ctx, quiet)
	checkDefinitions(t, c, s, "declared", grouped...)

	// Declared again, as by a replica that restarts: the same definitions
	// keep their state.
	if d, err := l.AcquireKey(ctx, "per-user", "u1", 2); err != nil || !d.Allowed || d.Remaining != 3 {
		t.Fatalf("AcquireKey(per-user, u1, 2): got %+v, %v; want allowed, 3 remaining", d, err)
	}
	l.Declare(ctx, quiet)
	if a, err := l.AvailableKey(ctx, "per-user", "u1"); err != nil || a.Remaining != 3 {
		t.Errorf("AvailableKey(per-user, u1) after Declare again: got %+v, %v; want 3 remaining", a, err)
	}

	loseAll(t, c, s)
	items := []limiter.Item{{Name: "per-user", Key: "u1", Permits: 1}, {Name: "total", Permits: 3}}
	if v, err := l.Decide(ctx, items, limiter.Take, ""); err != nil || !v.Allowed || v.Checks[0].Remaining != 4 || v.Checks[1].Remaining != 5 {
		t.Errorf("Decide after Redis lost the group: got %+v, %v; want allowed from full limiters, 4 and 5 remaining", v, err)
	}
	loseAll(t, c, s)
	if d, err := l.AcquireKey(ctx, "per-route", "/v1/a", 2); err != nil || !d.Allowed || d.Remaining != 5 {
		t.Errorf("AcquireKey(per-route) after Redis lost it: got %+v, %v; want allowed, 5 remaining", d, err)
	}
	if d, err := l.AcquireKey(ctx, "per-user", "u9", 1); err != nil || !d.Allowed || d.Remaining != 4 {
		t.Errorf("AcquireKey(per-user) after Redis lost it: got %+v, %v; want allowed, 4 remaining", d, err)
	}
	checkDefinitions(t, c, s, "brought back by calls", perUser, perRoute)
}

// logRecords collects the JSON records of a logger, which may write from
// another goroutine.
type logRecords struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *logRecords) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.Write(p)
}

// notCreated returns the error of each record that says a limiter from the
// config file was not created, by limiter name.
func (r *logRecords) notCreated(t *testing.T) map[string][]string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]string)
	for _, line := range bytes.Split(bytes.TrimSpace(r.buf.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var rec struct{ Msg, Name, Error string }
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log record %s: %v", line, err)
		}
		if rec.Msg == "limiter from the config file not created" {
			out[rec.Name] = append(out[rec.Name], rec.Error)
		}
	}
	return out
}

// A declared limiter whose name exists in another group (or in one when
// declared in none) is not moved: Declare logs that it was not created and
// leaves it as it is; Keep and calls leave it too, and Keep logs it once.
func testDeclareGroupConflict(t *testing.T, c rueidis.Client) {
	ctx, cancel := context.WithCancel(context.Background())
	s := newStore(t, c)
	existing := []limiter.Definition{
		{Name: "x", Policy: replace, Group: "a"},
		{Name: "y", Policy: replace, Group: "a"},
	}
	for _, def := range existing {
		if _, err := s.Put(ctx, def); err != nil {
			t.Fatal(err)
		}
	}
	declared := []limiter.Definition{
		{Name: "x", Policy: hourly, Group: "b", Keyed: true},
		{Name: "y", Policy: hourly}, // in no group
		{Name: "z", Policy: hourly, Group: "b"},
	}
	var logs logRecords
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	l := NewLazy(declared, time.Minute)
	l.Set(s)
	l.Declare(ctx, logger)
	checkConflicts := func(step string, times int) {
		t.Helper()
		got := logs.notCreated(t)
		for _, name := range []string{"x", "y"} {
			if len(got[name]) != times || !strings.Contains(got[name][0], "limiter is in another group") {
				t.Errorf("%s: records of %s not created: got %q, want %d saying it is in another group", step, name, got[name], times)
			}
		}
		if len(got["z"]) != 0 {
			t.Errorf("%s: records of z not created: got %q, want none", step, got["z"])
		}
		checkDefinitions(t, c, s, step, append(existing, declared[2])...)
	}
	checkConflicts("Declare", 1)

	created, err := s.Create(ctx, declared...)
	if !errors.Is(err, limiter.ErrGroupConflict) || len(created) != 0 {
		t.Errorf("Create: got %v, %v; want nothing created and ErrGroupConflict", created, err)
	}
	if d, err := l.Acquire(ctx, "x", 1); err != nil || !d.Allowed || d.Limit != replace.Limit {
		t.Errorf("Acquire(x) through the Lazy store: got %+v, %v; want the existing limiter's decision", d, err)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Keep(ctx, 5*time.Millisecond, logger)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	// z's return shows that Keep checked, and it checks often: it logs each
	// conflict once all the same.
	if err := s.Delete(ctx, "z"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Contains(listed(t, s), "z") {
		if time.Now().After(deadline) {
			t.Fatalf("Keep did not bring z back within 10s: List got %v", listed(t, s))
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	checkConflicts("Keep", 2)
}
