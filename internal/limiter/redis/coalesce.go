package redis

import (
	"context"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// maxGroup is the most acquisitions one run of the acquire script decides.
// Redis runs nothing else while a script runs, and each acquisition takes
// it a few microseconds, so this bounds the pause at well under a
// millisecond.
const maxGroup = 64

// A limiter under heavy use is decided in groups. The first acquisition
// from a limiter runs the script on its own; acquisitions from it that
// arrive while that call is in flight queue behind it, and when it returns
// the first group of them, up to maxGroup, goes as one call, then the next.
// At most one call per limiter is in flight from a Store, so acquisitions
// on one limiter keep their order of arrival, and a group's members are
// decided one after the other exactly as they would be alone: the script
// reads the state once, decides each in turn and writes the state once.
// Under light load nothing waits; under heavy load one call of a few dozen
// decisions replaces as many calls, each of which would have cost Redis its
// script's fixed overhead (reading the definition and the clock, writing
// the state) and cost this process a command's round trip through the
// client.

// flight is what waits for a limiter's call in flight: its queue of
// groups. The Store's flights map holds a nil *flight for a limiter whose
// call is in flight with nothing waiting.
type flight struct {
	queue []*group
}

// group is acquisitions from one limiter decided by one call.
type group struct {
	permits []int64
	// deadline is the earliest of its members' deadlines: the call's own
	// (zero: none).
	deadline time.Time
	results  []limiter.Result // set before done is closed
	done     chan struct{}
}

// coalesce takes permits from the limiter name, on its own or in a group.
func (s *Store) coalesce(ctx context.Context, name string, permits int64) (limiter.Decision, error) {
	s.mu.Lock()
	f, busy := s.flights[name]
	if !busy {
		s.flights[name] = nil
		s.mu.Unlock()
		var r [1]limiter.Result
		s.decide(ctx, name, []int64{permits}, "", r[:])
		s.land(name)
		return r[0].Decision, r[0].Err
	}
	if f == nil {
		f = &flight{}
		s.flights[name] = f
	}
	var g *group
	if n := len(f.queue); n > 0 && len(f.queue[n-1].permits) < maxGroup {
		g = f.queue[n-1]
	} else {
		g = &group{done: make(chan struct{})}
		f.queue = append(f.queue, g)
	}
	i := len(g.permits)
	g.permits = append(g.permits, permits)
	if d, ok := ctx.Deadline(); ok && (g.deadline.IsZero() || d.Before(g.deadline)) {
		g.deadline = d
	}
	s.mu.Unlock()
	select {
	case <-g.done:
		r := g.results[i]
		return r.Decision, r.Err
	case <-ctx.Done():
		// The group may still run and take the permits, as a call whose
		// deadline passes after it was sent may.
		return limiter.Decision{}, unavailable("acquire", name, ctx.Err())
	}
}

// land ends the call in flight for the limiter name: the next group waiting
// for it, if any, is sent now.
func (s *Store) land(name string) {
	s.mu.Lock()
	f := s.flights[name]
	if f == nil || len(f.queue) == 0 {
		delete(s.flights, name)
		s.mu.Unlock()
		return
	}
	g := f.queue[0]
	f.queue[0] = nil
	f.queue = f.queue[1:]
	if len(f.queue) == 0 {
		s.flights[name] = nil
	}
	s.mu.Unlock()
	go s.send(name, g)
}

// send decides the group g of acquisitions from the limiter name in one
// call, bounded by the earliest of its members' deadlines but not ended
// when one of them gives up: the others still wait for it.
func (s *Store) send(name string, g *group) {
	ctx := context.Background()
	if !g.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, g.deadline)
		defer cancel()
	}
	g.results = make([]limiter.Result, len(g.permits))
	s.decide(ctx, name, g.permits, "", g.results)
	close(g.done)
	s.land(name)
}
