package redis

import "github.com/ratelimiter/ratelimiter/internal/limiter"

// Worst cases of one tenant in Redis, in bytes of used_memory; see
// TenantBytes. They were measured on Redis 7.0 (jemalloc, default
// encodings) and given room for the hash tables' growth: a table holds
// between one and two buckets of 8 bytes a key, three while it rehashes.
const (
	// gcraTenantBytes is a state key with its value and expiry, plus its
	// member in the shard's index (a skiplist node and a dict entry):
	// 313 bytes measured at 100,000 tenants.
	gcraTenantBytes = 384
	// logTenantBytes is a sliding log's key, sorted set and expiry, plus
	// its members in the shard's index and expiry index.
	logTenantBytes = 512
	// A log's sorted set is a listpack up to zsetListpackEntries elements
	// (13 bytes an element measured at 101), a skiplist above (131 bytes
	// an element measured at 201).
	listpackEntryBytes  = 16
	skiplistEntryBytes  = 160
	zsetListpackEntries = 128 // Redis's zset-max-listpack-entries default

	// TableBytes is what the tenants take in Redis beyond TenantBytes a
	// tenant, whatever their number: the shards' index keys and Redis's
	// tables over them, which sprays at bounds of 1 to 8 MiB measured at
	// about 376 KB over 313 bytes a GCRA tenant. The Redis tenants hold
	// MaxBytes less TableBytes at TenantBytes a tenant.
	TableBytes = 512 << 10
)

// TenantBytes returns the most Redis memory one tenant of policy p takes,
// in bytes, at Redis's default encodings: 384 under GCRA whatever the
// policy. Under the sliding log, 512 plus, per element of its log (a base
// and one per grant in the window, at most 1 + min(Limit, 4096)), 16 bytes
// while they number at most 128 (Redis keeps the set as a listpack) and
// 160 above (a skiplist): at a Limit of 100, 512 + 16·101 = 2128 bytes; at
// 200, 512 + 160·201 = 32,672. Tenants of a Config bound by MaxBytes hold
// at most (MaxBytes - TableBytes) / TenantBytes of them.
func TenantBytes(p limiter.Policy) int64 {
	p = p.Normalize()
	if p.Algorithm == limiter.GCRA {
		return gcraTenantBytes
	}
	// Older grants merge beyond limiter.MaxLogEntries, as in limiter.Log.
	elements := 1 + min(p.Limit, limiter.MaxLogEntries)
	if elements <= zsetListpackEntries {
		return logTenantBytes + listpackEntryBytes*elements
	}
	return logTenantBytes + skiplistEntryBytes*elements
}

// shardMax divides a bound of tenants among the shards, rounding up: the
// shards together hold at most bound + numShards - 1 tenants, and a bound
// below numShards still lets every shard hold one.
func shardMax(bound int) int {
	return (bound + numShards - 1) / numShards
}
