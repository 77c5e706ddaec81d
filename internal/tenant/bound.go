package tenant

import (
	"fmt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// DefaultMaxBytes is the bound a zero Config.MaxBytes stands for: 256 MiB.
// At the default policy (GCRA) it never binds below DefaultMaxTenants; under
// the sliding log at a Limit of 100 it bounds the registry to 117,036
// tenants.
const DefaultMaxBytes = 256 << 20

// TableBytes is what a Registry's tables take beyond TenantBytes a tenant,
// whatever their number (see memory.TableBytes).
const TableBytes = memory.TableBytes

// keyLen is the length of a tenant's key in a Registry's table.
const keyLen = len(keyBytes{})

// TenantBytes returns the most memory, in bytes, one remembered tenant of
// policy p can hold in a Registry: memory.KeyBytes for its 8-byte key.
// Under GCRA it is 48 whatever the policy. Under the sliding log it is 240
// plus 16 per slot of the tenant's ring of grants, which grows in powers
// of two up to min(Limit, 4096) slots (at least 4), and never shrinks while
// the tenant is remembered: at a Limit of 100, 240 + 16·128 = 2288 bytes.
// It is a bound on live memory; a Go process also holds garbage until its
// collector runs (up to as much again at the default GOGC=100, unless
// GOMEMLIMIT caps it).
func TenantBytes(p limiter.Policy) int64 { return memory.KeyBytes(p, keyLen) }

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
