package redis

import (
	"context"
	"sync"
	"time"
)

// maxGroup is the most acquisitions one run of the acquire script decides,
// and the most parts one run of the decide script decides in all. Redis
// runs nothing else while a script runs, and each acquisition or part
// takes it a few microseconds, so this bounds the pause at well under a
// millisecond.
const maxGroup = 64

// Calls under heavy use are sent in groups: acquisitions from one limiter
// (Acquire), and decisions whose keys live in one slot (Decide). The first
// call under a name runs its script on its own; calls under that name that
// arrive while it is in flight queue behind it, and when it returns the
// first group of them, up to maxGroup, goes as one run of the script, then
// the next. At most one call per name is in flight from a Store, so calls
// under one name keep their order of arrival, and a group's members are
// decided one after the other exactly as they would be alone. Under light
// load nothing waits; under heavy load one run of a few dozen decisions
// replaces as many runs, each of which would have cost Redis a script's
// fixed overhead (reading definitions and the clock, trimming tables, and
// an acquisition's writes of its state) and cost this process a command's
// round trip through the client.
type coalescer[Q, R any] struct {
	// run decides qs, sent under name, into out (len(out) == len(qs)).
	run func(ctx context.Context, name string, qs []Q, out []R)
	// weight is what q counts towards maxGroup.
	weight func(q Q) int

	mu      sync.Mutex
	flights map[string]*flight[Q, R] // nil for a name in flight with nothing queued
}

func newCoalescer[Q, R any](run func(ctx context.Context, name string, qs []Q, out []R), weight func(Q) int) *coalescer[Q, R] {
	return &coalescer[Q, R]{run: run, weight: weight, flights: make(map[string]*flight[Q, R])}
}

// flight is what waits for a name's call in flight: its queue of groups.
type flight[Q, R any] struct {
	queue []*group[Q, R]
}

// group is calls under one name sent as one run.
type group[Q, R any] struct {
	qs     []Q
	weight int
	// deadline is the latest of its members' deadlines, the run's own;
	// zero when one of them has none.
	deadline time.Time
	out      []R // set before done is closed
	done     chan struct{}
}

// do decides q under name, on its own or in a group. It returns ctx's error
// when ctx ends while q waits: its group may still run and decide it, as a
// call whose deadline passes after it was sent may.
func (c *coalescer[Q, R]) do(ctx context.Context, name string, q Q) (R, error) {
	c.mu.Lock()
	f, busy := c.flights[name]
	if !busy {
		c.flights[name] = nil
		c.mu.Unlock()
		var out [1]R
		c.run(ctx, name, []Q{q}, out[:])
		c.land(name)
		return out[0], nil
	}
	if f == nil {
		f = &flight[Q, R]{}
		c.flights[name] = f
	}
	w := c.weight(q)
	var g *group[Q, R]
	if n := len(f.queue); n > 0 && f.queue[n-1].weight+w <= maxGroup {
		g = f.queue[n-1]
	} else {
		g = &group[Q, R]{done: make(chan struct{})}
		f.queue = append(f.queue, g)
	}
	i := len(g.qs)
	g.qs = append(g.qs, q)
	g.weight += w
	switch d, ok := ctx.Deadline(); {
	case len(g.qs) == 1:
		g.deadline = d // zero when there is none
	case !ok:
		g.deadline = time.Time{}
	case !g.deadline.IsZero() && d.After(g.deadline):
		g.deadline = d
	}
	c.mu.Unlock()
	select {
	case <-g.done:
		return g.out[i], nil
	case <-ctx.Done():
		var zero R
		return zero, ctx.Err()
	}
}

// land ends the call in flight under name: the next group waiting for it,
// if any, is sent now.
func (c *coalescer[Q, R]) land(name string) {
	c.mu.Lock()
	f := c.flights[name]
	if f == nil || len(f.queue) == 0 {
		delete(c.flights, name)
		c.mu.Unlock()
		return
	}
	g := f.queue[0]
	f.queue[0] = nil
	f.queue = f.queue[1:]
	if len(f.queue) == 0 {
		c.flights[name] = nil
	}
	c.mu.Unlock()
	go c.send(name, g)
}

// send decides the group g under name in one run, bounded by the latest of
// its members' deadlines: one that gives up at its own deadline (see do)
// does not end the run for the others, which would then fail with it.
func (c *coalescer[Q, R]) send(name string, g *group[Q, R]) {
	ctx := context.Background()
	if !g.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, g.deadline)
		defer cancel()
	}
	g.out = make([]R, len(g.qs))
	c.run(ctx, name, g.qs, g.out)
	close(g.done)
	c.land(name)
}

// queued is how many calls under name wait for its call in flight.
func (c *coalescer[Q, R]) queued(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	if f := c.flights[name]; f != nil {
		for _, g := range f.queue {
			n += len(g.qs)
		}
	}
	return n
}
