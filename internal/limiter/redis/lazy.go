package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
// Store, then goes to that Store. It also holds the limiters the service
// declares in its own configuration (see Declare). It is safe for
// concurrent use; Set may be called at any time.
type Lazy struct {
	p        atomic.Pointer[Store]
	declared []limiter.Definition
	timeout  time.Duration
}

// NewLazy returns a Lazy store, unset, for a service whose configuration
// declares the limiters in declared (which may be empty; it is kept as
// given). Each call Declare makes to Redis waits at most timeout, or without
// bound when timeout <= 0.
func NewLazy(declared []limiter.Definition, timeout time.Duration) *Lazy {
	return &Lazy{declared: declared, timeout: timeout}
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

// Declare puts each declared limiter, so that the configuration's policy
// replaces any other: a replica that starts with a changed configuration
// applies it. It retries a limiter every second while Redis cannot answer,
// and logs one that fails otherwise, until ctx is done.
func (l *Lazy) Declare(ctx context.Context, logger *slog.Logger) {
	for _, def := range l.declared {
		for {
			pctx, cancel := l.bound(ctx)
			_, err := l.Put(pctx, def)
			cancel()
			if err == nil {
				break
			}
			if !errors.Is(err, limiter.ErrUnavailable) || ctx.Err() != nil {
				logger.Error("limiter from the config file not created", "name", def.Name, "error", err)
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// Put implements limiter.Store.
func (l *Lazy) Put(ctx context.Context, def limiter.Definition) (bool, error) {
	st, err := l.get()
	if err != nil {
		return false, err
	}
	return st.Put(ctx, def)
}

// Get implements limiter.Store.
func (l *Lazy) Get(ctx context.Context, name string) (limiter.Definition, error) {
	st, err := l.get()
	if err != nil {
		return limiter.Definition{}, err
	}
	return st.Get(ctx, name)
}

// List implements limiter.Store.
func (l *Lazy) List(ctx context.Context, after string, max int) ([]limiter.Definition, error) {
	st, err := l.get()
	if err != nil {
		return nil, err
	}
	return st.List(ctx, after, max)
}

// Delete implements limiter.Store.
func (l *Lazy) Delete(ctx context.Context, name string) error {
	st, err := l.get()
	if err != nil {
		return err
	}
	return st.Delete(ctx, name)
}

// Acquire implements limiter.Store.
func (l *Lazy) Acquire(ctx context.Context, name string, permits int64) (limiter.Decision, error) {
	st, err := l.get()
	if err != nil {
		return limiter.Decision{}, err
	}
	return st.Acquire(ctx, name, permits)
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
}

// Available implements limiter.Store.
func (l *Lazy) Available(ctx context.Context, name string) (limiter.Availability, error) {
	st, err := l.get()
	if err != nil {
		return limiter.Availability{}, err
	}
	return st.Available(ctx, name)
}
