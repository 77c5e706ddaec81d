package redis

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

var _ limiter.BatchStore = (*Lazy)(nil)

// ErrNotConnected is the error of a Lazy store, and of tenant/redis's, until
// its Redis store is set: Redis has not answered yet. It wraps
// limiter.ErrUnavailable, so decisions follow the failure mode meanwhile.
var ErrNotConnected = fmt.Errorf("%w: not connected to Redis yet", limiter.ErrUnavailable)

// Lazy is a limiter.BatchStore for a service that starts before Redis
// answers: every call fails with ErrNotConnected until Set gives it the
// Store, then goes to that Store. It is safe for concurrent use; Set may
// be called at any time.
//
// Lazy also keeps the limiters the service declares in its own
// configuration. They are kept in Redis like any other, so a Redis that
// restarts empty (no persistence, or a failover to an empty replica) loses
// them while the service still advertises them. Lazy brings them back by
// the rule "declared means created if absent": Declare puts them when the
// service starts; then a call that finds one missing (Acquire,
// AcquireBatch, Available, Get) creates it and is made again, and Keep
// looks for all of them periodically. Creating if absent never reverts a
// declared limiter that an API caller replaced. One that an API caller
// deleted comes back by the same rule, at its next use or check: a
// declared limiter is removed by removing it from the configuration.
type Lazy struct {
	p        atomic.Pointer[Store]
	declared atomic.Pointer[declaration]
	timeout  time.Duration
}

// declaration is the set of declared limiters, replaced as a whole.
type declaration struct {
	list   []limiter.Definition
	byName map[string]limiter.Definition
}

// NewLazy returns a Lazy store, unset, for a service whose configuration
// declares the limiters in declared (which may be empty; it is kept as
// given). Each call Declare and Keep make to Redis waits at most timeout,
// or without bound when timeout <= 0.
func NewLazy(declared []limiter.Definition, timeout time.Duration) *Lazy {
	l := &Lazy{timeout: timeout}
	l.Redeclare(declared)
	return l
}

// Redeclare makes declared the declared limiters from now on, for a
// configuration reloaded while the service runs: the calls, checks and
// Declare that follow create these. It puts none of them itself.
func (l *Lazy) Redeclare(declared []limiter.Definition) {
	byName := make(map[string]limiter.Definition, len(declared))
	for _, def := range declared {
		byName[def.Name] = def
	}
	l.declared.Store(&declaration{list: declared, byName: byName})
}

// bound applies l's timeout to a call it makes of its own accord.
func (l *Lazy) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if l.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, l.timeout)
}

// Set gives l the Store to use from now on.
func (l *Lazy) Set(st *Store) { l.p.Store(st) }

func (l *Lazy) get() (*Store, error) {
	if st := l.p.Load(); st != nil {
		return st, nil
	}
	return nil, ErrNotConnected
}

// with calls f with the Store once it is set. f calls the Store about the
// limiter name; when name is declared and f found it missing, with creates
// it and calls f again (see restore). Calls that must not bring a limiter
// back (Put, Delete, List) pass "", which no limiter has.
func with[T any](ctx context.Context, l *Lazy, name string, f func(*Store) (T, error)) (T, error) {
	st, err := l.get()
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := f(st)
	if name != "" && l.restore(ctx, st, name, err) {
		v, err = f(st)
	}
	return v, err
}

// Put implements limiter.Store.
func (l *Lazy) Put(ctx context.Context, def limiter.Definition) (bool, error) {
	return with(ctx, l, "", func(st *Store) (bool, error) { return st.Put(ctx, def) })
}

// Get implements limiter.Store.
func (l *Lazy) Get(ctx context.Context, name string) (limiter.Definition, error) {
	return with(ctx, l, name, func(st *Store) (limiter.Definition, error) { return st.Get(ctx, name) })
}

// List implements limiter.Store.
func (l *Lazy) List(ctx context.Context, after string, max int) ([]limiter.Definition, error) {
	return with(ctx, l, "", func(st *Store) ([]limiter.Definition, error) { return st.List(ctx, after, max) })
}

// Delete implements limiter.Store.
func (l *Lazy) Delete(ctx context.Context, name string) error {
	_, err := with(ctx, l, "", func(st *Store) (struct{}, error) { return struct{}{}, st.Delete(ctx, name) })
	return err
}

// DeleteIdle implements limiter.IdleDeleter.
func (l *Lazy) DeleteIdle(ctx context.Context, name string) error {
	_, err := with(ctx, l, "", func(st *Store) (struct{}, error) { return struct{}{}, st.DeleteIdle(ctx, name) })
	return err
}

// Acquire implements limiter.Store.
func (l *Lazy) Acquire(ctx context.Context, name string, permits int64) (limiter.Decision, error) {
	return with(ctx, l, name, func(st *Store) (limiter.Decision, error) { return st.Acquire(ctx, name, permits) })
}

// Available implements limiter.Store.
func (l *Lazy) Available(ctx context.Context, name string) (limiter.Availability, error) {
	return with(ctx, l, name, func(st *Store) (limiter.Availability, error) { return st.Available(ctx, name) })
}

// Decide implements limiter.Store. A declared limiter found missing is
// created, and the decision made again, as for Acquire: the first run
// found no definition and so changed nothing.
func (l *Lazy) Decide(ctx context.Context, items []limiter.Item, mode limiter.Mode, once string) (limiter.Verdict, error) {
	return l.joint(ctx, items, func(st *Store) (limiter.Verdict, error) { return st.Decide(ctx, items, mode, once) })
}

// Reserve implements limiter.Store, creating a declared limiter found
// missing as Decide does.
func (l *Lazy) Reserve(ctx context.Context, items []limiter.Item, ttl time.Duration, once string) (limiter.Verdict, error) {
	return l.joint(ctx, items, func(st *Store) (limiter.Verdict, error) { return st.Reserve(ctx, items, ttl, once) })
}

// joint calls f, a decision on items, with the Store once it is set; when
// f found a limiter missing, it creates the declared ones among items and
// calls f again.
func (l *Lazy) joint(ctx context.Context, items []limiter.Item, f func(*Store) (limiter.Verdict, error)) (limiter.Verdict, error) {
	st, err := l.get()
	if err != nil {
		return limiter.Verdict{}, err
	}
	v, err := f(st)
	if !errors.Is(err, limiter.ErrNotFound) {
		return v, err
	}
	restored := false
	for _, it := range items {
		restored = l.restore(ctx, st, it.Name, err) || restored
	}
	if restored {
		v, err = f(st)
	}
	return v, err
}

// Settle implements limiter.Store.
func (l *Lazy) Settle(ctx context.Context, id string, actual []limiter.Item, once string) (limiter.Verdict, error) {
	st, err := l.get()
	if err != nil {
		return limiter.Verdict{}, err
	}
	return st.Settle(ctx, id, actual, once)
}

// AcquireBatch implements limiter.BatchStore.
func (l *Lazy) AcquireBatch(ctx context.Context, reqs []limiter.Request, out []limiter.Result) {
	st, err := l.get()
	if err != nil {
		for i := range out {
			out[i] = limiter.Result{Err: err}
		}
		return
	}
	st.AcquireBatch(ctx, reqs, out)
	if len(l.declared.Load().byName) == 0 {
		return
	}
	for i := range out {
		if errors.Is(out[i].Err, limiter.ErrNotFound) {
			l.restoreBatch(ctx, st, reqs, out)
			return
		}
	}
}
