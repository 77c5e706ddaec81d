package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// Bad input is refused before the store sees it, with the error a caller can
// match, and nothing is consumed.
func TestServiceRejectsBadInputWithoutConsuming(t *testing.T) {
	ctx := context.Background()
	svc := limiter.NewService(memory.New(clocktest.New(t0).Limiter(), 0))
	if _, err := svc.Put(ctx, limiter.Definition{Name: "api", Policy: limiter.Policy{Limit: 9, Period: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		call    func() error
		wantErr error
	}{
		{"zero permits", func() error { _, err := svc.Acquire(ctx, "api", 0); return err }, limiter.ErrInvalidPermits},
		{"negative permits", func() error { _, err := svc.Acquire(ctx, "api", -3); return err }, limiter.ErrInvalidPermits},
		{"absurd permits", func() error { _, err := svc.Acquire(ctx, "api", 1<<40); return err }, limiter.ErrInvalidPermits},
		{"bad name", func() error { _, err := svc.Acquire(ctx, "../api", 1); return err }, limiter.ErrInvalidName},
		{"unknown", func() error { _, err := svc.Acquire(ctx, "nope", 1); return err }, limiter.ErrNotFound},
		{"bad policy", func() error {
			_, err := svc.Put(ctx, limiter.Definition{Name: "api", Policy: limiter.Policy{Limit: 9, Period: time.Nanosecond}})
			return err
		}, limiter.ErrInvalidPolicy},
		{"bad name on put", func() error {
			_, err := svc.Put(ctx, limiter.Definition{Name: "a b", Policy: limiter.Policy{Limit: 9, Period: time.Minute}})
			return err
		}, limiter.ErrInvalidName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, tt.wantErr) {
				t.Errorf("got %v, want %v", err, tt.wantErr)
			}
			a, err := svc.Available(ctx, "api")
			if err != nil || a.Remaining != 9 || a.Limit != 9 {
				t.Errorf("available afterwards: got %+v, %v, want 9 of 9", a, err)
			}
		})
	}
}

// List refuses a max outside 1..MaxList before the store sees it.
func TestServiceListRejectsBadMax(t *testing.T) {
	ctx := context.Background()
	svc := limiter.NewService(memory.New(nil, 0))
	if _, err := svc.Put(ctx, limiter.Definition{Name: "api", Policy: limiter.Policy{Limit: 9, Period: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		max     int
		want    int
		wantErr error
	}{
		{math.MinInt, 0, limiter.ErrInvalidPageSize},
		{-1, 0, limiter.ErrInvalidPageSize},
		{0, 0, limiter.ErrInvalidPageSize},
		{1, 1, nil},
		{limiter.MaxList, 1, nil},
		{limiter.MaxList + 1, 0, limiter.ErrInvalidPageSize},
		{math.MaxInt, 0, limiter.ErrInvalidPageSize},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.max), func(t *testing.T) {
			defs, err := svc.List(ctx, "", tt.max)
			if !errors.Is(err, tt.wantErr) || len(defs) != tt.want {
				t.Errorf("got %d definitions, %v; want %d, %v", len(defs), err, tt.want, tt.wantErr)
			}
		})
	}
}
