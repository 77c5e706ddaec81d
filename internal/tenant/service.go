package tenant

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

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
// limiter.Service does for named limiters. It traces each decision
// (tenant.Acquire, tenant.Available, tenant.Lowest) as a child of the
// caller's span when that span is recording, whichever the backend: the
// backends start no span of their own. It is safe for concurrent use.
type Service struct {
	backend Backend
	opts    limiter.ServiceOptions
	tracer  trace.Tracer
}

// NewService returns a Service over backend tuned by opts: its FailureMode
// and OnUnavailable hook for acquisitions, its Timeout for every backend
// call, and its TracerProvider for the spans.
func NewService(backend Backend, opts limiter.ServiceOptions) *Service {
	return &Service{backend: backend, opts: opts, tracer: opts.Tracer("github.com/ratelimiter/ratelimiter/internal/tenant")}
}

// Policy returns the per-IP policy.
func (s *Service) Policy() limiter.Policy { return s.backend.Policy() }

// Tenant names the tenant ip counts as.
func (s *Service) Tenant(ip string) (string, error) { return s.backend.Tenant(ip) }

// Acquire takes permits from the tenant ip counts as, all or nothing. When
// the backend cannot answer, the decision is limiter.Degraded under the
// failure mode, for the tenant ip counts as; its span then has an Error
// status and ratelimiter.degraded set.
func (s *Service) Acquire(ctx context.Context, ip string, permits int64) (d Decision, err error) {
	ctx, span := limiter.StartSpan(ctx, s.tracer, "tenant.Acquire")
	defer func() {
		if err == nil && span.IsRecording() {
			span.SetAttributes(
				attribute.String("ratelimiter.tenant", d.Tenant),
				attribute.Int64("ratelimiter.permits", permits),
				attribute.Bool("ratelimiter.allowed", d.Allowed),
				attribute.Int64("ratelimiter.remaining", d.Remaining),
			)
		}
		limiter.EndSpan(span, err)
	}()
	bctx, cancel := s.opts.Bound(ctx)
	d, err = s.backend.Acquire(bctx, ip, permits)
	cancel()
	if err == nil || !s.opts.Unavailable(ctx, err) {
		return d, err
	}
	tenant, terr := s.backend.Tenant(ip)
	if terr != nil {
		return Decision{}, fmt.Errorf("tenant: acquire: %w", terr)
	}
	if err := limiter.CheckPermits(permits); err != nil {
		return Decision{}, fmt.Errorf("tenant: acquire %s: %w", tenant, err)
	}
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(attribute.Bool("ratelimiter.degraded", true))
	return Decision{Tenant: tenant, Decision: limiter.Degraded(permits, s.opts.FailureMode)}, nil
}

// Available reports what the tenant ip counts as could take now. Unlike an
// acquisition, it has no answer without the backend: its error is returned.
func (s *Service) Available(ctx context.Context, ip string) (a Availability, err error) {
	ctx, span := limiter.StartSpan(ctx, s.tracer, "tenant.Available")
	defer func() {
		if err == nil && span.IsRecording() {
			span.SetAttributes(
				attribute.String("ratelimiter.tenant", a.Tenant),
				attribute.Int64("ratelimiter.remaining", a.Remaining),
			)
		}
		limiter.EndSpan(span, err)
	}()
	bctx, cancel := s.opts.Bound(ctx)
	defer cancel()
	return s.backend.Available(bctx, ip)
}

// Lowest returns up to k tenants with the fewest permits left, fewest first.
func (s *Service) Lowest(ctx context.Context, k int) (entries []Entry, err error) {
	ctx, span := limiter.StartSpan(ctx, s.tracer, "tenant.Lowest")
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(attribute.Int("ratelimiter.k", k), attribute.Int("ratelimiter.tenants", len(entries)))
		}
		limiter.EndSpan(span, err)
	}()
	bctx, cancel := s.opts.Bound(ctx)
	defer cancel()
	return s.backend.Lowest(bctx, k)
}
