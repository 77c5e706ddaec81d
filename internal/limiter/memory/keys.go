package memory

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Keys keeps one bucket per key under a shared policy, in process memory:
// the state of a keyed limiter, and of the per-IP tenants. It is safe for
// concurrent use: keys are spread over shards by a keyed hash, so
// acquisitions for different keys rarely wait for each other. The zero
// value is not usable; see NewKeys.
//
// A key whose bucket is full is indistinguishable from one never seen, so
// Keys forgets it; it only remembers keys that have taken permits recently,
// and never more than its bound of them. When a key not yet remembered takes
// permits while Keys holds its bound, room is made without ever freeing a
// key that is currently limited:
//
//  1. a key whose bucket is full again is dropped (forgetting it changes
//     nothing);
//  2. otherwise the key with the most permits left is evicted, if it has
//     at least one: it starts again from a full bucket, which forgives it
//     at most what it has not yet used. Under GCRA this is the key with the
//     earliest TAT; under the sliding log, the one whose log empties first;
//     among equals, the largest key (bytewise);
//  3. otherwise the newcomer is denied without being remembered (full is
//     reported), with RetryAfter set to when that key regains a permit and
//     so can be evicted.
//
// So a spray of distinct keys can neither exhaust memory nor free a
// limited key: under GCRA, step 3 happens only when every remembered key is
// limited. (Under the sliding log a newcomer may be denied while some key
// other than the one whose log empties first still has permits: the rule
// errs on the side of denying.)
//
// Keys are opaque byte strings, ordered bytewise where an order is needed
// (ties in Lowest, eviction among equals); a caller that wants another
// order encodes its keys so that bytewise order is that order, as the
// per-IP tenants do. Times are nanoseconds on the caller's limiter.Clock.
type Keys struct {
	policy limiter.Policy
	id     uint64         // orders the locks of joint decisions; see keys_joint.go
	proto  limiter.Bucket // a full bucket of policy
	// table is gcra or log, whichever is not nil. The hot paths call them
	// directly, not through the interface, so that escape analysis sees
	// that no table retains the key it is given (the log table copies the
	// keys it keeps) and a caller's key can stay on its stack.
	table table
	gcra  *gcraTable
	log   *logTable
}

// table is what Keys needs from the table of one algorithm besides the hot
// paths (acquire, available).
type table interface {
	// lowest returns up to k keys, fewest permits left first.
	lowest(ctx context.Context, now int64, k int) ([]limiter.KeyEntry, error)
	stats() KeyStats
	// live counts the keys held, shard by shard; at rest it equals
	// stats().Keys.
	live() int
	// check verifies the table's invariants from scratch (see Keys.Check).
	check() error
}

// KeyStats counts what a Keys holds, for gauges.
type KeyStats struct {
	// Keys is the number of keys remembered, never more than the bound. It
	// counts keys whose bucket has become full but which have not been
	// dropped yet, and, while acquisitions are under way, keys about to be
	// remembered.
	Keys int
	// IndexEntries is the number of entries held by the lowest-capacity
	// index: one per key, plus under GCRA the entries of dropped keys not
	// yet reclaimed (they are reclaimed in bulk when a shard's table is
	// rebuilt). Memory is proportional to it. It is summed shard by shard,
	// so under concurrent acquisitions it is not one snapshot.
	IndexEntries int
}

// NewKeys returns an empty Keys for policy p, which must be valid (see
// limiter.Policy.Validate), remembering at most maxKeys keys (at least 1).
func NewKeys(p limiter.Policy, maxKeys int) *Keys {
	p = p.Normalize()
	k := &Keys{policy: p, id: limiter.NextID(), proto: limiter.NewBucket(p)}
	if p.Algorithm == limiter.GCRA {
		k.gcra = newGCRATable(p, int64(maxKeys))
		k.table = k.gcra
	} else {
		k.log = newLogTable(p, int64(maxKeys))
		k.table = k.log
	}
	return k
}

// Policy returns the policy with its defaults filled in.
func (k *Keys) Policy() limiter.Policy { return k.policy }

// Acquire takes n permits (1 to limiter.MaxLimit) from key's bucket at now,
// all or nothing; a denial records nothing. A key Keys does not remember
// starts from a full bucket; when Keys already holds its bound, room is
// made as Keys describes, or the key is denied with full set.
func (k *Keys) Acquire(key string, now, n int64) (d limiter.Decision, full bool) {
	if k.gcra != nil {
		return k.gcra.acquire(key, now, n)
	}
	return k.log.acquire(key, now, n)
}

// Available reports what key could take at now, without taking anything:
// a full bucket for a key Keys does not remember, unless Keys holds its
// bound and would deny it (full is then set, Remaining is 0 and ResetAfter
// is the RetryAfter such a denial gives).
func (k *Keys) Available(key string, now int64) (av limiter.Availability, full bool) {
	if k.gcra != nil {
		return k.gcra.available(key, now)
	}
	return k.log.available(key, now)
}

// Lowest returns up to n keys with the fewest permits left at now, fewest
// first. Keys with a full bucket are not listed, so fewer than n may come
// back.
//
// Ties are ordered deterministically. Under GCRA: by TAT descending (the
// key whose bucket refills last is truly closer to being cut off, even
// when both have the same whole number of permits left), then by key
// ascending. Under the sliding log: by ResetAfter descending, then by key.
//
// Cost: under GCRA every key refills at the same rate, so the permits left
// order exactly by TAT (a later TAT has fewer), an order that time does not
// change. Every acquisition keeps an index of TAT bounds up to date, and
// Lowest walks it from the latest TAT down: it reads one bound per shard
// and O(n·log m) index nodes, whatever the number m of keys. Under the
// sliding log the permits left depend on when each past grant leaves its
// window, so no order survives time: Lowest scans every key, in
// O(m log n), holding one shard's lock at a time, and gives up with ctx's
// error when ctx is done.
//
// The answer is not one atomic snapshot: each shard is read under its own
// lock, all at the same instant.
func (k *Keys) Lowest(ctx context.Context, now int64, n int) ([]limiter.KeyEntry, error) {
	return k.table.lowest(ctx, now, n)
}

// Stats counts what Keys holds, in O(shards).
func (k *Keys) Stats() KeyStats { return k.table.stats() }

// Live counts the keys the shards hold, taking each shard's lock in turn;
// at rest it equals Stats().Keys. It is for tests of the bound.
func (k *Keys) Live() int { return k.table.live() }

// Check verifies the table's internal state from scratch, in O(keys): every
// key is findable from its hash, counts agree, and every bound of the GCRA
// index is exact. It is for tests, which call it between operations.
func (k *Keys) Check() error {
	if err := k.table.check(); err != nil {
		return fmt.Errorf("memory: keys: %w", err)
	}
	return nil
}

// admission enforces the bound on keys across shards: count is the number
// of keys remembered plus insertions under way, and never exceeds max.
type admission struct {
	count atomic.Int64
	max   int64
}

// reserve claims room for one more key, if there is some.
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

// maxVictimAttempts bounds how often a joint decision makes room for its
// keys when concurrent decisions keep taking the keys it found (see
// keys_joint.go).
const maxVictimAttempts = 8

// maxEvictAttempts bounds how often a newcomer at the bound looks for a
// key to evict when concurrent ones keep changing the candidate. Every
// newcomer at the bound looks at the same candidate, the key Keys evicts
// first, and only one of them gets it: each miss is another's eviction,
// so the bound is set above the number of newcomers that can be looking
// at once on a busy service, not at a few.
const maxEvictAttempts = 256

// tableFull is the denial of a newcomer that cannot be remembered; the key
// that could be evicted regains a permit after retry.
func tableFull(n, limit int64, retry time.Duration) limiter.Decision {
	return limiter.Decision{Permits: n, Limit: limit, RetryAfter: retry, ResetAfter: retry}
}

// tableFullAvailability is what a newcomer that cannot be remembered could
// take: nothing until the key that could be evicted regains a permit after
// retry, the RetryAfter and ResetAfter of tableFull.
func tableFullAvailability(limit int64, retry time.Duration) limiter.Availability {
	return limiter.Availability{Limit: limit, ResetAfter: retry}
}

// refillInterval is how long a bucket of p takes to regain one permit,
// rounded up to a whole nanosecond so that it is never 0.
func refillInterval(p limiter.Policy) time.Duration {
	return (p.Period + time.Duration(p.Limit) - 1) / time.Duration(p.Limit)
}
