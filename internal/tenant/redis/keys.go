package redis

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
)

// numShards is how many shards the tenants of one policy are spread over.
// It is part of the storage layout, as are shardTags and shardOf: changing
// any of them would strand every stored state, so a change must come with
// a new layoutVersion. Sixteen spreads a Cluster's load over up to 16
// masters and keeps Lowest's fan-out (one script per shard) small.
const numShards = 16

// shardTags are the shards' Redis Cluster hash tags. Tag i hashes to a slot
// in [1024·i, 1024·(i+1)), so the shards spread evenly over any cluster
// whose masters serve contiguous slot ranges: 5, 6 and 5 shards on three
// masters with the usual split. TestShardTags checks the slots.
var shardTags = [numShards]string{"10", "3", "61", "43", "11", "2", "60", "42", "12", "1", "63", "41", "13", "0", "62", "40"}

// layoutVersion starts every policy ID: a future change of the layout
// starts afresh instead of misreading older keys.
const layoutVersion = "v1"

// shardOf spreads tenant keys over the shards with a fixed mixing function
// (splitmix64's finalizer), the same in every replica and every version.
// An attacker who picks addresses can crowd one shard; that only makes its
// index larger, which costs O(log n) per operation, as any index does.
func shardOf(key uint64) int {
	key ^= key >> 30
	key *= 0xbf58476d1ce4e5b9
	key ^= key >> 27
	key *= 0x94d049bb133111eb
	key ^= key >> 31
	return int(key & (numShards - 1))
}

// policyID names a normalized policy in keys: the first 12 hex digits of
// the SHA-256 of "v1 <algorithm> <limit> <period ns> <burst>". Tenants
// under a changed policy start afresh rather than mixing states, and the
// old keys expire on their own.
func policyID(p limiter.Policy) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s %s %d %d %d", layoutVersion, p.Algorithm, p.Limit, int64(p.Period), p.Burst))
	return hex.EncodeToString(sum[:6])
}

// newShard names the keys of shard i of the tenants of the policy pid. The
// state key of a tenant is the shard's base followed by its key as 16 hex
// digits.
func newShard(prefix, pid string, i int) limiterredis.Shard {
	base := prefix + "t:" + pid + "{" + shardTags[i] + "}:"
	return limiterredis.Shard{Base: base, Idx: base + "idx", Exp: base + "exp"}
}

// hexKey writes a tenant key as the 16 hex digits the scripts use.
func hexKey(key uint64) string {
	var b [16]byte
	s := strconv.AppendUint(b[:0], key, 16)
	pad := "0000000000000000"[:16-len(s)]
	return pad + string(s)
}
