package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
)

// Until Set, decisions fail as unavailable, while the policy and tenant
// names are known without Redis.
func TestLazyNotConnected(t *testing.T) {
	policy := limiter.Policy{Limit: 10, Period: time.Minute}
	l := NewLazy(policy, 64)
	ctx := context.Background()
	if got := l.Policy(); got != policy {
		t.Errorf("Policy: got %+v, want %+v", got, policy)
	}
	if got, err := l.Tenant("2001:db8::1"); err != nil || got != "2001:db8::/64" {
		t.Errorf("Tenant(2001:db8::1): got %q, %v, want 2001:db8::/64", got, err)
	}
	calls := []struct {
		name string
		call func() error
	}{
		{"Acquire", func() error { _, err := l.Acquire(ctx, "192.0.2.1", 1); return err }},
		{"Available", func() error { _, err := l.Available(ctx, "192.0.2.1"); return err }},
		{"Lowest", func() error { _, err := l.Lowest(ctx, 5); return err }},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, limiterredis.ErrNotConnected) || !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("got %v, want ErrNotConnected, which wraps ErrUnavailable", err)
			}
		})
	}
}
