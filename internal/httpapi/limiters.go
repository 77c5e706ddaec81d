package httpapi

import (
	"context"
	"encoding/base64"
	"errors"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/ratelimitheader"
)

// defaultPageSize is the page size of listLimiters when none is asked for.
const defaultPageSize = 100

// PutLimiter creates or replaces a limiter.
func (s *server) PutLimiter(ctx context.Context, req gen.PutLimiterRequestObject) (gen.PutLimiterResponseObject, error) {
	spec := req.Body
	if spec == nil {
		return nil, invalid("body", "is required")
	}
	period, err := limiter.ParsePeriod(spec.Period)
	if err != nil {
		return nil, rejected("body.period", reason(err, limiter.ErrInvalidPolicy))
	}
	def := limiter.Definition{Name: req.Name, Policy: limiter.Policy{Limit: spec.Limit, Period: period}}
	if spec.Algorithm != nil {
		def.Policy.Algorithm = limiter.Algorithm(*spec.Algorithm)
	}
	if spec.Burst != nil {
		def.Policy.Burst = *spec.Burst
	}
	if spec.Group != nil {
		def.Group = *spec.Group
	}
	if spec.Keyed != nil {
		def.Keyed = *spec.Keyed
	}
	if spec.MaxKeys != nil {
		def.MaxKeys = int(*spec.MaxKeys)
	}
	created, err := s.limiters.Put(ctx, def)
	s.policies.forget(req.Name)
	if err != nil {
		return nil, err
	}
	def = def.Normalize()
	if created {
		return gen.PutLimiter201JSONResponse{
			Body:    limiterOf(def),
			Headers: gen.PutLimiter201ResponseHeaders{Location: "/v1/limiters/" + def.Name},
		}, nil
	}
	return gen.PutLimiter200JSONResponse(limiterOf(def)), nil
}

// GetLimiter returns a limiter's definition.
func (s *server) GetLimiter(ctx context.Context, req gen.GetLimiterRequestObject) (gen.GetLimiterResponseObject, error) {
	def, err := s.limiters.Get(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return gen.GetLimiter200JSONResponse(limiterOf(def)), nil
}

// DeleteLimiter deletes a limiter.
func (s *server) DeleteLimiter(ctx context.Context, req gen.DeleteLimiterRequestObject) (gen.DeleteLimiterResponseObject, error) {
	err := s.limiters.Delete(ctx, req.Name)
	s.policies.forget(req.Name)
	if err == nil || errors.Is(err, limiter.ErrNotFound) {
		// Gone: its decision series go too, and give their place back.
		s.tel.series.release(req.Name)
	}
	if err != nil {
		return nil, err
	}
	return gen.DeleteLimiter204Response{}, nil
}

// ListLimiters returns a page of limiters. The page token is the last name
// of the previous page, base64url-encoded, so that callers treat it as
// opaque.
func (s *server) ListLimiters(ctx context.Context, req gen.ListLimitersRequestObject) (gen.ListLimitersResponseObject, error) {
	size := defaultPageSize
	if req.Params.PageSize != nil {
		size = int(*req.Params.PageSize)
	}
	after := ""
	if tok := req.Params.PageToken; tok != nil {
		name, err := base64.RawURLEncoding.DecodeString(*tok)
		if err != nil || limiter.CheckName(string(name)) != nil {
			return nil, invalid("query.page_token", "is not the next_page_token of a previous page")
		}
		after = string(name)
	}
	defs, err := s.limiters.List(ctx, after, size+1)
	if err != nil {
		return nil, err
	}
	page := gen.LimiterList{Items: make([]gen.Limiter, 0, min(len(defs), size))}
	for i, def := range defs {
		if i == size {
			next := base64.RawURLEncoding.EncodeToString([]byte(defs[i-1].Name))
			page.NextPageToken = &next
			break
		}
		page.Items = append(page.Items, limiterOf(def))
	}
	return gen.ListLimiters200JSONResponse(page), nil
}

// Acquire takes permits from a limiter.
func (s *server) Acquire(ctx context.Context, req gen.AcquireRequestObject) (gen.AcquireResponseObject, error) {
	if req.Body != nil && req.Body.Key != nil {
		return s.acquireKey(ctx, req.Name, *req.Body.Key, permitsOf(req.Body))
	}
	d, err := s.limiters.Acquire(ctx, req.Name, permitsOf(req.Body))
	if err != nil {
		return nil, err
	}
	s.tel.decided(req.Name, d)
	if d.Degraded {
		// Made without the backend: there is no state to advertise.
		return &decisionAnswer{d: d}, nil
	}
	return &decisionAnswer{
		d:         d,
		policy:    s.policyOf(ctx, req.Name, d.Limit),
		rateLimit: ratelimitheader.Value(req.Name, d.Remaining, d.ResetAfter),
	}, nil
}

// GetAvailable reports what a limiter could grant now.
func (s *server) GetAvailable(ctx context.Context, req gen.GetAvailableRequestObject) (gen.GetAvailableResponseObject, error) {
	if req.Params.Key != nil {
		return s.availableKey(ctx, req.Name, *req.Params.Key)
	}
	a, err := s.limiters.Available(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return &availabilityAnswer{
		a:         a,
		policy:    s.policyOf(ctx, req.Name, a.Limit),
		rateLimit: ratelimitheader.Value(req.Name, a.Remaining, a.ResetAfter),
	}, nil
}

// permitsOf is the permit count of an acquisition: 1 when the body or its
// permits are left out.
func permitsOf(body *gen.AcquireRequest) int64 {
	if body == nil || body.Permits == nil {
		return 1
	}
	return *body.Permits
}

func limiterOf(def limiter.Definition) gen.Limiter {
	p := policyOf(def.Policy)
	l := gen.Limiter{Name: def.Name, Limit: p.Limit, Period: p.Period, Algorithm: p.Algorithm, Burst: p.Burst}
	if def.Group != "" {
		g := def.Group
		l.Group = &g
	}
	if def.Keyed {
		keyed, maxKeys := true, int32(def.MaxKeys)
		l.Keyed, l.MaxKeys = &keyed, &maxKeys
	}
	return l
}

// policyOf is the JSON of a policy, with its defaults filled in.
func policyOf(p limiter.Policy) gen.Policy {
	p = p.Normalize()
	out := gen.Policy{Limit: p.Limit, Period: limiter.FormatPeriod(p.Period), Algorithm: gen.Algorithm(p.Algorithm)}
	if p.Algorithm == limiter.GCRA {
		burst := p.Burst
		out.Burst = &burst
	}
	return out
}
