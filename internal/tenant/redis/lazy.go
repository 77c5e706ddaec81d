package redis

import (
	"context"
	"sync/atomic"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

var _ tenant.Backend = (*Lazy)(nil)

// Lazy is a tenant.Backend for a service that starts before Redis answers:
// decisions fail with limiterredis.ErrNotConnected until Set gives it the
// Tenants, then go to them. It knows the policy and names tenants by
// itself, so that answers made without Redis name the right tenant. It is
// safe for concurrent use; Set may be called at any time.
type Lazy struct {
	p      atomic.Pointer[Tenants]
	policy limiter.Policy
	bits   int
}

// NewLazy returns a Lazy backend, unset, for policy, naming IPv6 tenants by
// their first bits bits (tenant.Config.IPv6Prefix).
func NewLazy(policy limiter.Policy, bits int) *Lazy {
	return &Lazy{policy: policy, bits: bits}
}

// Set gives l the Tenants to use from now on.
func (l *Lazy) Set(t *Tenants) { l.p.Store(t) }

// Policy implements tenant.Backend.
func (l *Lazy) Policy() limiter.Policy { return l.policy }

// Tenant implements tenant.Backend.
func (l *Lazy) Tenant(ip string) (string, error) {
	_, name, err := tenant.Key(ip, l.bits)
	return name, err
}

// Acquire implements tenant.Backend.
func (l *Lazy) Acquire(ctx context.Context, ip string, permits int64) (tenant.Decision, error) {
	if t := l.p.Load(); t != nil {
		return t.Acquire(ctx, ip, permits)
	}
	return tenant.Decision{}, limiterredis.ErrNotConnected
}

// Available implements tenant.Backend.
func (l *Lazy) Available(ctx context.Context, ip string) (tenant.Availability, error) {
	if t := l.p.Load(); t != nil {
		return t.Available(ctx, ip)
	}
	return tenant.Availability{}, limiterredis.ErrNotConnected
}

// Lowest implements tenant.Backend.
func (l *Lazy) Lowest(ctx context.Context, k int) ([]tenant.Entry, error) {
	if t := l.p.Load(); t != nil {
		return t.Lowest(ctx, k)
	}
	return nil, limiterredis.ErrNotConnected
}
