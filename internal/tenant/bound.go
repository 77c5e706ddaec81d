package tenant

import (
	"fmt"
	"math/bits"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// DefaultMaxBytes is the bound a zero Config.MaxBytes stands for: 256 MiB.
// At the default policy (GCRA) it never binds below DefaultMaxTenants; under
// the sliding log at a Limit of 100 it bounds the registry to 119,837
// tenants.
const DefaultMaxBytes = 256 << 20

// Worst cases of one tenant in a Registry, in bytes; see TenantBytes.
const (
	// gcraTenantBytes is a 24-byte slot plus its share of the index (16
	// bytes of bounds per 8 slots, and 1/7 more above), at the lowest load
	// a table reaches after growing, 9/16: 47 bytes, rounded up.
	gcraTenantBytes = 48
	// logTenantBytes is everything of a sliding-log tenant but its ring of
	// grants: its 56-byte state in a 64-byte allocation, its map entry (16
	// bytes and a control byte per slot, at a load that falls to 7/16 just
	// after the map grows: 39 bytes), its index item (16 bytes in B-tree
	// nodes at least half full: 32 bytes, and node headers), with room to
	// spare: 10,000,000 addresses measured 135 bytes a tenant besides rings.
	logTenantBytes = 192
	// logEntryBytes is one grant in a tenant's ring.
	logEntryBytes = 16
	// TableBytes is what a Registry's tables take beyond TenantBytes a
	// tenant, whatever their number: each shard's table is a whole number
	// of 8-block groups and its index levels are padded, which sprays at
	// bounds of 1 to 64 MiB measured at up to 350 KB over 47 bytes a GCRA
	// tenant. A Registry holds MaxBytes less TableBytes at TenantBytes a
	// tenant.
	TableBytes = 512 << 10
)

// TenantBytes returns the most memory, in bytes, one remembered tenant of
// policy p can hold in a Registry. Under GCRA it is 48 whatever the policy.
// Under the sliding log it is 192 plus 16 per slot of the tenant's ring of
// grants, which grows in powers of two up to min(Limit, 4096) slots (at
// least 4), and never shrinks while the tenant is remembered: at a Limit of
// 100, 192 + 16·128 = 2240 bytes. It is a bound on live memory; a Go process
// also holds garbage until its collector runs (up to as much again at the
// default GOGC=100, unless GOMEMLIMIT caps it).
func TenantBytes(p limiter.Policy) int64 {
	p = p.Normalize()
	if p.Algorithm == limiter.GCRA {
		return gcraTenantBytes
	}
	return logTenantBytes + logEntryBytes*ringSlots(p.Limit)
}

// ringSlots is the largest ring a sliding log of limit grows to: the power
// of two at or above min(limit, limiter.MaxLogEntries), and at least 4 (see
// limiter.Log).
func ringSlots(limit int64) int64 {
	n := max(4, min(limit, limiter.MaxLogEntries))
	return 1 << bits.Len64(uint64(n-1))
}

// Bound returns how many tenants a backend may remember under cfg when its
// tables cost fixed bytes and each tenant perTenant more: cfg.MaxTenants,
// lowered to what cfg.MaxBytes holds (each 0 standing for its default). The
// error wraps ErrInvalidConfig when a bound is negative or MaxBytes does
// not hold a single tenant.
func Bound(cfg Config, fixed, perTenant int64) (int, error) {
	maxT, maxB := int64(cfg.MaxTenants), cfg.MaxBytes
	if maxT == 0 {
		maxT = DefaultMaxTenants
	}
	if maxB == 0 {
		maxB = DefaultMaxBytes
	}
	if maxT < 1 {
		return 0, fmt.Errorf("%w: max tenants must be at least 1, got %d", ErrInvalidConfig, maxT)
	}
	if maxB < fixed+perTenant {
		return 0, fmt.Errorf("%w: max bytes %d do not hold one tenant, which takes up to %d bytes under this policy besides %d bytes of tables", ErrInvalidConfig, maxB, perTenant, fixed)
	}
	return int(min(maxT, (maxB-fixed)/perTenant)), nil
}
