// Package tenant enforces one limit per requester IP address, built on the
// limiter package, and answers which tenants are closest to being cut off.
//
// A tenant is what one requester is counted as: an IPv4 address, or the
// IPv6 prefix (a /64 by default) that contains the requester's address. Every
// tenant gets its own bucket under one shared policy (Config.Policy). A tenant
// whose bucket is full is indistinguishable from one never seen, so the
// Registry forgets it; it only remembers tenants that have taken permits
// recently, and never more than Config.MaxTenants of them.
//
// Registry.Lowest lists the tenants with the fewest permits left. Under GCRA
// it reads an index kept up to date by every acquisition, in O(k·log n) for
// n tenants; under the sliding log it scans every tenant (see
// Registry.Lowest).
package tenant

import (
	"errors"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// MaxLowest is the largest k Lowest accepts: the same as a keyed
// limiter's.
const MaxLowest = limiter.MaxLowest

// Defaults and bounds of a Config.
const (
	// DefaultIPv6Prefix is the IPv6 prefix length a zero Config.IPv6Prefix
	// stands for.
	DefaultIPv6Prefix = 64
	// MaxIPv6Prefix is the finest IPv6 aggregation a Config accepts; see
	// Config.IPv6Prefix for why it is /64.
	MaxIPv6Prefix = 64
	// DefaultMaxTenants is the bound a zero Config.MaxTenants stands for.
	DefaultMaxTenants = 1_000_000
)

// Errors returned by a Registry. Wrapped errors keep them matchable with
// errors.Is; invalid permit counts wrap limiter.ErrInvalidPermits and invalid
// policies limiter.ErrInvalidPolicy.
var (
	// ErrInvalidIP reports an address that cannot name a tenant: empty,
	// malformed, carrying a zone ("fe80::1%eth0"), unspecified ("0.0.0.0",
	// "::") or multicast, none of which is ever the source of a request.
	ErrInvalidIP = errors.New("invalid IP address")
	// ErrInvalidK reports a Lowest count outside 1..MaxLowest.
	ErrInvalidK = errors.New("invalid number of tenants")
	// ErrInvalidConfig reports a Config that New refuses.
	ErrInvalidConfig = errors.New("invalid tenant configuration")
)

// Config is the per-IP policy and the registry's bounds. The zero value of
// each bound stands for its default; the Policy has no default.
type Config struct {
	// Policy is the limit every tenant gets: GCRA (the default algorithm)
	// or SlidingLog. It must be valid (see limiter.Policy.Validate).
	Policy limiter.Policy

	// IPv6Prefix is how many leading bits of an IPv6 address name its
	// tenant, from 1 to MaxIPv6Prefix; 0 means DefaultIPv6Prefix. All
	// addresses of one prefix share one bucket.
	//
	// Finer than /64 is refused: a subscriber is handed at least a /64
	// (RFC 6177), and hosts pick their low 64 bits freely (SLAAC privacy
	// addresses change them at will), so a key finer than /64 would let one
	// client appear as up to 2^64 tenants and walk around its limit. It also
	// keeps every tenant's key within 64 bits.
	IPv6Prefix int

	// MaxTenants bounds how many tenants are remembered at once, from 1 up;
	// 0 means DefaultMaxTenants. MaxBytes may lower it. Memory grows with
	// the tenants remembered, never beyond this bound: under GCRA a tenant
	// costs 33 to 47 bytes, its 8-byte key in its slot; under the sliding
	// log about 170 bytes plus its ring of grants (see TenantBytes for the
	// worst cases).
	//
	// When a tenant not yet remembered takes permits while the registry
	// holds MaxTenants tenants, room is made without ever freeing a tenant
	// that is currently limited:
	//
	//  1. a tenant whose bucket is full again is dropped (forgetting it
	//     changes nothing);
	//  2. otherwise the tenant with the most permits left is evicted, if it
	//     has at least one: it starts again from a full bucket, which
	//     forgives it at most what it has not yet used. Under GCRA this is
	//     the tenant with the earliest TAT; under the sliding log, the one
	//     whose log empties first;
	//  3. otherwise the newcomer is denied without being remembered
	//     (Decision.RegistryFull), with RetryAfter set to when that tenant
	//     regains a permit and so can be evicted.
	//
	// So an attacker spraying requests from random addresses can neither
	// exhaust memory nor free a limited tenant: under GCRA, step 3 happens
	// only when every remembered tenant is limited. (Under the sliding log a
	// newcomer may be denied while some tenant other than the one whose log
	// empties first still has permits: the rule errs on the side of
	// denying.)
	MaxTenants int

	// MaxBytes bounds, in bytes, the memory the remembered tenants take
	// at worst under the spray of distinct addresses an attacker can send;
	// 0 means DefaultMaxBytes. A Registry remembers at most
	// (MaxBytes - TableBytes) / TenantBytes(Policy) tenants (and at most
	// MaxTenants),
	// with the rule MaxTenants describes at that bound. A backend outside
	// this process applies it with its own cost per tenant.
	MaxBytes int64
}

// Decision is the answer to a tenant's acquisition.
type Decision struct {
	// Tenant is the normalized tenant the address counts as:
	// "203.0.113.7" for IPv4 (IPv4-mapped IPv6 included) and the prefix,
	// such as "2001:db8:1:2::/64", for IPv6.
	Tenant string
	limiter.Decision
	// RegistryFull reports a denial of a tenant that was not remembered,
	// made because the registry holds MaxTenants tenants that are all
	// limited (see Config.MaxTenants). Remaining is then 0, and RetryAfter
	// and ResetAfter say when room can be made.
	RegistryFull bool
}

// Availability is what a tenant could take now: what an acquisition of one
// permit would be told. A tenant the registry does not remember has a full
// bucket, unless the registry holds Config.MaxTenants tenants and would
// deny it (see RegistryFull).
type Availability struct {
	// Tenant is the normalized tenant, as in Decision.Tenant.
	Tenant string
	limiter.Availability
	// RegistryFull reports a tenant the registry does not remember and
	// could not remember now, because it holds Config.MaxTenants tenants
	// and the one it would evict is limited: an acquisition would be denied
	// with Decision.RegistryFull. Remaining is then 0, and ResetAfter is
	// the RetryAfter such a denial gives, when room can be made.
	RegistryFull bool
}

// Entry is one tenant in a Lowest answer, as seen at the instant of the call.
type Entry struct {
	// Tenant is the normalized tenant, as in Decision.Tenant.
	Tenant string
	// Remaining is how many permits the tenant could take at once.
	Remaining int64
	// Limit is the policy's Limit.
	Limit int64
	// ResetAfter is how long until the tenant's bucket is full again if it
	// takes nothing meanwhile; it is always positive.
	ResetAfter time.Duration
}

// Stats counts what a Registry holds, for gauges.
type Stats struct {
	// Tenants is the number of tenants remembered, never more than
	// Config.MaxTenants. It counts tenants whose bucket has become full but
	// which have not been dropped yet, and, while acquisitions are under
	// way, tenants about to be remembered.
	Tenants int
	// IndexEntries is the number of entries held by the lowest-capacity
	// index: one per tenant, plus under GCRA the entries of dropped tenants
	// not yet reclaimed (they are reclaimed in bulk when a shard's table is
	// rebuilt). Memory is proportional to it. It is summed shard by shard,
	// so under concurrent acquisitions it is not one snapshot.
	IndexEntries int
}
