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

// gateClient holds the first run of the script source it sends until open
// is closed, and counts the runs of that script sent.
type gateClient struct {
	rueidis.Client
	source     string
	held, open chan struct{}
	once       sync.Once
	scripts    atomic.Int64
}

func newGateClient(c rueidis.Client, source string) *gateClient {
	return &gateClient{Client: c, source: source, held: make(chan struct{}), open: make(chan struct{})}
}

func (c *gateClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if args := cmd.Commands(); args[0] == "EVALSHA" && args[1] == digest(c.source) || args[0] == "EVAL" && args[1] == c.source {
		c.scripts.Add(1)
		c.once.Do(func() {
			close(c.held)
			<-c.open
		})
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
			awaitQueued(t, s, "hot", waiting)
			go func() {
				_, err := s.Acquire(quitter, "hot", 1)
				quitErr <- err
			}()
			awaitQueued(t, s, "hot", waiting+1)
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

// awaitQueued waits until n acquisitions from the limiter name wait for its
// call in flight.
func awaitQueued(t *testing.T, s *Store, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		queued := s.acquisitions.queued(name)
		if queued == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d acquisitions queued after 10s, want %d", queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Decisions on keys of one slot that arrive while a decision there is in
// flight wait for it, then go in batches of up to maxGroup parts, one run
// of decide.lua each, and each is decided as if alone: of 2 permits of a
// key, the first decision on it is granted and every later one denied,
// and every key of a full table but the first three is denied for want of
// room.
func TestCoalesceDecisions(t *testing.T) {
	c := newClient(t, redistest.Standalone(t))
	gc := newGateClient(c, decideSource)
	s := newStore(t, gc)
	putKeyed(t, s, "hot", "g", limiter.Policy{Limit: 2, Period: time.Hour}, 40)
	loadScripts(t, c)
	ctx := context.Background()
	const waiting = 3 * maxGroup / 2 // 2 parts each: three batches
	items := func(i int) []limiter.Item {
		// Decision i takes 1 permit of key i/2 and 1 of key 1000+i/2.
		return []limiter.Item{{Name: "hot", Key: fmt.Sprint(i / 2), Permits: 1}, {Name: "hot", Key: fmt.Sprint(1000 + i/2), Permits: 1}}
	}
	verdicts := make([]limiter.Verdict, waiting+1)
	errs := make([]error, waiting+1)
	var wg sync.WaitGroup
	decide := func(i int) {
		wg.Go(func() { verdicts[i], errs[i] = s.Decide(ctx, items(i), limiter.Take, "") })
	}
	decide(0)
	select {
	case <-gc.held:
	case <-time.After(10 * time.Second):
		wg.Wait()
		t.Fatalf("the first decision was not sent: %+v, %v", verdicts[0], errs[0])
	}
	// One at a time, so that they queue in order.
	for i := 1; i <= waiting; i++ {
		decide(i)
		awaitDecisions(t, s, items(0), i)
	}
	close(gc.open)
	wg.Wait()
	if got, want := gc.scripts.Load(), int64(1+(2*waiting+maxGroup-1)/maxGroup); got != want {
		t.Errorf("scripts sent: got %d, want %d", got, want)
	}
	for i, v := range verdicts {
		if errs[i] != nil {
			t.Fatalf("decision %d: %v", i, errs[i])
		}
		// Keys 0 to 19 and 1000 to 1019 fill the table of 40; each key
		// is asked twice, 2 permits in all, which its limit grants.
		if want := i/2 < 20; v.Allowed != want {
			t.Errorf("decision %d: got %+v, want allowed %v", i, v, want)
		}
		if i/2 >= 20 && !v.Checks[0].KeysFull {
			t.Errorf("decision %d: got %+v, want its keys denied for want of room", i, v)
		}
	}
}

// awaitDecisions waits until n decisions wait for the call in flight in
// the slot of items, keys of limiters of group "g".
func awaitDecisions(t *testing.T, s *Store, items []limiter.Item, n int) {
	t.Helper()
	groups := make([]string, len(items))
	for i := range groups {
		groups[i] = "g"
	}
	tag, _ := s.scopeKeys(limiter.Scope(items, groups))
	deadline := time.Now().Add(10 * time.Second)
	for s.decisions.queued(tag+" ") != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d decisions queued after 10s, want %d", s.decisions.queued(tag+" "), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A call that gives up at its own deadline while it waits does not end
// its group's run: the others in the group are still decided, and so is
// the one that gave up, as a call whose deadline passes after it was sent
// may be.
func TestCoalesceDeadline(t *testing.T) {
	c := newClient(t, redistest.Standalone(t))
	gc := newGateClient(c, acquireSource)
	s := newStore(t, gc)
	put(t, s, "hot", limiter.Policy{Limit: 10, Period: time.Hour})
	loadScripts(t, c)
	ctx := context.Background()
	acquire := func(ctx context.Context) chan error {
		done := make(chan error, 1)
		go func() {
			d, err := s.Acquire(ctx, "hot", 1)
			if err == nil && !d.Allowed {
				err = fmt.Errorf("denied: %+v", d)
			}
			done <- err
		}()
		return done
	}
	first := acquire(ctx)
	<-gc.held
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	gaveUp := acquire(short)
	awaitQueued(t, s, "hot", 1)
	later := acquire(ctx)
	awaitQueued(t, s, "hot", 2)
	if err := <-gaveUp; !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the call past its deadline: got %v, want ErrUnavailable and context.DeadlineExceeded", err)
	}
	close(gc.open)
	if err := <-first; err != nil {
		t.Errorf("the call in flight: %v", err)
	}
	if err := <-later; err != nil {
		t.Errorf("the call without a deadline, in the group of the one that gave up: %v", err)
	}
	if a, err := s.Available(ctx, "hot"); err != nil || a.Remaining != 7 {
		t.Errorf("Available: got %+v, %v, want 7 remaining", a, err)
	}
}
