package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Acquire takes permits (1 to limiter.MaxLimit, else the error wraps
// limiter.ErrInvalidPermits) from the limiter at the Redis server's time,
// all or nothing, in one atomic script. It is never retried: when the error
// wraps ErrUnavailable because the connection failed or the deadline passed
// after the script was sent, the permits may or may not have been taken.
//
// Acquisitions from one limiter that arrive while the Store's call for it
// is in flight wait for that call to return, then go together, in the
// order they arrived, as one run of the script that decides each of them
// as if alone (see coalescer).
func (s *Store) Acquire(ctx context.Context, name string, permits int64) (limiter.Decision, error) {
	if err := checkPermits(name, permits); err != nil {
		return limiter.Decision{}, err
	}
	r, err := s.acquisitions.do(ctx, name, permits)
	if err != nil {
		return limiter.Decision{}, unavailable("acquire", name, err)
	}
	return r.Decision, r.Err
}

// Available reports what the limiter could grant at the Redis server's
// time, without taking anything, in one read-only script. A sliding log's
// grants that have left the window are not counted, but only the next
// Acquire removes them (the in-memory log forgets them here already; the
// two differ only if the server's clock then steps back).
func (s *Store) Available(ctx context.Context, name string) (limiter.Availability, error) {
	return s.available(ctx, name, "")
}

// acquire is one Acquire at nowMicros (microseconds since the Unix epoch,
// in decimal), or at the server's time when nowMicros is empty, sent on its
// own. Only this package's tests pass an instant.
func (s *Store) acquire(ctx context.Context, name string, permits int64, nowMicros string) (limiter.Decision, error) {
	if err := checkPermits(name, permits); err != nil {
		return limiter.Decision{}, err
	}
	var r [1]limiter.Result
	s.decide(ctx, name, []int64{permits}, nowMicros, r[:])
	return r[0].Decision, r[0].Err
}

// decide runs the acquire script once to take permits[0], permits[1], …
// from the limiter name, in that order, and decides each into out[i].
// A limiter not where the Store believed it lives is looked up in the
// directory, and decided again where it now lives (see groups.go): the
// first run found no definition and so changed nothing.
func (s *Store) decide(ctx context.Context, name string, permits []int64, nowMicros string, out []limiter.Result) {
	reply := acquireScript.Exec(ctx, s.client, s.keys(name), acquireArgs(permits, nowMicros))
	decisions(name, permits, reply, out)
	if errors.Is(out[0].Err, limiter.ErrNotFound) && s.relocated(ctx, name) {
		reply = acquireScript.Exec(ctx, s.client, s.keys(name), acquireArgs(permits, nowMicros))
		decisions(name, permits, reply, out)
	}
}

// checkPermits is limiter.CheckPermits with the error Acquire returns for
// taking permits from name.
func checkPermits(name string, permits int64) error {
	if err := limiter.CheckPermits(permits); err != nil {
		return fmt.Errorf("redis: acquire %q: %w", name, err)
	}
	return nil
}

// acquireArgs returns the acquire script's arguments: take each of permits
// in turn at nowMicros, or at the server's time when nowMicros is empty.
func acquireArgs(permits []int64, nowMicros string) []string {
	args := make([]string, 1, 1+len(permits))
	args[0] = nowMicros
	for _, p := range permits {
		args = append(args, strconv.FormatInt(p, 10))
	}
	return args
}

// decisions reads the acquire script's reply to taking permits[i] from
// name into out[i]. Every acquisition reads its reply here, alone, grouped
// or in a batch, so that each decides and fails exactly as it would alone.
// A reply that fails fails every acquisition it was to decide.
func decisions(name string, permits []int64, reply rueidis.RedisResult, out []limiter.Result) {
	fail := func(err error) {
		for i := range permits {
			out[i] = limiter.Result{Err: err}
		}
	}
	v, err := reply.AsIntSlice()
	switch {
	case err != nil:
		fail(unavailable("acquire", name, err))
	case len(v) == 1 && v[0] == 0:
		fail(notFound("acquire", name))
	case len(v) == 1 && v[0] == -2:
		fail(fmt.Errorf("redis: acquire %q: %w", name, limiter.KeyMismatch(name, true)))
	case len(v) != 1+DecisionFields*len(permits) || v[0] != 1:
		fail(unavailable("acquire", name, fmt.Errorf("unexpected reply %v", v)))
	default:
		for i, p := range permits {
			out[i] = limiter.Result{Decision: DecisionOf(v[1+DecisionFields*i:], p)}
		}
	}
}

// available is Available at nowMicros, like acquire.
func (s *Store) available(ctx context.Context, name, nowMicros string) (limiter.Availability, error) {
	a, err := s.availableAt(ctx, name, nowMicros)
	if errors.Is(err, limiter.ErrNotFound) && s.relocated(ctx, name) {
		a, err = s.availableAt(ctx, name, nowMicros)
	}
	return a, err
}

// availableAt is available where the Store believes name lives.
func (s *Store) availableAt(ctx context.Context, name, nowMicros string) (limiter.Availability, error) {
	v, err := availableScript.Exec(ctx, s.client, s.keys(name), []string{nowMicros}).AsIntSlice()
	if err != nil {
		return limiter.Availability{}, unavailable("available", name, err)
	}
	if len(v) == 1 && v[0] == 0 {
		return limiter.Availability{}, notFound("available", name)
	}
	if len(v) == 1 && v[0] == -2 {
		return limiter.Availability{}, fmt.Errorf("redis: available %q: %w", name, limiter.KeyMismatch(name, true))
	}
	if len(v) != 5 {
		return limiter.Availability{}, unavailable("available", name, fmt.Errorf("unexpected reply %v", v))
	}
	return limiter.Availability{Remaining: v[1], Limit: v[2], ResetAfter: Duration(v[3], v[4])}, nil
}
