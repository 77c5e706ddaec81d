package memory

import (
	"math/bits"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Worst cases of one key in a Keys, in bytes, besides its key's bytes; see
// KeyBytes.
const (
	// gcraKeyBytes is a 24-byte slot plus its share of the index (16
	// bytes of bounds per 8 slots, and 1/7 more above), at the lowest load
	// a table reaches after growing, 9/16: 47 bytes, rounded up.
	gcraKeyBytes = 48
	// gcraArenaFactor is the most arena bytes a byte of a key longer than
	// inlineKey takes (shorter keys live in their slot): an arena holds
	// its live keys' bytes and at most as many of dropped keys before it
	// is compacted, and its capacity is at most twice its length.
	gcraArenaFactor = 4
	// logKeyBytes is everything of a sliding-log key but its ring of
	// grants and its bytes: its 72-byte state in an 80-byte allocation,
	// its map entry (a 16-byte string, an 8-byte pointer and a control
	// byte per slot, at a load that falls to 7/16 just after the map grows:
	// 57 bytes), its index item (24 bytes in B-tree nodes at least half
	// full: 48 bytes, and node headers), with room to spare: 10,000,000
	// addresses measured 135 bytes a key besides rings when keys were held
	// inline, before keys took a string each.
	logKeyBytes = 224
	// logKeyByteFactor is the most a key's byte takes in its own
	// allocation, whose size class may be up to twice its length.
	logKeyByteFactor = 2
	// logEntryBytes is one grant in a key's ring.
	logEntryBytes = 16
	// TableBytes is what a Keys' tables take beyond KeyBytes a key,
	// whatever their number: each shard's table is a whole number of
	// 8-block groups and its index levels are padded, which sprays at
	// bounds of 1 to 64 MiB measured at up to 350 KB over 47 bytes a GCRA
	// key; and each shard's arena may hold minGarbage bytes of dropped keys,
	// twice over for its capacity. A Keys holds a bound of keys at KeyBytes
	// each plus TableBytes.
	TableBytes = 512<<10 + maxShards*2*minGarbage
)

// KeyBytes returns the most memory, in bytes, one remembered key of keyLen
// bytes can hold in a Keys under policy p. Under GCRA it is 48, plus 4 per
// byte of a key longer than 8 bytes, whatever the policy. Under the sliding log it is 224
// plus 2 per byte of the key plus 16 per slot of the key's ring of grants,
// which grows in powers of two up to min(Limit, 4096) slots (at least 4),
// and never shrinks while the key is remembered: for a key of 8 bytes at a
// Limit of 100, 224 + 16 + 16·128 = 2288 bytes. It is a bound on live
// memory; a Go process also holds garbage until its collector runs (up to
// as much again at the default GOGC=100, unless GOMEMLIMIT caps it).
func KeyBytes(p limiter.Policy, keyLen int) int64 {
	p = p.Normalize()
	if p.Algorithm == limiter.GCRA {
		if keyLen <= inlineKey {
			return gcraKeyBytes
		}
		return gcraKeyBytes + gcraArenaFactor*int64(keyLen)
	}
	return logKeyBytes + logKeyByteFactor*int64(keyLen) + logEntryBytes*ringSlots(p.Limit)
}

// ringSlots is the largest ring a sliding log of limit grows to: the power
// of two at or above min(limit, limiter.MaxLogEntries), and at least 4 (see
// limiter.Log).
func ringSlots(limit int64) int64 {
	n := max(4, min(limit, limiter.MaxLogEntries))
	return 1 << bits.Len64(uint64(n-1))
}
