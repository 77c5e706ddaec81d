package httpapi

import (
	"context"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/ratelimitheader"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// defaultLowest is the number of tenants listLowestTenants returns when
// none is asked for.
const defaultLowest = 10

// AcquireTenant takes permits from the limit of the tenant an IP address
// belongs to.
func (s *server) AcquireTenant(ctx context.Context, req gen.AcquireTenantRequestObject) (gen.AcquireTenantResponseObject, error) {
	d, err := s.tenants.Acquire(ctx, req.IP, permitsOf(req.Body))
	if err != nil {
		return nil, err
	}
	s.tel.decidedTenant(d.Decision)
	if d.Degraded {
		return &decisionAnswer{tenant: d.Tenant, isTenant: true, d: d.Decision}, nil
	}
	return &decisionAnswer{
		tenant:    d.Tenant,
		isTenant:  true,
		d:         d.Decision,
		policy:    s.tenantPolicy,
		rateLimit: ratelimitheader.Value(tenantLimiter, d.Remaining, d.ResetAfter),
	}, nil
}

// GetTenantAvailable reports what the tenant of an IP address could take
// now.
func (s *server) GetTenantAvailable(ctx context.Context, req gen.GetTenantAvailableRequestObject) (gen.GetTenantAvailableResponseObject, error) {
	a, err := s.tenants.Available(ctx, req.IP)
	if err != nil {
		return nil, err
	}
	return &availabilityAnswer{
		tenant:    a.Tenant,
		isTenant:  true,
		a:         a.Availability,
		policy:    s.tenantPolicy,
		rateLimit: ratelimitheader.Value(tenantLimiter, a.Remaining, a.ResetAfter),
	}, nil
}

// ListLowestTenants lists the tenants with the fewest permits left.
func (s *server) ListLowestTenants(ctx context.Context, req gen.ListLowestTenantsRequestObject) (gen.ListLowestTenantsResponseObject, error) {
	k := defaultLowest
	if req.Params.K != nil {
		k = int(*req.Params.K)
	}
	entries, err := s.tenants.Lowest(ctx, k)
	if err != nil {
		return nil, err
	}
	out := gen.LowestTenants{Items: make([]gen.TenantEntry, len(entries)), Policy: policyOf(s.tenants.Policy())}
	for i, e := range entries {
		out.Items[i] = entryOf(e)
	}
	return gen.ListLowestTenants200JSONResponse(out), nil
}

// GetTenantPolicy returns the per-IP policy.
func (s *server) GetTenantPolicy(context.Context, gen.GetTenantPolicyRequestObject) (gen.GetTenantPolicyResponseObject, error) {
	return gen.GetTenantPolicy200JSONResponse(policyOf(s.tenants.Policy())), nil
}

func entryOf(e tenant.Entry) gen.TenantEntry {
	return gen.TenantEntry{Tenant: e.Tenant, Remaining: e.Remaining, Limit: e.Limit, ResetAfterMs: millis(e.ResetAfter)}
}
