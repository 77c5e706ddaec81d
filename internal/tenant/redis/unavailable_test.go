package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// TestUnavailable stops the server, or freezes it: every call fails within
// its context's deadline with an error wrapping limiter.ErrUnavailable, and
// nothing panics.
func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(*redistest.Server, testing.TB)
	}{
		{"Stopped", (*redistest.Server).Stop},
		{"Frozen", (*redistest.Server).Pause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartStandalone(t)
			c := newClient(t, srv.Addr)
			var all []*Tenants
			for _, alg := range algorithms {
				ts := newTenants(t, c, policy(1, time.Hour, alg))
				if _, err := ts.Acquire(context.Background(), "192.0.2.1", 1); err != nil {
					t.Fatal(err)
				}
				all = append(all, ts)
			}
			tc.fail(srv, t)
			for _, ts := range all {
				checkUnavailable(t, ts)
			}
		})
	}
}

func checkUnavailable(t *testing.T, ts *Tenants) {
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Acquire", func(ctx context.Context) error { _, err := ts.Acquire(ctx, "192.0.2.1", 1); return err }},
		{"Available", func(ctx context.Context) error { _, err := ts.Available(ctx, "192.0.2.1"); return err }},
		{"Lowest", func(ctx context.Context) error { _, err := ts.Lowest(ctx, 10); return err }},
	}
	const deadline = 300 * time.Millisecond
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		err := c.call(ctx)
		elapsed := time.Since(start)
		cancel()
		t.Logf("%s %s: %v after %s", ts.policy.Algorithm, c.name, err, elapsed.Round(time.Millisecond))
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("%s: got %v, want an error wrapping ErrUnavailable", c.name, err)
		}
		// The deadline bounds the call; the margin covers a loaded machine.
		if elapsed > deadline+2*time.Second {
			t.Errorf("%s took %s, want about the %s deadline", c.name, elapsed, deadline)
		}
	}
}
