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
	keys  int // the sum of MaxKeys over the keyed limiters; see limiter.KeyBudget
	byKey map[string]entry
	names btree.Set[string] // the keys of byKey, in order, for List
	peak  int               // most entries byKey held since it was made; see shrink
	gen   uint64            // the last generation given to a definition; see entry
	once  *onceTable
	rsv   *reservations
}

// entry is one limiter and its definition. A keyed limiter's state is
// keys; l then only holds its policy.
//
// gen is the definition's generation, which no other definition of the
// store has had: a limiter created, or replaced by another definition,
// gets a new one. What outlives a decision (a reservation) remembers it,
// so that it is never settled on a limiter other than the one it was made
// on.
type entry struct {
	l       *limiter.Limiter
	group   string
	keys    *Keys
	maxKeys int
	gen     uint64
}

func (e entry) definition(name string) limiter.Definition {
	return limiter.Definition{Name: name, Policy: e.l.Policy(), Group: e.group, Keyed: e.keys != nil, MaxKeys: e.maxKeys}
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
	return &Store{clock: clock, max: maxLimiters, byKey: make(map[string]entry), once: newOnceTable(), rsv: newReservations()}
}

// Put creates or replaces a limiter. An identical definition keeps the
// state. Creating one more than the store's maximum fails with an error
// wrapping limiter.ErrTooManyLimiters, and a keyed one whose MaxKeys would
// take the keyed limiters past limiter.KeyBudget with one wrapping
// limiter.ErrTooManyKeys; replacing one with the same MaxKeys or fewer
// never does. Replacing one with another group fails with an error wrapping
// limiter.ErrGroupConflict.
func (s *Store) Put(ctx context.Context, def limiter.Definition) (bool, error) {
	created, _, err := s.PutUndo(ctx, def)
	return created, err
}

// PutUndo is Put that also returns, when it succeeds, a func that undoes
// it exactly: it deletes the limiter Put created, or puts back the one it
// replaced with its state as it was. It is for a caller that serializes
// the changes to a store's definitions and finds, once Put has succeeded,
// that it cannot keep the change (package bolt, when its file cannot be
// written): the undo must come before any other change to the limiter.
func (s *Store) PutUndo(_ context.Context, def limiter.Definition) (created bool, undo func(), err error) {
	l, err := limiter.New(def.Policy)
	if err != nil {
		return false, nil, err
	}
	if err := limiter.CheckKeyed(def); err != nil {
		return false, nil, err
	}
	def = def.Normalize()
	e := entry{l: l, group: def.Group, maxKeys: def.MaxKeys}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.byKey[def.Name]
	if ok && old.group != def.Group {
		return false, nil, limiter.GroupConflict(old.group, def.Group)
	}
	if !ok && len(s.byKey) >= s.max {
		return false, nil, fmt.Errorf("%w: the maximum is %d", limiter.ErrTooManyLimiters, s.max)
	}
	if keys := s.keys - old.maxKeys + e.maxKeys; e.maxKeys > old.maxKeys && keys > limiter.KeyBudget {
		return false, nil, fmt.Errorf("%w: %d keys would take the keyed limiters to %d, beyond their budget of %d; lower max_keys, or delete a keyed limiter", limiter.ErrTooManyKeys, e.maxKeys, keys, limiter.KeyBudget)
	}
	if ok && old.definition(def.Name) == (limiter.Definition{Name: def.Name, Policy: l.Policy(), Group: def.Group, Keyed: def.Keyed, MaxKeys: def.MaxKeys}) {
		return false, func() {}, nil // an identical definition keeps the state
	}
	if def.Keyed {
		e.keys = NewKeys(l.Policy(), def.MaxKeys)
	}
	s.keys += e.maxKeys - old.maxKeys
	s.gen++
	e.gen = s.gen
	s.byKey[def.Name] = e
	if ok {
		return false, func() { s.reinstate(def.Name, old) }, nil
	}
	s.peak = max(s.peak, len(s.byKey))
	s.names.Insert(def.Name)
	return true, func() { s.remove(def.Name, false) }, nil
}

// reinstate puts back the entry old of the limiter name, which Put replaced.
func (s *Store) reinstate(name string, old entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys += old.maxKeys - s.byKey[name].maxKeys
	s.byKey[name] = old
}

// Get returns a limiter's definition.
func (s *Store) Get(_ context.Context, name string) (limiter.Definition, error) {
	e, err := s.lookup(name)
	if err != nil {
		return limiter.Definition{}, err
	}
	return e.definition(name), nil
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
		e := s.byKey[name]
		defs = append(defs, e.definition(name))
		return len(defs) < max
	})
	return defs, nil
}

// Delete removes a limiter.
func (s *Store) Delete(_ context.Context, name string) error {
	return s.remove(name, false)
}

// DeleteIdle removes a limiter that holds no counts; see
// limiter.IdleDeleter. A decision that found the limiter before it was
// removed and records after the check is lost with it, as with Delete:
// the window is the decision's own, in process.
func (s *Store) DeleteIdle(_ context.Context, name string) error {
	return s.remove(name, true)
}

// Idle reports whether the limiter name holds no counts: nil, or an error
// wrapping limiter.ErrNotIdle or limiter.ErrNotFound.
func (s *Store) Idle(name string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.byKey[name]
	switch {
	case !ok:
		return limiter.ErrNotFound
	case !e.idle(s.clock.Now()):
		return limiter.ErrNotIdle
	}
	return nil
}

// idle reports whether e holds no counts at now.
func (e entry) idle(now int64) bool {
	if e.keys != nil {
		// A key whose bucket is full again may be remembered until it is
		// next seen: Lowest leaves it out.
		keys, err := e.keys.Lowest(context.Background(), now, 1)
		return err == nil && len(keys) == 0
	}
	return e.l.Idle(now)
}

// remove deletes the limiter name, with idle only while it holds no
// counts; otherwise the error wraps limiter.ErrNotFound or
// limiter.ErrNotIdle.
func (s *Store) remove(name string, idle bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byKey[name]
	switch {
	case !ok:
		return limiter.ErrNotFound
	case idle && !e.idle(s.clock.Now()):
		return limiter.ErrNotIdle
	}
	s.keys -= e.maxKeys
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
	m := make(map[string]entry, n)
	for k, v := range s.byKey {
		m[k] = v
	}
	s.byKey, s.peak = m, n
}

// Acquire takes permits from a limiter, all or nothing.
func (s *Store) Acquire(_ context.Context, name string, permits int64) (limiter.Decision, error) {
	e, err := s.lookup(name)
	if err != nil {
		return limiter.Decision{}, err
	}
	if e.keys != nil {
		return limiter.Decision{}, limiter.KeyMismatch(name, true)
	}
	return e.l.Acquire(s.clock.Now(), permits)
}

// AcquireBatch decides each reqs[i] into out[i] as Acquire (or, for a
// request with a key, AcquireKey) would, all at one reading of the clock:
// the batch's requests are simultaneous, as concurrent ones are. Requests
// on one limiter are decided in the order given.
func (s *Store) AcquireBatch(_ context.Context, reqs []limiter.Request, out []limiter.Result) {
	now := s.clock.Now()
	var (
		name string
		e    entry
		l    *limiter.Limiter
		err  error
	)
	for i, r := range reqs {
		// Batches often repeat a limiter: look each run of one up once.
		if i == 0 || r.Name != name {
			name = r.Name
			e, err = s.lookup(name)
			l = e.l
		}
		if err == nil && (e.keys != nil) != (r.Key != "") {
			out[i] = limiter.Result{Err: limiter.KeyMismatch(name, e.keys != nil)}
			continue
		}
		switch {
		case err != nil:
			out[i] = limiter.Result{Err: err}
		case e.keys != nil:
			d, full := e.keys.Acquire(r.Key, now, r.Permits)
			out[i] = limiter.Result{Decision: d, KeysFull: full}
		default:
			d, err := l.Acquire(now, r.Permits)
			out[i] = limiter.Result{Decision: d, Err: err}
		}
	}
}

// Available reports what a limiter could grant now.
func (s *Store) Available(_ context.Context, name string) (limiter.Availability, error) {
	e, err := s.lookup(name)
	if err != nil {
		return limiter.Availability{}, err
	}
	if e.keys != nil {
		return limiter.Availability{}, limiter.KeyMismatch(name, true)
	}
	return e.l.Available(s.clock.Now()), nil
}

// AcquireKey takes permits from key's bucket of a keyed limiter, all or
// nothing; see Keys.Acquire.
func (s *Store) AcquireKey(_ context.Context, name, key string, permits int64) (limiter.KeyDecision, error) {
	ks, err := s.keyed(name)
	if err != nil {
		return limiter.KeyDecision{}, err
	}
	d, full := ks.Acquire(key, s.clock.Now(), permits)
	return limiter.KeyDecision{Decision: d, KeysFull: full}, nil
}

// AvailableKey reports what key's bucket of a keyed limiter could grant
// now; see Keys.Available.
func (s *Store) AvailableKey(_ context.Context, name, key string) (limiter.KeyAvailability, error) {
	ks, err := s.keyed(name)
	if err != nil {
		return limiter.KeyAvailability{}, err
	}
	av, full := ks.Available(key, s.clock.Now())
	return limiter.KeyAvailability{Availability: av, KeysFull: full}, nil
}

// Lowest lists up to k keys of a keyed limiter, fewest permits left first;
// see Keys.Lowest for the order and the cost.
func (s *Store) Lowest(ctx context.Context, name string, k int) ([]limiter.KeyEntry, error) {
	ks, err := s.keyed(name)
	if err != nil {
		return nil, err
	}
	return ks.Lowest(ctx, s.clock.Now(), k)
}

// keyed returns the keys of a keyed limiter.
func (s *Store) keyed(name string) (*Keys, error) {
	e, err := s.lookup(name)
	if err != nil {
		return nil, err
	}
	if e.keys == nil {
		return nil, limiter.KeyMismatch(name, false)
	}
	return e.keys, nil
}

// Decide decides items together, all or nothing, at one reading of the
// clock (see limiter.DecideAll): no lock but those of the limiters named
// (and of the shards of the keys named) is taken while they are decided,
// and, with once, that of the key's shard of the idempotency table, which
// holds at most limiter.MaxOnce keys. See keys_joint.go for keys.
func (s *Store) Decide(_ context.Context, items []limiter.Item, mode limiter.Mode, once string) (limiter.Verdict, error) {
	if len(items) == 1 && mode == limiter.Take && once == "" {
		if v, ok, err := s.decideOne(items[0]); ok {
			return v, err
		}
	}
	j, err := s.joint(items)
	if err != nil {
		return limiter.Verdict{}, err
	}
	decide := func() (limiter.Verdict, error) {
		if !j.keyed {
			found := limiter.DecideAll(s.clock.Now(), j.ls, j.totals, mode)
			return limiter.NewVerdict(items, found, j.index), nil
		}
		return limiter.NewVerdict(items, j.decideKeys(s.clock, mode, nil, nil), j.index), nil
	}
	if once == "" {
		return decide()
	}
	return s.once.do(j.scope+"\x00"+once, limiter.Fingerprint(items, mode), s.clock.Now(), decide)
}

// decideOne is Decide of a single item taken without an idempotency key,
// the decision of every request a single rule charges, made as that
// item's acquisition (Acquire or AcquireKey) without the joint path's
// bookkeeping. ok is false for a request above the limiter's capacity,
// which it leaves to the joint path: that path answers a key it could not
// give room to as KeysFull even then, and the acquisition recorded nothing.
func (s *Store) decideOne(it limiter.Item) (v limiter.Verdict, ok bool, err error) {
	e, err := s.lookup(it.Name)
	if err != nil {
		return limiter.Verdict{}, true, &limiter.MissingError{Name: it.Name}
	}
	if keyed := e.keys != nil; keyed != (it.Key != "") {
		return limiter.Verdict{}, true, limiter.KeyMismatch(it.Name, keyed)
	}
	var d limiter.Decision
	var full bool
	if e.keys != nil {
		d, full = e.keys.Acquire(it.Key, s.clock.Now(), it.Permits)
	} else if d, err = e.l.Acquire(s.clock.Now(), it.Permits); err != nil {
		return limiter.Verdict{}, true, err
	}
	if d.ExceedsCapacity {
		return limiter.Verdict{}, false, nil
	}
	c := limiter.Check{Name: it.Name, Key: it.Key, Permits: it.Permits, Fits: d.Allowed,
		Remaining: d.Remaining, Limit: d.Limit, RetryAfter: d.RetryAfter, KeysFull: full, ResetAfter: d.ResetAfter}
	return limiter.NewVerdict([]limiter.Item{it}, []limiter.Check{c}, []int{0}), true, nil
}

// joint is what a decision needs of the store: its limiters (and keys),
// in the order of limiter.Parts, and the Scope of its idempotency keys and
// reservations.
type joint struct {
	names  []string
	totals []int64
	index  []int
	ls     []*limiter.Limiter // the limiters, when none is keyed
	parts  []part             // the limiters and keys, when one is keyed
	gens   []uint64           // the generations of the limiters' definitions
	keyed  bool
	scope  string
}

// joint finds the limiters of items, checks their keys against their
// definitions, and checks their groups.
func (s *Store) joint(items []limiter.Item) (joint, error) {
	ps, index := limiter.Parts(items)
	j := joint{names: make([]string, len(ps)), totals: make([]int64, len(ps)), index: index, ls: make([]*limiter.Limiter, len(ps)), parts: make([]part, len(ps)), gens: make([]uint64, len(ps))}
	groups := make([]string, len(items))
	s.mu.RLock()
	for k, p := range ps {
		e, ok := s.byKey[p.Name]
		if !ok {
			s.mu.RUnlock()
			return joint{}, &limiter.MissingError{Name: p.Name}
		}
		if keyed := e.keys != nil; keyed != (p.Key != "") {
			s.mu.RUnlock()
			return joint{}, limiter.KeyMismatch(p.Name, keyed)
		}
		j.names[k], j.totals[k], j.gens[k] = p.Name, p.Permits, e.gen
		if e.keys != nil {
			j.keyed = true
			j.parts[k].cell = e.keys.newCell(p.Key)
		} else {
			j.ls[k], j.parts[k].l = e.l, e.l
		}
		for i := range items {
			if index[i] == k {
				groups[i] = e.group
			}
		}
	}
	s.mu.RUnlock()
	if err := limiter.CheckGroups(items, groups); err != nil {
		return joint{}, err
	}
	j.scope = limiter.Scope(items, groups)
	return j, nil
}

// decideKeys decides the parts of a joint decision that names keys, by
// decideParts, until no key needs room made for it, at most
// maxVictimAttempts times; with holds, it settles them by the signed
// amounts deltas, each refund giving back no more than its hold. Room made for a key stays that key's from one round to
// the next; when keys kept needing more (a key remembered in one round was
// evicted by others before the next), it answers what a Peek would, with
// the first key KeysFull: denied, as an acquisition that cannot find room
// is.
func (j *joint) decideKeys(clock *limiter.Clock, mode limiter.Mode, deltas []int64, holds []limiter.Held) []limiter.Check {
	totals := j.totals
	if holds != nil {
		totals, mode = deltas, limiter.Charge
	}
	for range maxVictimAttempts {
		found, retry := decideParts(clock.Now(), j.parts, totals, mode, holds)
		if !retry {
			return found
		}
	}
	found, _ := decideParts(clock.Now(), j.parts, j.totals, limiter.Peek, nil)
	for k := range found {
		if j.parts[k].l == nil && !found[k].Fits {
			return found
		}
	}
	for k := range found {
		if c := &j.parts[k].cell; j.parts[k].l == nil {
			_, c.wait = c.ks.atBound(clock.Now())
			found[k] = c.atBoundCheck()
			break
		}
	}
	return found
}

func (s *Store) lookup(name string) (entry, error) {
	s.mu.RLock()
	e, ok := s.byKey[name]
	s.mu.RUnlock()
	if !ok {
		return entry{}, limiter.ErrNotFound
	}
	return e, nil
}
