package httpapi

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Rate-limit headers, after draft-ietf-httpapi-ratelimit-headers-11:
//
//	RateLimit-Policy: "<name>";q=<limit>;w=<period>
//	RateLimit: "<name>";r=<remaining>;t=<reset>
//
// The draft counts time in whole seconds only, so every duration is
// rounded up: a sub-second or fractional period advertises a slightly
// stricter policy than the real one, never a looser one, and a caller that
// waits as long as it is told never comes back too early.

// ceilUnits is d in whole units, rounded up; 0 for d <= 0.
func ceilUnits(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/unit) + 1
}

// millis is d in whole milliseconds, rounded up.
func millis(d time.Duration) int64 { return ceilUnits(d, time.Millisecond) }

// seconds is d in whole seconds, rounded up.
func seconds(d time.Duration) int64 { return ceilUnits(d, time.Second) }

// appendSFString appends s as a Structured Field String.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\', c)
		} else if c >= 0x20 && c < 0x7f {
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// policyHeader is the RateLimit-Policy value of a limit; w is left out when
// the period is unknown (0).
func policyHeader(name string, period time.Duration, limit int64) string {
	b := make([]byte, 0, len(name)+40)
	b = appendSFString(b, name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, limit, 10)
	if period > 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, max(1, seconds(period)), 10)
	}
	return string(b)
}

// rateLimitHeader is the RateLimit value of a limit with remaining permits
// that is full again after reset.
func rateLimitHeader(name string, remaining int64, reset time.Duration) string {
	var buf [192]byte
	b := appendSFString(buf[:0], name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, remaining, 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, seconds(reset), 10)
	return string(b)
}

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
		return policyHeader(name, 0, limit)
	}
	e := &cachedPolicy{limit: limit, header: policyHeader(name, def.Policy.Period, limit), at: now}
	if _, loaded := s.policies.m.Swap(name, e); !loaded {
		if s.policies.n.Add(1) > maxCachedPolicies {
			s.policies.forget(name)
		}
	}
	return e.header
}
