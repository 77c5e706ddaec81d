package redis

import (
	"context"
	"fmt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// errKeyed is the error of a Put of a keyed limiter: this store keeps none
// yet, so a keyed limiter, or a call with a key, never reaches Redis.
var errKeyed = fmt.Errorf("%w: keyed limiters are kept by the memory backend only, for now", limiter.ErrUnsupported)

// notKeyed is the error of a call with a key on the limiter name: unknown,
// or not keyed, as every limiter this store holds is.
func (s *Store) notKeyed(ctx context.Context, name string) error {
	if _, err := s.Get(ctx, name); err != nil {
		return err
	}
	return limiter.KeyMismatch(name, false)
}

// AcquireKey implements limiter.Store: no limiter of this store is keyed.
func (s *Store) AcquireKey(ctx context.Context, name, _ string, _ int64) (limiter.KeyDecision, error) {
	return limiter.KeyDecision{}, s.notKeyed(ctx, name)
}

// AvailableKey implements limiter.Store: no limiter of this store is keyed.
func (s *Store) AvailableKey(ctx context.Context, name, _ string) (limiter.KeyAvailability, error) {
	return limiter.KeyAvailability{}, s.notKeyed(ctx, name)
}

// Lowest implements limiter.Store: no limiter of this store is keyed.
func (s *Store) Lowest(ctx context.Context, name string, _ int) ([]limiter.KeyEntry, error) {
	return nil, s.notKeyed(ctx, name)
}

// AcquireKey implements limiter.Store.
func (l *Lazy) AcquireKey(ctx context.Context, name, key string, permits int64) (limiter.KeyDecision, error) {
	return with(ctx, l, name, func(st *Store) (limiter.KeyDecision, error) { return st.AcquireKey(ctx, name, key, permits) })
}

// AvailableKey implements limiter.Store.
func (l *Lazy) AvailableKey(ctx context.Context, name, key string) (limiter.KeyAvailability, error) {
	return with(ctx, l, name, func(st *Store) (limiter.KeyAvailability, error) { return st.AvailableKey(ctx, name, key) })
}

// Lowest implements limiter.Store.
func (l *Lazy) Lowest(ctx context.Context, name string, k int) ([]limiter.KeyEntry, error) {
	return with(ctx, l, name, func(st *Store) ([]limiter.KeyEntry, error) { return st.Lowest(ctx, name, k) })
}
