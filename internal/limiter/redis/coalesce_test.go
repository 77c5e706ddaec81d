package redis

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// gateClient holds the first acquire script it sends by its digest until
// open is closed, and counts the acquire scripts sent.
type gateClient struct {
	rueidis.Client
	held, open chan struct{}
	once       sync.Once
	scripts    atomic.Int64
}

func (c *gateClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if args := cmd.Commands(); args[0] == "EVALSHA" && args[1] == acquireSHA1 || args[0] == "EVAL" && args[1] == acquireSource {
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
			gc := &gateClient{Client: c, held: make(chan struct{}), open: make(chan struct{})}
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
		s.mu.Lock()
		queued := 0
		if f := s.flights[name]; f != nil {
			for _, g := range f.queue {
				queued += len(g.permits)
			}
		}
		s.mu.Unlock()
		if queued == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d acquisitions queued after 10s, want %d", queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}
