// Package memory is the embedded, in-process limiter Store: the default
// backend, for a single replica.
package memory

import (
	"context"
	"fmt"
	"sync"

	"github.com/tidwall/btree"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

var _ limiter.BatchStore = (*Store)(nil)

// Store keeps named limiters in process memory. It is safe for concurrent
// use: acquisitions on different limiters proceed in parallel.
//
// A limiter is found by a hash map on every decision, and its name is kept
// in a B-tree as well, for List: Put and Delete cost O(log n) for n
// limiters, and List O(log n + max).
type Store struct {
	clock *limiter.Clock
	max   int

	mu    sync.RWMutex
	byKey map[string]*limiter.Limiter
	names btree.Set[string] // the keys of byKey, in order, for List
	peak  int               // most entries byKey held since it was made; see shrink
}

// New returns an empty Store that decides at the instants clock tells
// (limiter.NewClock() when nil), so that steps of the wall clock move no
// decision, and holds at most maxLimiters limiters
// (limiter.DefaultMaxLimiters when 0 or less).
func New(clock *limiter.Clock, maxLimiters int) *Store {
	if clock == nil {
		clock = limiter.NewClock()
	}
	if maxLimiters <= 0 {
		maxLimiters = limiter.DefaultMaxLimiters
	}
	return &Store{clock: clock, max: maxLimiters, byKey: make(map[string]*limiter.Limiter)}
}

// Put creates or replaces a limiter. An identical policy keeps the state.
// Creating one more than the store's maximum fails with an error wrapping
// limiter.ErrTooManyLimiters; replacing one never does.
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
	if len(s.byKey) >= s.max {
		return false, fmt.Errorf("%w: the maximum is %d", limiter.ErrTooManyLimiters, s.max)
	}
	s.byKey[def.Name] = l
	s.peak = max(s.peak, len(s.byKey))
	s.names.Insert(def.Name)
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
	defs := make([]limiter.Definition, 0, min(max, s.names.Len()))
	s.names.Ascend(after, func(name string) bool {
		if name == after { // Ascend starts at after itself
			return true
		}
		defs = append(defs, limiter.Definition{Name: name, Policy: s.byKey[name].Policy()})
		return len(defs) < max
	})
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
	s.names.Delete(name)
	s.shrink()
	return nil
}

// shrink copies byKey into a map of its size once it holds a quarter of
// its peak: a Go map never gives back the room it grew to, so without this
// a million limiters created and deleted would keep their map's tens of
// megabytes for the life of the process. Each copy costs the entries
// copied, and at least three times as many deletions preceded it, so
// Delete stays O(1) amortized for the map.
func (s *Store) shrink() {
	const minPeak = 1024 // below this the room kept is not worth a copy
	n := len(s.byKey)
	if s.peak < minPeak || n > s.peak/4 {
		return
	}
	m := make(map[string]*limiter.Limiter, n)
	for k, v := range s.byKey {
		m[k] = v
	}
	s.byKey, s.peak = m, n
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
