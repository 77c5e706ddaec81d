package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Acquire takes permits (1 to limiter.MaxLimit, else the error wraps
// limiter.ErrInvalidPermits) from the limiter at the Redis server's time,
// all or nothing, in one atomic script. It is never retried: when the error
// wraps ErrUnavailable because the connection failed or the deadline passed
// after the script was sent, the permits may or may not have been taken.
func (s *Store) Acquire(ctx context.Context, name string, permits int64) (limiter.Decision, error) {
	return s.acquire(ctx, name, permits, "")
}

// Available reports what the limiter could grant at the Redis server's
// time, without taking anything, in one read-only script. A sliding log's
// grants that have left the window are not counted, but only the next
// Acquire removes them (the in-memory log forgets them here already; the
// two differ only if the server's clock then steps back).
func (s *Store) Available(ctx context.Context, name string) (limiter.Availability, error) {
	return s.available(ctx, name, "")
}

// acquire is Acquire at nowMicros (microseconds since the Unix epoch, in
// decimal), or at the server's time when nowMicros is empty. Only this
// package's tests pass an instant.
func (s *Store) acquire(ctx context.Context, name string, permits int64, nowMicros string) (limiter.Decision, error) {
	if err := checkPermits(name, permits); err != nil {
		return limiter.Decision{}, err
	}
	reply := acquireScript.Exec(ctx, s.client, s.keys(name), acquireArgs(permits, nowMicros))
	return decision(name, permits, reply)
}

// checkPermits is limiter.CheckPermits with the error Acquire returns for
// taking permits from name.
func checkPermits(name string, permits int64) error {
	if err := limiter.CheckPermits(permits); err != nil {
		return fmt.Errorf("redis: acquire %q: %w", name, err)
	}
	return nil
}

// acquireArgs returns the acquire script's arguments: take permits at
// nowMicros, or at the server's time when nowMicros is empty.
func acquireArgs(permits int64, nowMicros string) []string {
	return []string{strconv.FormatInt(permits, 10), nowMicros}
}

// decision reads the acquire script's reply to taking permits from name.
// Acquire and AcquireBatch both read their replies here, so that a batched
// acquisition decides and fails exactly as the same acquisition alone.
func decision(name string, permits int64, reply rueidis.RedisResult) (limiter.Decision, error) {
	v, err := reply.AsIntSlice()
	if err != nil {
		return limiter.Decision{}, unavailable("acquire", name, err)
	}
	if len(v) == 1 && v[0] == 0 {
		return limiter.Decision{}, notFound("acquire", name)
	}
	if len(v) != 9 {
		return limiter.Decision{}, unavailable("acquire", name, fmt.Errorf("unexpected reply %v", v))
	}
	return limiter.Decision{
		Allowed:         v[1] == 1,
		Permits:         permits,
		Remaining:       v[2],
		Limit:           v[3],
		RetryAfter:      duration(v[4], v[5]),
		ResetAfter:      duration(v[6], v[7]),
		ExceedsCapacity: v[8] == 1,
	}, nil
}

// available is Available at nowMicros, like acquire.
func (s *Store) available(ctx context.Context, name, nowMicros string) (limiter.Availability, error) {
	v, err := availableScript.Exec(ctx, s.client, s.keys(name), []string{nowMicros}).AsIntSlice()
	if err != nil {
		return limiter.Availability{}, unavailable("available", name, err)
	}
	if len(v) == 1 && v[0] == 0 {
		return limiter.Availability{}, notFound("available", name)
	}
	if len(v) != 5 {
		return limiter.Availability{}, unavailable("available", name, fmt.Errorf("unexpected reply %v", v))
	}
	return limiter.Availability{Remaining: v[1], Limit: v[2], ResetAfter: duration(v[3], v[4])}, nil
}

// duration is us microseconds plus ns nanoseconds, as the scripts report
// spans: whole nanoseconds of a span may exceed 2^53, beyond what a Lua
// number holds exactly.
func duration(us, ns int64) time.Duration {
	return time.Duration(us)*time.Microsecond + time.Duration(ns)
}
