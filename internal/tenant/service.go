package tenant

import (
	"context"
	"errors"
	"fmt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Backend is where per-IP limits are kept and decided: a Registry in this
// process, or a shared store. Errors wrap ErrInvalidIP, ErrInvalidK and the
// limiter package's sentinels; ErrUnavailable when the backend cannot answer.
type Backend interface {
	Acquire(ctx context.Context, ip string, permits int64) (Decision, error)
	Available(ctx context.Context, ip string) (Availability, error)
	Lowest(ctx context.Context, k int) ([]Entry, error)
	Policy() limiter.Policy
	// Tenant names the tenant ip counts as, without consulting any state.
	Tenant(ip string) (string, error)
}

var _ Backend = (*Registry)(nil)

// Service serves per-IP limits from a Backend, deciding acquisitions the
// backend cannot answer (limiter.ErrUnavailable) by a failure mode, as
// limiter.Service does for named limiters. It is safe for concurrent use.
type Service struct {
	backend Backend
	opts    limiter.ServiceOptions
}

// NewService returns a Service over backend tuned by opts: its FailureMode
// and OnUnavailable hook for acquisitions, and its Timeout for every
// backend call.
func NewService(backend Backend, opts limiter.ServiceOptions) *Service {
	return &Service{backend: backend, opts: opts}
}

// Policy returns the per-IP policy.
func (s *Service) Policy() limiter.Policy { return s.backend.Policy() }

// Tenant names the tenant ip counts as.
func (s *Service) Tenant(ip string) (string, error) { return s.backend.Tenant(ip) }

// Acquire takes permits from the tenant ip counts as, all or nothing. When
// the backend cannot answer, the decision is limiter.Degraded under the
// failure mode, for the tenant ip counts as.
func (s *Service) Acquire(ctx context.Context, ip string, permits int64) (Decision, error) {
	bctx, cancel := s.bound(ctx)
	d, err := s.backend.Acquire(bctx, ip, permits)
	cancel()
	if err == nil || !s.unavailable(ctx, err) {
		return d, err
	}
	tenant, terr := s.backend.Tenant(ip)
	if terr != nil {
		return Decision{}, fmt.Errorf("tenant: acquire: %w", terr)
	}
	if err := limiter.CheckPermits(permits); err != nil {
		return Decision{}, fmt.Errorf("tenant: acquire %s: %w", tenant, err)
	}
	return Decision{Tenant: tenant, Decision: limiter.Degraded(permits, s.opts.FailureMode)}, nil
}

// Available reports what the tenant ip counts as could take now. Unlike an
// acquisition, it has no answer without the backend: its error is returned.
func (s *Service) Available(ctx context.Context, ip string) (Availability, error) {
	bctx, cancel := s.bound(ctx)
	defer cancel()
	return s.backend.Available(bctx, ip)
}

// Lowest returns up to k tenants with the fewest permits left, fewest first.
func (s *Service) Lowest(ctx context.Context, k int) ([]Entry, error) {
	bctx, cancel := s.bound(ctx)
	defer cancel()
	return s.backend.Lowest(bctx, k)
}

func (s *Service) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.opts.Timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.opts.Timeout)
}

func (s *Service) unavailable(ctx context.Context, err error) bool {
	// A caller that went away cut the call short, not the backend: there
	// is no one to answer and no outage to report.
	if !errors.Is(err, limiter.ErrUnavailable) || ctx.Err() != nil {
		return false
	}
	if s.opts.OnUnavailable != nil {
		s.opts.OnUnavailable(err)
	}
	return true
}
