package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// gateClient holds the first of its scripts (by source) it sends until
// open is closed, and counts the scripts it sends.
type gateClient struct {
	rueidis.Client
	sources    []string
	held, open chan struct{}
	once       sync.Once
	scripts    atomic.Int64
}

func newGateClient(c rueidis.Client, sources ...string) *gateClient {
	return &gateClient{Client: c, sources: sources, held: make(chan struct{}), open: make(chan struct{})}
}

func (c *gateClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	args := cmd.Commands()
	for _, src := range c.sources {
		if args[0] == "EVALSHA" && args[1] == digest(src) || args[0] == "EVAL" && args[1] == src {
			c.scripts.Add(1)
			c.once.Do(func() {
				close(c.held)
				<-c.open
			})
		}
	}
	return c.Client.Do(ctx, cmd)
}

// Acquisitions that arrive while a limiter's call is in flight wait for it,
// then go in groups of up to maxGroup, one script call each, and each is
// decided as if alone: every one is granted and sees its own remaining
// count. One that gives up while it waits fails and its group still runs.
func TestCoalesce(t *testing.T) {
	c := newClient(t, redistest.Standalone(t))
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		t.Run(string(alg), func(t *testing.T) {
			gc := newGateClient(c, acquireSource)
			s := newStore(t, gc)
			const limit, waiting = 1000, 2*maxGroup + 22
			put(t, s, "hot", limiter.Policy{Limit: limit, Period: time.Hour, Algorithm: alg})
			loadScripts(t, c) // no NOSCRIPT, no EVAL: one script per call
			ctx := context.Background()

			var wg sync.WaitGroup
			decisions := make([]limiter.Decision, waiting+1)
			errs := make([]error, waiting+1)
			acquire := func(i int) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					decisions[i], errs[i] = s.Acquire(ctx, "hot", 1)
				}()
			}
			acquire(0)
			<-gc.held
			for i := 1; i <= waiting; i++ {
				acquire(i)
			}
			quitter, quit := context.WithCancel(ctx)
			quitErr := make(chan error, 1)
			awaitQueued(t, s.acquisitions, "hot", waiting)
			go func() {
				_, err := s.Acquire(quitter, "hot", 1)
				quitErr <- err
			}()
			awaitQueued(t, s.acquisitions, "hot", waiting+1)
			quit()
			if err := <-quitErr; !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.Canceled) {
				t.Errorf("an acquisition that gave up while queued: got %v, want an error wrapping ErrUnavailable and context.Canceled", err)
			}
			close(gc.open)
			wg.Wait()

			// The first call, then the queue in groups of maxGroup.
			if got, want := gc.scripts.Load(), int64(1+(waiting+1+maxGroup-1)/maxGroup); got != want {
				t.Errorf("scripts sent: got %d, want %d", got, want)
			}
			var remaining []int64
			for i, d := range decisions {
				if errs[i] != nil || !d.Allowed || d.Limit != limit {
					t.Fatalf("acquisition %d: got %+v, %v, want a grant", i, d, errs[i])
				}
				remaining = append(remaining, d.Remaining)
			}
			// Each saw the count after its own grant: the queued quitter's
			// grant came before some of them and was taken too.
			slices.Sort(remaining)
			slices.Reverse(remaining)
			skipped := 0
			for i, r := range remaining {
				if want := int64(limit - 1 - i - skipped); r != want {
					if skipped == 0 && r == want-1 {
						skipped = 1
						continue
					}
					t.Fatalf("remaining counts, highest first: got %v, want each from %d down, once, with one gap", remaining, limit-1)
				}
			}
			a, err := s.Available(ctx, "hot")
			if want := int64(limit - waiting - 2); err != nil || a.Remaining != want {
				t.Errorf("Available: got %+v, %v, want %d remaining (every grant, the quitter's too)", a, err, want)
			}
		})
	}
}

// awaitQueued waits until n calls on key wait for its run in flight in q.
func awaitQueued(t *testing.T, q interface{ queued(string) int }, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		queued := q.queued(key)
		if queued == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued after 10s, want %d", queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Joint decisions in one slot that arrive while a decision's run is in
// flight wait for it, then go in groups of up to maxGroup, one run of
// decide_group.lua each, and each is decided as if alone: every one is
// granted, on its own key of a keyed limiter and on a plain limiter of the
// same group, and sees the plain limiter's count after its own grant. One
// that gives up while it waits fails and its group still runs.
func TestCoalesceDecisions(t *testing.T) {
	c := newClient(t, redistest.Standalone(t))
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		t.Run(string(alg), func(t *testing.T) {
			gc := newGateClient(c, decideSource, decideGroupSource)
			s := newStore(t, gc)
			const limit, waiting = 1000, 2*maxGroup + 22
			policy := limiter.Policy{Limit: limit, Period: time.Hour, Algorithm: alg}
			putIn(t, s, "global", "g", policy)
			putKeyed(t, s, "per-user", "g", policy, 1000)
			for _, src := range []string{decideSource, decideGroupSource} {
				if err := c.Do(context.Background(), c.B().ScriptLoad().Script(src).Build()).Error(); err != nil {
					t.Fatalf("SCRIPT LOAD: %v", err) // no NOSCRIPT, no EVAL: one script per run
				}
			}
			ctx := context.Background()
			items := func(i int) []limiter.Item {
				return []limiter.Item{{Name: "per-user", Key: fmt.Sprintf("user-%d", i), Permits: 2}, {Name: "global", Permits: 1}}
			}
			var wg sync.WaitGroup
			verdicts := make([]limiter.Verdict, waiting+1)
			errs := make([]error, waiting+1)
			decide := func(i int) {
				wg.Go(func() { verdicts[i], errs[i] = s.Decide(ctx, items(i), limiter.Take, "") })
			}
			decide(0)
			<-gc.held
			tag := s.prefix + "{g}"
			for i := 1; i <= waiting; i++ {
				decide(i)
			}
			awaitQueued(t, s.decisions, tag, waiting)
			quitter, quit := context.WithCancel(ctx)
			quitErr := make(chan error, 1)
			go func() {
				_, err := s.Decide(quitter, items(waiting+1), limiter.Take, "")
				quitErr <- err
			}()
			awaitQueued(t, s.decisions, tag, waiting+1)
			quit()
			if err := <-quitErr; !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.Canceled) {
				t.Errorf("a decision that gave up while queued: got %v, want an error wrapping ErrUnavailable and context.Canceled", err)
			}
			close(gc.open)
			wg.Wait()

			// The first run, then the queue in groups of maxGroup.
			if got, want := gc.scripts.Load(), int64(1+(waiting+1+maxGroup-1)/maxGroup); got != want {
				t.Errorf("scripts sent: got %d, want %d", got, want)
			}
			var remaining []int64
			for i, v := range verdicts {
				if errs[i] != nil || !v.Allowed || len(v.Checks) != 2 {
					t.Fatalf("decision %d: got %+v, %v, want a grant", i, v, errs[i])
				}
				if u := v.Checks[0]; u.Remaining != limit-2 || u.Key != fmt.Sprintf("user-%d", i) {
					t.Errorf("decision %d: its key's check is %+v, want %d remaining", i, u, limit-2)
				}
				remaining = append(remaining, v.Checks[1].Remaining)
			}
			// Each saw the plain limiter after its own grant: the queued
			// quitter's grant came before some of them and was taken too.
			slices.Sort(remaining)
			slices.Reverse(remaining)
			skipped := 0
			for i, r := range remaining {
				if want := int64(limit - 1 - i - skipped); r != want {
					if skipped == 0 && r == want-1 {
						skipped = 1
						continue
					}
					t.Fatalf("the plain limiter's remaining counts, highest first: got %v, want each from %d down, once, with one gap", remaining, limit-1)
				}
			}
			a, err := s.Available(ctx, "global")
			if want := int64(limit - waiting - 2); err != nil || a.Remaining != want {
				t.Errorf("Available: got %+v, %v, want %d remaining (every grant, the quitter's too)", a, err, want)
			}
		})
	}
}
