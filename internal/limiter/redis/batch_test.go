package redis

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// testBatch checks AcquireBatch on the server c talks to, standalone or
// Cluster: each request is decided and fails as Acquire decides it.
func testBatch(t *testing.T, c rueidis.Client) {
	t.Run("MatchesAcquire", func(t *testing.T) { testBatchMatchesAcquire(t, c) })
	t.Run("EveryNode", func(t *testing.T) { testBatchEveryNode(t, c) })
	t.Run("NoScript", func(t *testing.T) { testBatchNoScript(t, c) })
	t.Run("NoScriptMidBatch", func(t *testing.T) { testBatchNoScriptMidBatch(t, c) })
	t.Run("CancelledContext", func(t *testing.T) { testBatchCancelled(t, c) })
}

// batchOutcome is what a test expects of one result.
type batchOutcome struct {
	allowed   bool
	remaining int64
	exceeds   bool
	err       error // a sentinel the result's error wraps, or nil
}

// batchMatchesAcquire defines defs in two stores, decides reqs as one batch
// in the first under ctx, then one Acquire at a time in the second, and
// checks that each result is the one Acquire gave: the same decision (but
// for the spans, which the time between the two calls moves) or the very
// same error. Then each result must be its want, so that both ways being
// wrong alike fails too. It returns the batch's store.
func batchMatchesAcquire(t *testing.T, ctx context.Context, c rueidis.Client, defs []limiter.Definition, reqs []limiter.Request, want []batchOutcome) *Store {
	t.Helper()
	batch, single := newStore(t, c), newStore(t, c)
	for _, d := range defs {
		put(t, batch, d.Name, d.Policy)
		put(t, single, d.Name, d.Policy)
	}
	out := make([]limiter.Result, len(reqs))
	batch.AcquireBatch(ctx, reqs, out)
	for i, r := range reqs {
		got := out[i]
		d, err := single.Acquire(ctx, r.Name, r.Permits)
		switch {
		case (got.Err == nil) != (err == nil):
			t.Errorf("request %d %+v: batch got %+v, Acquire got %+v, %v", i, r, got, d, err)
			continue
		case err != nil:
			if got.Err.Error() != err.Error() || errors.Is(got.Err, limiter.ErrNotFound) != errors.Is(err, limiter.ErrNotFound) {
				t.Errorf("request %d %+v: batch got error %q, Acquire got %q", i, r, got.Err, err)
			}
		default:
			g := got.Decision
			if g.Allowed != d.Allowed || g.Permits != d.Permits || g.Remaining != d.Remaining || g.Limit != d.Limit || g.ExceedsCapacity != d.ExceedsCapacity {
				t.Errorf("request %d %+v: batch got %+v, Acquire got %+v", i, r, g, d)
			}
		}
		w := want[i]
		if w.err != nil {
			if !errors.Is(got.Err, w.err) {
				t.Errorf("request %d %+v: got %+v, want an error wrapping %v", i, r, got, w.err)
			}
			continue
		}
		g := got.Decision
		if got.Err != nil || g.Allowed != w.allowed || g.Remaining != w.remaining || g.ExceedsCapacity != w.exceeds || g.Permits != r.Permits {
			t.Errorf("request %d %+v: got %+v, want allowed=%v remaining=%d exceeds_capacity=%v", i, r, got, w.allowed, w.remaining, w.exceeds)
		}
	}
	return batch
}

// A batch mixing limiters, an unknown one and repeated requests on one
// limiter decides each request as Acquire does, in order, for both
// algorithms.
func testBatchMatchesAcquire(t *testing.T, c rueidis.Client) {
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		t.Run(string(alg), func(t *testing.T) {
			defs := []limiter.Definition{
				{Name: "a", Policy: limiter.Policy{Limit: 5, Period: time.Hour, Algorithm: alg}},
				{Name: "b", Policy: limiter.Policy{Limit: 9, Period: time.Hour, Algorithm: alg}},
				{Name: "c", Policy: limiter.Policy{Limit: 1, Period: time.Hour, Algorithm: alg}},
			}
			reqs := []limiter.Request{
				{Name: "a", Permits: 3},
				{Name: "b", Permits: 4},
				{Name: "a", Permits: 3}, // 2 left: denied
				{Name: "missing", Permits: 1},
				{Name: "c", Permits: 1},
				{Name: "a", Permits: 2},
				{Name: "b", Permits: 5},
				{Name: "c", Permits: 1}, // denied
				{Name: "b", Permits: 1}, // denied
				{Name: "a", Permits: 6}, // more than it ever holds
				{Name: "missing", Permits: 2},
			}
			want := []batchOutcome{
				{allowed: true, remaining: 2},
				{allowed: true, remaining: 5},
				{remaining: 2},
				{err: limiter.ErrNotFound},
				{allowed: true},
				{allowed: true},
				{allowed: true},
				{},
				{},
				{exceeds: true},
				{err: limiter.ErrNotFound},
			}
			batchMatchesAcquire(t, context.Background(), c, defs, reqs, want)
		})
	}
}

// A batch whose limiters live on every node (every master of a cluster) is
// decided on each of them.
func testBatchEveryNode(t *testing.T, c rueidis.Client) {
	var (
		defs []limiter.Definition
		reqs []limiter.Request
		want []batchOutcome
	)
	const n = 30
	for i := range n {
		name := fmt.Sprintf("spread-%d", i)
		alg := []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog}[i%2]
		defs = append(defs, limiter.Definition{Name: name, Policy: limiter.Policy{Limit: 2, Period: time.Hour, Algorithm: alg}})
	}
	// Each limiter's second request comes after the others' first: its
	// order holds across the groups the client sends to different nodes.
	for _, round := range []struct {
		permits int64
		want    batchOutcome
	}{
		{1, batchOutcome{allowed: true, remaining: 1}},
		{2, batchOutcome{remaining: 1}},
		{1, batchOutcome{allowed: true}},
	} {
		for _, d := range defs {
			reqs = append(reqs, limiter.Request{Name: d.Name, Permits: round.permits})
			want = append(want, round.want)
		}
	}
	ctx := context.Background()
	s := batchMatchesAcquire(t, ctx, c, defs, reqs, want)
	for addr, node := range c.Nodes() {
		keys, err := node.Do(ctx, node.B().Keys().Pattern(s.prefix+"{*}:def").Build()).AsStrSlice()
		if err != nil || len(keys) == 0 {
			t.Errorf("node %s holds %d of the batch's limiters (%v), want some", addr, len(keys), err)
		}
	}
}

// flushScripts empties the script cache of every node.
func flushScripts(t *testing.T, c rueidis.Client) {
	t.Helper()
	ctx := context.Background()
	for addr, node := range c.Nodes() {
		if err := node.Do(ctx, node.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatalf("SCRIPT FLUSH on %s: %v", addr, err)
		}
	}
}

// loadScripts puts the acquire and decide scripts back in every node's
// cache, as another client's EVAL would.
func loadScripts(t *testing.T, c rueidis.Client) {
	t.Helper()
	ctx := context.Background()
	for addr, node := range c.Nodes() {
		for _, source := range []string{acquireSource, decideSource} {
			if err := node.Do(ctx, node.B().ScriptLoad().Script(source).Build()).Error(); err != nil {
				t.Fatalf("SCRIPT LOAD on %s: %v", addr, err)
			}
		}
	}
}

// After SCRIPT FLUSH a batch still runs, through EVAL, every request in
// order.
func testBatchNoScript(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		t.Run(string(alg), func(t *testing.T) {
			s := newStore(t, c)
			policy := limiter.Policy{Limit: 5, Period: time.Hour, Algorithm: alg}
			put(t, s, "x", policy)
			put(t, s, "y", policy)
			flushScripts(t, c)
			reqs := []limiter.Request{{Name: "x", Permits: 3}, {Name: "y", Permits: 1}, {Name: "x", Permits: 3}, {Name: "x", Permits: 2}}
			out := make([]limiter.Result, len(reqs))
			s.AcquireBatch(ctx, reqs, out)
			for i, want := range []batchOutcome{{allowed: true, remaining: 2}, {allowed: true, remaining: 4}, {remaining: 2}, {allowed: true}} {
				if d := out[i].Decision; out[i].Err != nil || d.Allowed != want.allowed || d.Remaining != want.remaining {
					t.Errorf("request %d %+v after SCRIPT FLUSH: got %+v, want allowed=%v remaining=%d", i, reqs[i], out[i], want.allowed, want.remaining)
				}
			}
			// The fallback cached the script again where it ran.
			for addr, node := range c.Nodes() {
				keys, err := node.Do(ctx, node.B().Keys().Pattern(s.prefix+"{*}:def").Build()).AsStrSlice()
				if err != nil {
					t.Fatalf("KEYS on %s: %v", addr, err)
				}
				if len(keys) == 0 {
					continue
				}
				exists, err := node.Do(ctx, node.B().ScriptExists().Sha1(acquireSHA1).Build()).AsIntSlice()
				if err != nil || len(exists) != 1 || exists[0] != 1 {
					t.Errorf("SCRIPT EXISTS on %s, which holds %v: got %v, %v, want [1]", addr, keys, exists, err)
				}
			}
		})
	}
}

// stepClient sends the commands of its first DoMulti one at a time, calling
// before(j) ahead of command j, so that a test can change the server in the
// middle of a batch's pipeline. Later calls go through unchanged.
type stepClient struct {
	rueidis.Client
	before   func(j int)
	stepped  bool
	commands int // in the first DoMulti
}

func (c *stepClient) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	if c.stepped {
		return c.Client.DoMulti(ctx, multi...)
	}
	c.stepped, c.commands = true, len(multi)
	replies := make([]rueidis.RedisResult, len(multi))
	for j, cmd := range multi {
		c.before(j)
		replies[j] = c.Client.Do(ctx, cmd)
	}
	return replies
}

// When the script goes away in the middle of a batch, the runs that
// answered NOSCRIPT run again, in order, unless a later run on the same
// limiter ran meanwhile (the script came back): that one's requests fail,
// wrapping ErrUnavailable, and take nothing.
func testBatchNoScriptMidBatch(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	sc := &stepClient{Client: c}
	s := newStore(t, sc)
	const limit = 1000
	put(t, s, "a", limiter.Policy{Limit: limit, Period: time.Hour})
	put(t, s, "b", limiter.Policy{Limit: limit, Period: time.Hour})
	loadScripts(t, c)
	sc.before = func(j int) {
		switch j {
		case 1, 4:
			flushScripts(t, c)
		case 3:
			loadScripts(t, c)
		}
	}
	// A limiter's requests go in runs of maxGroup, so these make five runs:
	// a (runs), b (NOSCRIPT, runs again), a (NOSCRIPT, but the next run on
	// a runs), a (runs), b (NOSCRIPT, runs again).
	var reqs []limiter.Request
	var runOf []int
	for run, r := range []struct {
		name string
		n    int
	}{{"a", maxGroup}, {"b", maxGroup}, {"a", maxGroup}, {"a", 1}, {"b", 1}} {
		for range r.n {
			reqs = append(reqs, limiter.Request{Name: r.name, Permits: 1})
			runOf = append(runOf, run)
		}
	}
	out := make([]limiter.Result, len(reqs))
	s.AcquireBatch(ctx, reqs, out)
	if !sc.stepped || sc.commands != 5 {
		t.Fatalf("AcquireBatch pipelined %d commands through DoMulti (stepped %v), want 5", sc.commands, sc.stepped)
	}
	taken := map[string]int64{}
	for i, r := range reqs {
		got := out[i]
		if runOf[i] == 2 {
			var redisErr *rueidis.RedisError
			if !errors.Is(got.Err, limiter.ErrUnavailable) || !errors.As(got.Err, &redisErr) || !redisErr.IsNoScript() {
				t.Errorf("request %d %+v: got %+v, want a NOSCRIPT error wrapping %v", i, r, got, limiter.ErrUnavailable)
			}
			continue
		}
		taken[r.Name]++
		if want := limit - taken[r.Name]; got.Err != nil || !got.Decision.Allowed || got.Decision.Remaining != want {
			t.Errorf("request %d %+v: got %+v, want allowed with %d remaining", i, r, got, want)
		}
	}
	for _, name := range []string{"a", "b"} {
		if a, err := s.Available(ctx, name); err != nil || a.Remaining != limit-maxGroup-1 {
			t.Errorf("Available(%q) after the batch: got %+v, %v, want %d remaining", name, a, err, limit-maxGroup-1)
		}
	}
}

// A cancelled context fails every request as it fails Acquire, wrapping
// ErrUnavailable, and takes nothing.
func testBatchCancelled(t *testing.T, c rueidis.Client) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	defs := []limiter.Definition{
		{Name: "p", Policy: limiter.Policy{Limit: 5, Period: time.Hour}},
		{Name: "q", Policy: limiter.Policy{Limit: 5, Period: time.Hour, Algorithm: limiter.SlidingLog}},
	}
	reqs := []limiter.Request{{Name: "p", Permits: 1}, {Name: "q", Permits: 1}, {Name: "missing", Permits: 1}, {Name: "p", Permits: 2}}
	want := make([]batchOutcome, len(reqs))
	for i := range want {
		want[i] = batchOutcome{err: limiter.ErrUnavailable}
	}
	s := batchMatchesAcquire(t, ctx, c, defs, reqs, want)
	for _, d := range defs {
		if a, err := s.Available(context.Background(), d.Name); err != nil || a.Remaining != 5 {
			t.Errorf("Available(%q) after a cancelled batch: got %+v, %v, want 5 remaining", d.Name, a, err)
		}
	}
}
