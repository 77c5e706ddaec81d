package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// downStore is a Store whose backend is down: every call fails with
// ErrUnavailable, after waiting for the call's context when hang is set.
type downStore struct {
	limiter.Store
	hang     bool
	deadline atomic.Bool // a call carried a deadline
}

func (s *downStore) fail(ctx context.Context) error {
	if _, ok := ctx.Deadline(); ok {
		s.deadline.Store(true)
	}
	if s.hang {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, ctx.Err())
	}
	return fmt.Errorf("%w: connection refused", limiter.ErrUnavailable)
}

func (s *downStore) Acquire(ctx context.Context, _ string, _ int64) (limiter.Decision, error) {
	return limiter.Decision{}, s.fail(ctx)
}

func (s *downStore) Available(ctx context.Context, _ string) (limiter.Availability, error) {
	return limiter.Availability{}, s.fail(ctx)
}

func TestServiceFailureModes(t *testing.T) {
	tests := []struct {
		name        string
		mode        limiter.FailureMode
		wantAllowed bool
	}{
		{"fail closed denies", limiter.FailClosed, false},
		{"fail open grants", limiter.FailOpen, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var reported atomic.Int64
			svc := limiter.NewServiceWith(&downStore{}, limiter.ServiceOptions{
				FailureMode:   tt.mode,
				OnUnavailable: func(err error) { reported.Add(1) },
			})
			d, err := svc.Acquire(context.Background(), "api", 3)
			if err != nil {
				t.Fatalf("Acquire: %v, want a degraded decision", err)
			}
			want := limiter.Decision{Allowed: tt.wantAllowed, Permits: 3, Degraded: true}
			if d != want {
				t.Errorf("got %+v, want %+v", d, want)
			}
			if got := reported.Load(); got != 1 {
				t.Errorf("OnUnavailable called %d times, want 1", got)
			}
			// Availability has no answer without the backend.
			if _, err := svc.Available(context.Background(), "api"); !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("Available: got %v, want ErrUnavailable", err)
			}
			// Bad input is still bad input, whatever the backend's state.
			if _, err := svc.Acquire(context.Background(), "api", 0); !errors.Is(err, limiter.ErrInvalidPermits) {
				t.Errorf("Acquire of 0 permits: got %v, want ErrInvalidPermits", err)
			}
		})
	}
}

// The Timeout bounds a store call that would otherwise wait for the
// caller's context, and the call is decided by the failure mode.
func TestServiceTimeout(t *testing.T) {
	store := &downStore{hang: true}
	svc := limiter.NewServiceWith(store, limiter.ServiceOptions{FailureMode: limiter.FailOpen, Timeout: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := svc.Acquire(ctx, "api", 1)
	if err != nil || !d.Degraded || !d.Allowed {
		t.Fatalf("Acquire = %+v, %v; want a degraded grant", d, err)
	}
	if ctx.Err() != nil {
		t.Errorf("the caller's context ran out: the Timeout did not bound the call")
	}
	if !store.deadline.Load() {
		t.Errorf("the store call carried no deadline")
	}
}

// Errors other than unavailability are not decisions.
func TestServiceNotFoundIsNotDegraded(t *testing.T) {
	svc := limiter.NewServiceWith(memory.New(nil, 0), limiter.ServiceOptions{FailureMode: limiter.FailOpen})
	if _, err := svc.Acquire(context.Background(), "missing", 1); !errors.Is(err, limiter.ErrNotFound) {
		t.Errorf("got %v, want ErrNotFound", err)
	}
}

// A caller that went away is not an outage: its acquisition fails with the
// caller's error, undecided and unreported, whatever the failure mode.
func TestServiceCallerGone(t *testing.T) {
	for _, mode := range []limiter.FailureMode{limiter.FailClosed, limiter.FailOpen} {
		t.Run(mode.String(), func(t *testing.T) {
			var reported atomic.Int64
			svc := limiter.NewServiceWith(&downStore{hang: true}, limiter.ServiceOptions{
				FailureMode: mode, Timeout: time.Minute,
				OnUnavailable: func(error) { reported.Add(1) },
			})
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			d, err := svc.Acquire(ctx, "api", 1)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Acquire after the caller cancelled: got %+v, %v; want an error wrapping context.Canceled", d, err)
			}
			if d.Degraded || d.Allowed {
				t.Errorf("Acquire after the caller cancelled: got decision %+v, want none", d)
			}
			if got := reported.Load(); got != 0 {
				t.Errorf("OnUnavailable called %d times, want 0", got)
			}
		})
	}
}
