// Package memory is the embedded, in-process limiter Store: the default
// backend, for a single replica.
package memory

import (
	"context"
	"slices"
	"sync"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

var _ limiter.BatchStore = (*Store)(nil)

// Store keeps named limiters in process memory. It is safe for concurrent
// use: acquisitions on different limiters proceed in parallel.
type Store struct {
	clock *limiter.Clock

	mu    sync.RWMutex
	byKey map[string]*limiter.Limiter
	names []string // sorted, for List
}

// New returns an empty Store that decides at the instants clock tells
// (limiter.NewClock() when nil), so that steps of the wall clock move no
// decision.
func New(clock *limiter.Clock) *Store {
	if clock == nil {
		clock = limiter.NewClock()
	}
	return &Store{clock: clock, byKey: make(map[string]*limiter.Limiter)}
}

// Put creates or replaces a limiter. An identical policy keeps the state.
func (s *Store) Put(_ context.Context, def limiter.Definition) (bool, error) {
	l, err := limiter.New(def.Policy)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.byKey[def.Name]
	if ok {
		if old.Policy() != l.Policy() {
			s.byKey[def.Name] = l
		}
		return false, nil
	}
	s.byKey[def.Name] = l
	i, _ := slices.BinarySearch(s.names, def.Name)
	s.names = slices.Insert(s.names, i, def.Name)
	return true, nil
}

// Get returns a limiter's definition.
func (s *Store) Get(_ context.Context, name string) (limiter.Definition, error) {
	l, err := s.lookup(name)
	if err != nil {
		return limiter.Definition{}, err
	}
	return limiter.Definition{Name: name, Policy: l.Policy()}, nil
}

// List returns up to max definitions after `after`, in name order; none
// when max <= 0.
func (s *Store) List(_ context.Context, after string, max int) ([]limiter.Definition, error) {
	if max <= 0 {
		return nil, nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, found := slices.BinarySearch(s.names, after)
	if found {
		i++
	}
	defs := make([]limiter.Definition, 0, min(max, len(s.names)-i))
	for _, name := range s.names[i:] {
		if len(defs) == max {
			break
		}
		defs = append(defs, limiter.Definition{Name: name, Policy: s.byKey[name].Policy()})
	}
	return defs, nil
}

// Delete removes a limiter.
func (s *Store) Delete(_ context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byKey[name]; !ok {
		return limiter.ErrNotFound
	}
	delete(s.byKey, name)
	i, _ := slices.BinarySearch(s.names, name)
	s.names = slices.Delete(s.names, i, i+1)
	return nil
}

// Acquire takes permits from a limiter, all or nothing.
func (s *Store) Acquire(_ context.Context, name string, permits int64) (limiter.Decision, error) {
	l, err := s.lookup(name)
	if err != nil {
		return limiter.Decision{}, err
	}
	return l.Acquire(s.clock.Now(), permits)
}

// AcquireBatch decides each reqs[i] into out[i] as Acquire would, all at
// one reading of the clock: the batch's requests are simultaneous, as
// concurrent ones are. Requests on one limiter are decided in the order
// given.
func (s *Store) AcquireBatch(_ context.Context, reqs []limiter.Request, out []limiter.Result) {
	now := s.clock.Now()
	var (
		name string
		l    *limiter.Limiter
		err  error
	)
	for i, r := range reqs {
		// Batches often repeat a limiter: look each run of one up once.
		if i == 0 || r.Name != name {
			name = r.Name
			l, err = s.lookup(name)
		}
		if err != nil {
			out[i] = limiter.Result{Err: err}
			continue
		}
		out[i].Decision, out[i].Err = l.Acquire(now, r.Permits)
	}
}

// Available reports what a limiter could grant now.
func (s *Store) Available(_ context.Context, name string) (limiter.Availability, error) {
	l, err := s.lookup(name)
	if err != nil {
		return limiter.Availability{}, err
	}
	return l.Available(s.clock.Now()), nil
}

func (s *Store) lookup(name string) (*limiter.Limiter, error) {
	s.mu.RLock()
	l, ok := s.byKey[name]
	s.mu.RUnlock()
	if !ok {
		return nil, limiter.ErrNotFound
	}
	return l, nil
}
