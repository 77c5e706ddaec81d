// Package redis keeps the per-IP tenants of package tenant in Redis, so that
// every replica of the service draws on the same buckets. Tenants has the
// methods and semantics of tenant.Registry: all or nothing, Available
// without consuming, the same Decision fields and tenant names, the same
// exact integer arithmetic, full tenants forgotten, and Lowest with the
// same order. The tenants are a table of keys of package limiter/redis,
// whose scripts the keyed limiters of its Store run too: this package
// chooses the keys and their shards.
//
// Each acquisition is one atomic server-side script that reads the
// tenant's state, decides, and writes the new state together with its
// shard's index. Time comes from the Redis server holding the shard
// (TIME), at microsecond resolution: grants within one microsecond count as
// simultaneous (a Registry resolves nanoseconds).
//
// # Keys
//
// Under a caller's prefix, for a policy whose ID is <pid> (12 hex digits of
// a hash of its algorithm, limit, period and burst, so that a changed
// policy starts afresh rather than misreading states) and a shard tag <tag>
// (16 shards, chosen by a fixed hash of the tenant):
//
//	<prefix>t:<pid>{<tag>}:<hex>  one tenant's state, <hex> its key in 16 hex
//	                              digits: GCRA's TAT as "µs units", or a
//	                              sliding log as a sorted set, as the limiter
//	                              Store keeps them
//	<prefix>t:<pid>{<tag>}:idx    the shard's index (sorted set), in Lowest's
//	                              order; see lua/table.lua of limiter/redis
//	<prefix>t:<pid>{<tag>}:exp    sliding log only: the same members scored by
//	                              the instant each log is empty, to trim them
//
// A state key expires (PEXPIREAT) when its bucket would be full again, and
// an index key when the last of its tenants would be: idle tenants cost
// nothing. Index members of full tenants are trimmed by the operations of
// their shard, up to 16 per acquisition, so they cannot pile up either.
//
// # Bound
//
// The tenants remembered are bounded as in a tenant.Registry, by
// tenant.Bound(cfg, TableBytes, TenantBytes(policy)): Config.MaxTenants, lowered to
// what Config.MaxBytes holds at this backend's cost per tenant. Each shard
// holds at most its share, the bound divided by 16 and rounded up, kept
// atomically by the scripts (the shard's index is its count); a newcomer to
// a full shard evicts, or is denied with Decision.RegistryFull, as
// Config.MaxTenants describes, among that shard's tenants. So a spray of
// distinct addresses cannot grow Redis's memory past about MaxBytes, and
// Available tells a newcomer what an acquisition would. Run Redis with
// maxmemory-policy noeviction and a maxmemory above MaxBytes and what else
// it holds: an evicted state forgives its tenant (Lowest then skips the
// stale index member and drops it), and a write refused for memory is an
// unavailable backend.
//
// # Redis Cluster
//
// The braces are a hash tag: a shard's states and indexes share one slot,
// so each script touches one node. The tags are chosen so that the 16
// shards' slots spread evenly over the slot range, hence over the masters.
// Lowest runs one script per shard, pipelined to every node at once, and
// merges the shards' answers in the service. Each shard answers at its own
// server's time, as every decision does, and the merged answer is given as
// seen at the latest of those instants (see Tenants.Lowest); it is not one
// atomic snapshot.
//
// # Lowest
//
// Under GCRA the index scores each tenant by its TAT (whole microseconds,
// the remainder in the member), an order time does not change: each shard
// returns its first k members in O(log n + k), and the service merges 16
// lists of at most k. Under the sliding log no score orders tenants at
// every instant, so the index holds a bound (what the log held after its
// newest grant, lowered to the exact count whenever Lowest reads it), and
// each shard walks it until the k-th best exact answer beats the next
// bound; see lua/key_lowest.lua of limiter/redis. Both are exact. The cost is O(S·(log n + k))
// for S shards and n tenants in a shard; under the sliding log add one log
// read per tenant whose count has fallen since its bound was set and whose
// bound still ranks among the k lowest: at worst, on the first query after
// many tenants' grants began leaving the window, every tenant. Such a walk
// runs as several scripts of at most 2k + 1000 members each, so that no
// script holds the server for long; each saves what it learned.
package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

var _ tenant.Backend = (*Tenants)(nil)

// Tenants keeps one limiter per tenant in Redis, standalone or Cluster,
// under a shared policy. It is safe for concurrent use; concurrent calls
// are pipelined on the client's connections. Errors wrap
// limiter.ErrUnavailable when Redis cannot answer (network failure,
// timeout, or an error reply); a context deadline bounds each call.
type Tenants struct {
	policy limiter.Policy
	bits   int // IPv6 prefix length
	// shardMax is how many tenants each shard holds at most: the bound of
	// tenant.Bound divided among the shards.
	shardMax int
	shards   []limiterredis.Shard
	table    *limiterredis.Table
}

// New returns Tenants over client for cfg, whose keys all start with prefix
// (which may be empty, and must not contain '{' or '}': they would break
// the hash tags). It shares the prefix with the limiter Store without
// collisions. The client must talk to Redis 7.0 or later; Tenants never
// closes it.
//
// The error wraps limiter.ErrInvalidPolicy for an invalid cfg.Policy and
// tenant.ErrInvalidConfig for an IPv6 prefix out of range, a negative
// MaxTenants or a MaxBytes that holds no tenant, as tenant.New does. See
// the package doc for how the bound is kept.
func New(client rueidis.Client, prefix string, cfg tenant.Config) (*Tenants, error) {
	if client == nil {
		return nil, errors.New("redis: tenants: nil client")
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("redis: tenants: key prefix %q must not contain '{' or '}'", prefix)
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("redis: tenants: %w", err)
	}
	if cfg.IPv6Prefix == 0 {
		cfg.IPv6Prefix = tenant.DefaultIPv6Prefix
	}
	if cfg.IPv6Prefix < 1 || cfg.IPv6Prefix > tenant.MaxIPv6Prefix {
		return nil, fmt.Errorf("redis: tenants: %w: IPv6 prefix must be between 1 and %d, got %d", tenant.ErrInvalidConfig, tenant.MaxIPv6Prefix, cfg.IPv6Prefix)
	}
	p := cfg.Policy.Normalize()
	bound, err := tenant.Bound(cfg, TableBytes, TenantBytes(p))
	if err != nil {
		return nil, fmt.Errorf("redis: tenants: %w", err)
	}
	pid := policyID(p)
	shards := make([]limiterredis.Shard, numShards)
	for i := range shards {
		shards[i] = newShard(prefix, pid, i)
	}
	max := shardMax(bound)
	return &Tenants{policy: p, bits: cfg.IPv6Prefix, shardMax: max, shards: shards, table: limiterredis.NewTable(client, p, shards, max)}, nil
}

// Policy returns the per-tenant policy with its defaults filled in.
func (ts *Tenants) Policy() limiter.Policy { return ts.policy }

// Tenant returns the normalized tenant that address ip counts as, without
// asking Redis, or an error wrapping tenant.ErrInvalidIP.
func (ts *Tenants) Tenant(ip string) (string, error) {
	_, name, err := tenant.Key(ip, ts.bits)
	if err != nil {
		return "", fmt.Errorf("redis: tenant: %w", err)
	}
	return name, nil
}

// Acquire takes permits from the tenant that address ip counts as, all or
// nothing, at the Redis server's time. A denial records nothing. permits
// must be from 1 to limiter.MaxLimit, otherwise the error wraps
// limiter.ErrInvalidPermits; an invalid ip gives an error wrapping
// tenant.ErrInvalidIP. A count above the policy's capacity is valid and
// denied with ExceedsCapacity.
//
// It is never retried: when the error wraps limiter.ErrUnavailable because
// the connection failed or the deadline passed after the script was sent,
// the permits may or may not have been taken.
func (ts *Tenants) Acquire(ctx context.Context, ip string, permits int64) (tenant.Decision, error) {
	return ts.acquire(ctx, ip, permits, "")
}

// Available reports what the tenant that address ip counts as could take at
// the Redis server's time, without taking anything, in one read-only
// script. A tenant without state has a full bucket. An invalid ip gives an
// error wrapping tenant.ErrInvalidIP.
func (ts *Tenants) Available(ctx context.Context, ip string) (tenant.Availability, error) {
	return ts.available(ctx, ip, "")
}

// Lowest returns up to k tenants (1 <= k <= tenant.MaxLowest, otherwise
// the error wraps tenant.ErrInvalidK) with the fewest permits left, as
// Entries ordered as tenant.Registry.Lowest orders them: Remaining
// ascending; ties under GCRA by TAT descending, under the sliding log by
// ResetAfter descending; then by tenant key ascending (see tenant.Key).
// Tenants with a full bucket are not listed, so fewer than k may come back.
//
// Each shard answers at its server's time, and the entries are given as
// seen at the latest of those instants, so that one answer never mixes
// instants. Under GCRA that is exact. Under the sliding log Remaining is
// counted at the shard's own instant, earlier by at most the duration of
// the call (and in a Cluster the skew between nodes' clocks): a grant that
// left the window in between is still counted. See the package doc for
// the cost. It gives up with an error wrapping limiter.ErrUnavailable when
// ctx is done.
func (ts *Tenants) Lowest(ctx context.Context, k int) ([]tenant.Entry, error) {
	return ts.lowest(ctx, k, "")
}

// acquire is Acquire at nowMicros (microseconds since the Unix epoch, in
// decimal), or at the server's time when nowMicros is empty. Only this
// package's tests pass an instant.
func (ts *Tenants) acquire(ctx context.Context, ip string, permits int64, nowMicros string) (tenant.Decision, error) {
	if err := limiter.CheckPermits(permits); err != nil {
		return tenant.Decision{}, fmt.Errorf("redis: tenant acquire %s: %w", quote(ip), err)
	}
	key, name, err := tenant.Key(ip, ts.bits)
	if err != nil {
		return tenant.Decision{}, fmt.Errorf("redis: tenant acquire %s: %w", quote(ip), err)
	}
	d, full, err := ts.table.Acquire(ctx, shardOf(key), hexKey(key), permits, nowMicros)
	if err != nil {
		return tenant.Decision{}, fmt.Errorf("redis: tenant acquire %s: %w", name, err)
	}
	return tenant.Decision{Tenant: name, Decision: d, RegistryFull: full}, nil
}

// available is Available at nowMicros, like acquire.
func (ts *Tenants) available(ctx context.Context, ip, nowMicros string) (tenant.Availability, error) {
	key, name, err := tenant.Key(ip, ts.bits)
	if err != nil {
		return tenant.Availability{}, fmt.Errorf("redis: tenant available %s: %w", quote(ip), err)
	}
	a, full, err := ts.table.Available(ctx, shardOf(key), hexKey(key), nowMicros)
	if err != nil {
		return tenant.Availability{}, fmt.Errorf("redis: tenant available %s: %w", name, err)
	}
	return tenant.Availability{Tenant: name, Availability: a, RegistryFull: full}, nil
}

// lowest is Lowest at nowMicros, like acquire.
func (ts *Tenants) lowest(ctx context.Context, k int, nowMicros string) ([]tenant.Entry, error) {
	if k < 1 || k > tenant.MaxLowest {
		return nil, fmt.Errorf("redis: tenant lowest: %w: k must be between 1 and %d, got %d", tenant.ErrInvalidK, tenant.MaxLowest, k)
	}
	es, err := ts.table.Lowest(ctx, k, nowMicros)
	if err != nil {
		return nil, fmt.Errorf("redis: tenant lowest: %w", err)
	}
	out := make([]tenant.Entry, len(es))
	for i, e := range es {
		key, err := strconv.ParseUint(e.Key, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("redis: tenant lowest: %w: malformed tenant %q", limiter.ErrUnavailable, e.Key)
		}
		out[i] = tenant.Entry{Tenant: tenant.KeyName(key, ts.bits), Remaining: e.Remaining, Limit: e.Limit, ResetAfter: e.ResetAfter}
	}
	return out, nil
}

// maxIPLen bounds the input echoed back in an error.
const maxIPLen = 64

func quote(ip string) string {
	if len(ip) > maxIPLen {
		ip = ip[:maxIPLen] + "…"
	}
	return strconv.Quote(ip)
}
