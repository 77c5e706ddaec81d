package tenant

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Registry keeps one limiter per tenant under a shared policy. It is safe for
// concurrent use: tenants are spread over shards by a keyed hash of their
// address, so acquisitions by different tenants rarely wait for each other.
// The zero value is not usable; see New.
type Registry struct {
	policy limiter.Policy
	bits   int // IPv6 prefix length
	clock  *limiter.Clock
	store  store
}

// store is what a Registry needs from the table of one algorithm. Times are
// nanoseconds on the registry's limiter.Clock; keys are made by parseKey.
type store interface {
	// acquire takes n permits (1 <= n <= MaxLimit) from the tenant and
	// reports whether a denial is due to a registry full of limited tenants.
	acquire(key uint64, now, n int64) (d limiter.Decision, registryFull bool)
	// available reports what the tenant could take, and whether a
	// newcomer would be denied because the registry is full of limited
	// tenants (as acquire would report for one permit).
	available(key uint64, now int64) (av limiter.Availability, registryFull bool)
	// lowest returns up to k tenants, fewest permits left first.
	lowest(ctx context.Context, now int64, k int) ([]ranked, error)
	stats() Stats
	// live counts the tenants held, shard by shard; at rest it equals
	// Stats().Tenants.
	live() int
}

// ranked is one tenant of a lowest answer.
type ranked struct {
	key uint64
	av  limiter.Availability
}

// New returns an empty Registry for cfg that decides at the instants clock
// tells (limiter.NewClock() when nil), so that steps of the wall clock move
// no decision. It remembers at most Bound(cfg, TableBytes, TenantBytes(policy))
// tenants. It reports an error wrapping limiter.ErrInvalidPolicy for an
// invalid cfg.Policy and ErrInvalidConfig for an out-of-range bound,
// including a MaxBytes too small for one tenant.
func New(cfg Config, clock *limiter.Clock) (*Registry, error) {
	if err := cfg.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("tenant: new: %w", err)
	}
	if cfg.IPv6Prefix == 0 {
		cfg.IPv6Prefix = DefaultIPv6Prefix
	}
	if cfg.IPv6Prefix < 1 || cfg.IPv6Prefix > MaxIPv6Prefix {
		return nil, fmt.Errorf("tenant: new: %w: IPv6 prefix must be between 1 and %d, got %d", ErrInvalidConfig, MaxIPv6Prefix, cfg.IPv6Prefix)
	}
	maxTenants, err := Bound(cfg, TableBytes, TenantBytes(cfg.Policy))
	if err != nil {
		return nil, fmt.Errorf("tenant: new: %w", err)
	}
	if clock == nil {
		clock = limiter.NewClock()
	}
	p := cfg.Policy.Normalize()
	r := &Registry{
		policy: p,
		bits:   cfg.IPv6Prefix,
		clock:  clock,
	}
	if p.Algorithm == limiter.GCRA {
		r.store = newGCRAStore(p, int64(maxTenants))
	} else {
		r.store = newLogStore(p, int64(maxTenants))
	}
	return r, nil
}

// Policy returns the per-tenant policy with its defaults filled in.
func (r *Registry) Policy() limiter.Policy { return r.policy }

// Tenant returns the normalized tenant that address ip counts as (see
// Normalize), or an error wrapping ErrInvalidIP.
func (r *Registry) Tenant(ip string) (string, error) {
	k, err := parseKey(ip, r.bits)
	if err != nil {
		return "", fmt.Errorf("tenant: %w", err)
	}
	return formatKey(k, r.bits), nil
}

// Acquire takes permits from the tenant that address ip counts as, all or
// nothing, at the registry's current time. A denial records nothing.
//
// permits must be from 1 to limiter.MaxLimit, otherwise the error wraps
// limiter.ErrInvalidPermits; an invalid ip gives an error wrapping
// ErrInvalidIP. Either way nothing changes. A count above the policy's
// capacity is valid and denied with ExceedsCapacity.
//
// A tenant the registry does not remember starts from a full bucket; when
// the registry already holds Config.MaxTenants tenants, room is made as
// Config.MaxTenants describes, or the tenant is denied with RegistryFull.
func (r *Registry) Acquire(_ context.Context, ip string, permits int64) (Decision, error) {
	if err := limiter.CheckPermits(permits); err != nil {
		return Decision{}, fmt.Errorf("tenant: acquire %s: %w", quoteIP(ip), err)
	}
	k, err := parseKey(ip, r.bits)
	if err != nil {
		return Decision{}, fmt.Errorf("tenant: acquire %s: %w", quoteIP(ip), err)
	}
	ld, full := r.store.acquire(k, r.clock.Now(), permits)
	return Decision{Tenant: tenantName(ip, k, r.bits), Decision: ld, RegistryFull: full}, nil
}

// Available reports what the tenant that address ip counts as could take
// now, without taking anything. A tenant the registry does not remember has
// a full bucket. An invalid ip gives an error wrapping ErrInvalidIP.
func (r *Registry) Available(_ context.Context, ip string) (Availability, error) {
	k, err := parseKey(ip, r.bits)
	if err != nil {
		return Availability{}, fmt.Errorf("tenant: available %s: %w", quoteIP(ip), err)
	}
	av, full := r.store.available(k, r.clock.Now())
	return Availability{Tenant: tenantName(ip, k, r.bits), Availability: av, RegistryFull: full}, nil
}

// Lowest returns up to k tenants (1 <= k <= MaxLowest, otherwise the error
// wraps ErrInvalidK) with the fewest permits left at the registry's current
// time, as Entries ordered by Remaining ascending. Tenants with a full
// bucket are not listed, so fewer than k may come back, and none when no
// tenant has taken permits lately.
//
// Ties are ordered deterministically. Under GCRA: by TAT descending (the
// tenant whose bucket refills last is truly closer to being cut off, even
// when both have the same whole number of permits left), then by tenant key
// ascending (IPv6 prefixes in address order, then IPv4 addresses in address
// order). Under the sliding log: by ResetAfter descending, then by key.
//
// Cost: under GCRA all tenants refill at the same rate, so the permits left
// order exactly by TAT (a later TAT has fewer), an order that time does not
// change. Every acquisition keeps an index of TAT bounds up to date, and
// Lowest walks it from the latest TAT down: it reads one bound per shard and
// O(k·log n) index nodes, whatever the number n of tenants. Under the
// sliding log the permits left depend on when each past grant leaves its
// window, so no order survives time: Lowest scans every tenant, in
// O(n log k), holding one shard's lock at a time, and gives up with ctx's
// error when ctx is done.
//
// The answer is not one atomic snapshot: each shard is read under its own
// lock, all at the same instant.
func (r *Registry) Lowest(ctx context.Context, k int) ([]Entry, error) {
	if k < 1 || k > MaxLowest {
		return nil, fmt.Errorf("tenant: lowest: %w: k must be between 1 and %d, got %d", ErrInvalidK, MaxLowest, k)
	}
	rs, err := r.store.lowest(ctx, r.clock.Now(), k)
	if err != nil {
		return nil, fmt.Errorf("tenant: lowest: %w", err)
	}
	entries := make([]Entry, len(rs))
	for i, x := range rs {
		entries[i] = Entry{Tenant: formatKey(x.key, r.bits), Remaining: x.av.Remaining, Limit: x.av.Limit, ResetAfter: x.av.ResetAfter}
	}
	return entries, nil
}

// Stats counts what the registry holds, in O(shards).
func (r *Registry) Stats() Stats { return r.store.stats() }

// admission enforces Config.MaxTenants across shards: count is the number of
// tenants remembered plus insertions under way, and never exceeds max.
type admission struct {
	count atomic.Int64
	max   int64
}

// reserve claims room for one more tenant, if there is some.
func (a *admission) reserve() bool {
	for {
		c := a.count.Load()
		if c >= a.max {
			return false
		}
		if a.count.CompareAndSwap(c, c+1) {
			return true
		}
	}
}

func (a *admission) release(n int) {
	if n != 0 {
		a.count.Add(-int64(n))
	}
}

// maxVictimAttempts bounds how often a newcomer at the bound looks for a
// tenant to evict when concurrent acquisitions keep changing the candidate.
const maxVictimAttempts = 8

// registryFull is the denial of a newcomer that cannot be remembered; the
// tenant that could be evicted regains a permit after retry.
func registryFull(n, limit int64, retry time.Duration) limiter.Decision {
	return limiter.Decision{Permits: n, Limit: limit, RetryAfter: retry, ResetAfter: retry}
}

// registryFullAvailability is what a newcomer that cannot be remembered
// could take: nothing until the tenant that could be evicted regains a
// permit after retry, the RetryAfter and ResetAfter of registryFull.
func registryFullAvailability(limit int64, retry time.Duration) limiter.Availability {
	return limiter.Availability{Limit: limit, ResetAfter: retry}
}

// refillInterval is how long a bucket of p takes to regain one permit,
// rounded up to a whole nanosecond so that it is never 0.
func refillInterval(p limiter.Policy) time.Duration {
	return (p.Period + time.Duration(p.Limit) - 1) / time.Duration(p.Limit)
}
