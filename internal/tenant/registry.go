package tenant

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// Registry keeps one limiter per tenant under a shared policy, in a
// memory.Keys whose keys are the tenants' 64-bit keys (see Key) written
// big-endian, so that their bytewise order is Key's order. It is safe for
// concurrent use. The zero value is not usable; see New.
type Registry struct {
	policy limiter.Policy
	bits   int // IPv6 prefix length
	clock  *limiter.Clock
	keys   *memory.Keys
}

// keyBytes is a tenant's key as the Registry's memory.Keys holds it.
type keyBytes [8]byte

func keyOf(k uint64) keyBytes {
	var b keyBytes
	binary.BigEndian.PutUint64(b[:], k)
	return b
}

func keyFrom(s string) uint64 { return binary.BigEndian.Uint64([]byte(s)) }

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
	return &Registry{policy: p, bits: cfg.IPv6Prefix, clock: clock, keys: memory.NewKeys(p, maxTenants)}, nil
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
	kb := keyOf(k)
	ld, full := r.keys.Acquire(string(kb[:]), r.clock.Now(), permits)
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
	kb := keyOf(k)
	av, full := r.keys.Available(string(kb[:]), r.clock.Now())
	return Availability{Tenant: tenantName(ip, k, r.bits), Availability: av, RegistryFull: full}, nil
}

// Lowest returns up to k tenants (1 <= k <= MaxLowest, otherwise the error
// wraps ErrInvalidK) with the fewest permits left at the registry's current
// time, as Entries ordered by Remaining ascending. Tenants with a full
// bucket are not listed, so fewer than k may come back, and none when no
// tenant has taken permits lately.
//
// Ties are ordered as memory.Keys.Lowest orders them; the last tie-break,
// by key, puts IPv6 prefixes in address order, then IPv4 addresses in
// address order. Under GCRA it reads one bound per shard and O(k·log n)
// index nodes for n tenants; under the sliding log it scans every tenant,
// and gives up with ctx's error when ctx is done (see memory.Keys.Lowest).
func (r *Registry) Lowest(ctx context.Context, k int) ([]Entry, error) {
	if k < 1 || k > MaxLowest {
		return nil, fmt.Errorf("tenant: lowest: %w: k must be between 1 and %d, got %d", ErrInvalidK, MaxLowest, k)
	}
	rs, err := r.keys.Lowest(ctx, r.clock.Now(), k)
	if err != nil {
		return nil, fmt.Errorf("tenant: lowest: %w", err)
	}
	entries := make([]Entry, len(rs))
	for i, x := range rs {
		entries[i] = Entry{Tenant: formatKey(keyFrom(x.Key), r.bits), Remaining: x.Remaining, Limit: x.Limit, ResetAfter: x.ResetAfter}
	}
	return entries, nil
}

// Stats counts what the registry holds, in O(shards).
func (r *Registry) Stats() Stats {
	s := r.keys.Stats()
	return Stats{Tenants: s.Keys, IndexEntries: s.IndexEntries}
}
