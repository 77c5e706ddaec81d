package httpapi

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/ratelimitheader"
)

// The rate-limit headers are package ratelimitheader's.

// millis is d in whole milliseconds, rounded up.
func millis(d time.Duration) int64 { return ratelimitheader.CeilUnits(d, time.Millisecond) }

// seconds is d in whole seconds, rounded up.
func seconds(d time.Duration) int64 { return ratelimitheader.Seconds(d) }

// retryAfter is the Retry-After value of a wait: whole seconds, rounded up.
func retryAfter(d time.Duration) *int64 {
	s := max(1, seconds(d))
	return &s
}

// policyTTL bounds how long a cached policy may lag a change made through
// another replica that shares the limiter backend. Changes made through
// this server are seen at once.
const policyTTL = 5 * time.Second

// maxCachedPolicies bounds the policy cache; limiters past it are looked
// up on every request.
const maxCachedPolicies = 10_000

// policyCache keeps the RateLimit-Policy value of named limiters: a
// decision carries the limit but not the period, and looking the limiter
// up on every acquisition would double the work of the backend.
type policyCache struct {
	m sync.Map // name -> *cachedPolicy
	n atomic.Int64
}

type cachedPolicy struct {
	limit  int64
	header string
	at     time.Time
}

// forget drops a limiter whose policy changed through this server.
func (c *policyCache) forget(name string) {
	if _, ok := c.m.LoadAndDelete(name); ok {
		c.n.Add(-1)
	}
}

// policyOf returns the RateLimit-Policy value of the named limiter, whose
// decision just reported limit.
func (s *server) policyOf(ctx context.Context, name string, limit int64) string {
	now := time.Now()
	if v, ok := s.policies.m.Load(name); ok {
		e := v.(*cachedPolicy)
		if e.limit == limit && now.Sub(e.at) < policyTTL {
			return e.header
		}
	}
	def, err := s.limiters.Get(ctx, name)
	if err != nil || def.Policy.Limit != limit {
		// Deleted or replaced meanwhile: advertise what the decision saw.
		return ratelimitheader.Policy(name, 0, limit)
	}
	e := &cachedPolicy{limit: limit, header: ratelimitheader.Policy(name, def.Policy.Period, limit), at: now}
	if _, loaded := s.policies.m.Swap(name, e); !loaded {
		if s.policies.n.Add(1) > maxCachedPolicies {
			s.policies.forget(name)
		}
	}
	return e.header
}
