package httpapi

import (
	"context"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/ratelimitheader"
)

// acquireKey takes permits from key's bucket of a keyed limiter.
func (s *server) acquireKey(ctx context.Context, name, key string, permits int64) (gen.AcquireResponseObject, error) {
	d, err := s.limiters.AcquireKey(ctx, name, key, permits)
	if err != nil {
		return nil, err
	}
	s.tel.decided(name, d.Decision)
	a := &decisionAnswer{d: d.Decision, key: key, isKeyed: true, keysFull: d.KeysFull}
	if !d.Degraded {
		a.policy = s.policyOf(ctx, name, d.Limit)
		a.rateLimit = ratelimitheader.Value(name, d.Remaining, d.ResetAfter)
	}
	return a, nil
}

// availableKey reports what key's bucket of a keyed limiter could grant
// now.
func (s *server) availableKey(ctx context.Context, name, key string) (gen.GetAvailableResponseObject, error) {
	a, err := s.limiters.AvailableKey(ctx, name, key)
	if err != nil {
		return nil, err
	}
	return &availabilityAnswer{
		a:         a.Availability,
		key:       key,
		isKeyed:   true,
		keysFull:  a.KeysFull,
		policy:    s.policyOf(ctx, name, a.Limit),
		rateLimit: ratelimitheader.Value(name, a.Remaining, a.ResetAfter),
	}, nil
}

// ListLowestKeys lists the keys of a keyed limiter closest to their limit.
func (s *server) ListLowestKeys(ctx context.Context, req gen.ListLowestKeysRequestObject) (gen.ListLowestKeysResponseObject, error) {
	k := defaultLowest
	if req.Params.K != nil {
		k = int(*req.Params.K)
	}
	entries, err := s.limiters.Lowest(ctx, req.Name, k)
	if err != nil {
		return nil, err
	}
	out := gen.LowestKeys{Items: make([]gen.KeyEntry, len(entries))}
	for i, e := range entries {
		out.Items[i] = keyEntryOf(e)
	}
	return gen.ListLowestKeys200JSONResponse(out), nil
}

func keyEntryOf(e limiter.KeyEntry) gen.KeyEntry {
	return gen.KeyEntry{Key: e.Key, Remaining: e.Remaining, Limit: e.Limit, ResetAfterMs: millis(e.ResetAfter)}
}
