package redis

import "github.com/ratelimiter/ratelimiter/internal/limiter"

// Worst cases of one tenant in Redis, in bytes of used_memory; see
// TenantBytes. They were measured on Redis 7.0 (jemalloc, default
// encodings) with 1,000,000 tenants and rounded up; see the README.
const (
	// gcraTenantBytes is a state key with its value and expiry, plus its
	// member in the shard's index (a skiplist and a dict entry).
	gcraTenantBytes = 320
	// logTenantBytes is a sliding log's key and expiry plus its members
	// in the shard's index and expiry index; logEntryBytes is one grant in
	// its sorted set (a listpack up to 128 entries, a skiplist above).
	logTenantBytes = 480
	logEntryBytes  = 96
)

// TenantBytes returns the most Redis memory one tenant of policy p takes,
// in bytes: 320 under GCRA whatever the policy; under the sliding log 480
// plus 96 per element of its log: a base and one per grant in the window,
// at most min(Limit, 4096). Tenants of a Config bound by MaxBytes hold at most
// MaxBytes / TenantBytes of them.
func TenantBytes(p limiter.Policy) int64 {
	p = p.Normalize()
	if p.Algorithm == limiter.GCRA {
		return gcraTenantBytes
	}
	// A log's sorted set holds a base element and one per grant, at most
	// limiter.MaxLogEntries (older grants merge, as in limiter.Log).
	return logTenantBytes + logEntryBytes*(1+min(p.Limit, limiter.MaxLogEntries))
}

// shardMax divides a bound of tenants among the shards, rounding up: the
// shards together hold at most bound + numShards - 1 tenants, and a bound
// below numShards still lets every shard hold one.
func shardMax(bound int) int {
	return (bound + numShards - 1) / numShards
}
