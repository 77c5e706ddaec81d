// Package tenant enforces one limit per requester IP address, built on the
// limiter package, and answers which tenants are closest to being cut off.
package tenant

// NOTE: skeleton of the public API; the implementation replaces the bodies.

import (
	"context"
	"errors"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// MaxLowest is the largest k Lowest accepts.
const MaxLowest = 1000

// Errors returned by a Registry.
var (
	ErrInvalidIP = errors.New("invalid IP address")
	ErrInvalidK  = errors.New("invalid number of tenants")
)

// Config is the per-IP policy and the registry's bounds.
type Config struct {
	Policy     limiter.Policy
	IPv6Prefix int // 1..64, default 64
	MaxTenants int // default 1_000_000
}

// Decision is the answer to a tenant's acquisition.
type Decision struct {
	Tenant string // the normalized tenant: "203.0.113.7" or "2001:db8:1:2::/64"
	limiter.Decision
}

// Availability is what a tenant could take now.
type Availability struct {
	Tenant string
	limiter.Availability
}

// Entry is one tenant in a Lowest answer.
type Entry struct {
	Tenant     string
	Remaining  int64
	Limit      int64
	ResetAfter time.Duration
}

// Stats counts what a Registry holds.
type Stats struct {
	Tenants      int // tenants tracked
	IndexEntries int // entries of the lowest-capacity index
}

// Registry is the per-IP limiter.
type Registry struct{}

func New(cfg Config, now func() time.Time) (*Registry, error) { return &Registry{}, nil }
func (r *Registry) Policy() limiter.Policy                    { return limiter.Policy{} }
func (r *Registry) Acquire(ctx context.Context, ip string, permits int64) (Decision, error) {
	return Decision{}, nil
}
func (r *Registry) Available(ctx context.Context, ip string) (Availability, error) {
	return Availability{}, nil
}
func (r *Registry) Lowest(ctx context.Context, k int) ([]Entry, error) { return nil, nil }
func (r *Registry) Stats() Stats                                       { return Stats{} }
