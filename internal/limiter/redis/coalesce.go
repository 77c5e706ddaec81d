package redis

import (
	"context"
	"sync"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// maxGroup is the most calls one script run makes. Redis runs nothing else
// while a script runs, and each call takes it a few microseconds, so this
// bounds the pause at well under a millisecond.
const maxGroup = 64

// Calls on one key under heavy use go in groups: acquisitions from one
// limiter, and joint decisions in one slot. The first call on a key is
// sent on its own; calls on it that arrive while that one is in flight
// queue behind it, and when it returns the first group of them, up to
// maxGroup, goes as one script run, then the next. At most one run per
// key is in flight from a Store, so calls on one key keep their order of
// arrival, and a group's members are made one after the other exactly as
// they would be alone. Under light load nothing waits; under heavy load
// one run of a few dozen calls replaces as many runs, each of which would
// have cost Redis a script's fixed overhead (and, for acquisitions, reading
// the definition and the clock and writing the state once per call) and
// cost this process a command's round trip through the client.

// coalescer groups calls of type J on one key, as above. send makes the
// calls jobs on key in one script run, alone when there is one, and sets
// each one's outcome.
type coalescer[J any] struct {
	send func(ctx context.Context, key string, jobs []J)

	mu sync.Mutex
	// flights holds the keys with a run in flight: a nil *flight when
	// nothing waits for it.
	flights map[string]*flight[J]
}

func newCoalescer[J any](send func(ctx context.Context, key string, jobs []J)) *coalescer[J] {
	return &coalescer[J]{send: send, flights: make(map[string]*flight[J])}
}

// flight is what waits for a key's run in flight: its queue of groups.
type flight[J any] struct {
	queue []*group[J]
}

// group is calls on one key made by one run.
type group[J any] struct {
	jobs []J
	// deadline is the earliest of its members' deadlines: the run's own
	// (zero: none).
	deadline time.Time
	done     chan struct{} // closed once send has set every outcome
}

// do makes the call j on key, on its own or in a group, and returns once
// its outcome is set; or ctx's error when ctx ends while j waits, and then
// its group may still run and make the call, as a call whose deadline
// passes after it was sent may.
func (c *coalescer[J]) do(ctx context.Context, key string, j J) error {
	c.mu.Lock()
	f, busy := c.flights[key]
	if !busy {
		c.flights[key] = nil
		c.mu.Unlock()
		c.send(ctx, key, []J{j})
		c.land(key)
		return nil
	}
	if f == nil {
		f = &flight[J]{}
		c.flights[key] = f
	}
	var g *group[J]
	if n := len(f.queue); n > 0 && len(f.queue[n-1].jobs) < maxGroup {
		g = f.queue[n-1]
	} else {
		g = &group[J]{done: make(chan struct{})}
		f.queue = append(f.queue, g)
	}
	g.jobs = append(g.jobs, j)
	if d, ok := ctx.Deadline(); ok && (g.deadline.IsZero() || d.Before(g.deadline)) {
		g.deadline = d
	}
	c.mu.Unlock()
	select {
	case <-g.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// land ends the run in flight on key: the next group waiting for it, if
// any, is sent now.
func (c *coalescer[J]) land(key string) {
	c.mu.Lock()
	f := c.flights[key]
	if f == nil || len(f.queue) == 0 {
		delete(c.flights, key)
		c.mu.Unlock()
		return
	}
	g := f.queue[0]
	f.queue[0] = nil
	f.queue = f.queue[1:]
	if len(f.queue) == 0 {
		c.flights[key] = nil
	}
	c.mu.Unlock()
	go c.run(key, g)
}

// run makes the group g's calls on key in one run, bounded by the earliest
// of its members' deadlines but not ended when one of them gives up: the
// others still wait for it.
func (c *coalescer[J]) run(key string, g *group[J]) {
	ctx := context.Background()
	if !g.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, g.deadline)
		defer cancel()
	}
	c.send(ctx, key, g.jobs)
	close(g.done)
	c.land(key)
}

// queued returns how many calls on key wait for its run in flight.
func (c *coalescer[J]) queued(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	if f := c.flights[key]; f != nil {
		for _, g := range f.queue {
			n += len(g.jobs)
		}
	}
	return n
}

// acquisition is one Acquire coalesced: what it takes, and its outcome.
type acquisition struct {
	permits int64
	out     limiter.Result
}

// coalesce takes permits from the limiter name, on its own or in a group.
func (s *Store) coalesce(ctx context.Context, name string, permits int64) (limiter.Decision, error) {
	a := &acquisition{permits: permits}
	if err := s.acquisitions.do(ctx, name, a); err != nil {
		return limiter.Decision{}, unavailable("acquire", name, err)
	}
	return a.out.Decision, a.out.Err
}

// sendAcquisitions takes each of as in turn from the limiter name, in one
// run of the acquire script.
func (s *Store) sendAcquisitions(ctx context.Context, name string, as []*acquisition) {
	permits := make([]int64, len(as))
	for i, a := range as {
		permits[i] = a.permits
	}
	out := make([]limiter.Result, len(as))
	s.decide(ctx, name, permits, "", out)
	for i, a := range as {
		a.out = out[i]
	}
}
