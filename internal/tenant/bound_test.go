package tenant

import (
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// TestAvailableAtBound: at Config.MaxTenants, Available of a tenant the
// registry does not remember answers what an acquisition of one permit
// would get: a full bucket when some tenant could be evicted, otherwise
// nothing left until room can be made, with the same time as the denial.
func TestAvailableAtBound(t *testing.T) {
	const newcomer = "198.51.100.77"
	tests := []struct {
		name      string
		alg       limiter.Algorithm
		limit     int64
		take      []int64 // permits each remembered tenant takes, a second apart
		wantFull  bool    // the newcomer is denied with RegistryFull
		wantRetry time.Duration
	}{
		{"every tenant limited", limiter.GCRA, 1, []int64{1, 1, 1}, true, time.Hour},
		{"every tenant limited", limiter.SlidingLog, 1, []int64{1, 1, 1}, true, time.Hour},
		{"the oldest tenant has a permit left", limiter.GCRA, 2, []int64{1, 2, 2}, false, 0},
		{"the oldest tenant has a permit left", limiter.SlidingLog, 2, []int64{1, 2, 2}, false, 0},
		// Under GCRA the tenant with the earliest TAT is evicted; under the
		// sliding log the one whose log empties first, although limited,
		// decides (the rule errs on the side of denying).
		{"a younger tenant has a permit left", limiter.GCRA, 2, []int64{2, 2, 1}, false, 0},
		{"a younger tenant has a permit left", limiter.SlidingLog, 2, []int64{2, 2, 1}, true, time.Hour},
		{"room left", limiter.GCRA, 1, []int64{1, 1}, false, 0},
		{"room left", limiter.SlidingLog, 1, []int64{1, 1}, false, 0},
	}
	for _, tt := range tests {
		t.Run(string(tt.alg)+"/"+tt.name, func(t *testing.T) {
			c := newFakeClock()
			r := newRegistry(t, Config{Policy: limiter.Policy{Limit: tt.limit, Period: time.Hour, Algorithm: tt.alg}, MaxTenants: 3}, c)
			for i, n := range tt.take {
				if d := mustAcquire(t, r, ipv4(i), n); !d.Allowed {
					t.Fatalf("Acquire(%s, %d): got %+v, want allowed", ipv4(i), n, d)
				}
				c.Advance(time.Second)
			}
			a := mustAvailable(t, r, newcomer)
			want := Availability{Tenant: newcomer, Availability: limiter.Availability{Remaining: tt.limit, Limit: tt.limit}}
			if tt.wantFull {
				elapsed := time.Duration(len(tt.take)) * time.Second
				want.Availability = limiter.Availability{Remaining: 0, Limit: tt.limit, ResetAfter: tt.wantRetry - elapsed}
				want.RegistryFull = true
			}
			if a != want {
				t.Errorf("Available(%s): got %+v, want %+v", newcomer, a, want)
			}
			d := mustAcquire(t, r, newcomer, 1)
			if d.RegistryFull != want.RegistryFull || d.Allowed == want.RegistryFull {
				t.Fatalf("Acquire(%s, 1): got %+v, want RegistryFull %v", newcomer, d, want.RegistryFull)
			}
			if d.RegistryFull && (d.RetryAfter != a.ResetAfter || d.ResetAfter != a.ResetAfter) {
				t.Errorf("Acquire(%s, 1): got retry %s and reset %s, want both %s as Available said", newcomer, d.RetryAfter, d.ResetAfter, a.ResetAfter)
			}
		})
	}
}

func TestTenantBytes(t *testing.T) {
	tests := []struct {
		alg   limiter.Algorithm
		limit int64
		want  int64
	}{
		{limiter.GCRA, 1, 48},
		{limiter.GCRA, limiter.MaxLimit, 48},
		{limiter.SlidingLog, 1, 240 + 16*4}, // the smallest ring
		{limiter.SlidingLog, 4, 240 + 16*4},
		{limiter.SlidingLog, 5, 240 + 16*8},
		{limiter.SlidingLog, 100, 240 + 16*128},
		{limiter.SlidingLog, 4096, 240 + 16*4096},
		{limiter.SlidingLog, limiter.MaxLimit, 240 + 16*4096}, // older grants merge
	}
	for _, tt := range tests {
		p := limiter.Policy{Limit: tt.limit, Period: time.Hour, Algorithm: tt.alg}
		if got := TenantBytes(p); got != tt.want {
			t.Errorf("TenantBytes(%s, limit %d): got %d, want %d", tt.alg, tt.limit, got, tt.want)
		}
	}
}

// TestMaxBytesBoundsTenants: MaxBytes lowers the bound to what it holds at
// TenantBytes each, and the bound then works as MaxTenants does.
func TestMaxBytesBoundsTenants(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			p := limiter.Policy{Limit: 1, Period: time.Hour, Algorithm: alg}
			cfg := Config{Policy: p, MaxTenants: 100, MaxBytes: TableBytes + 3*TenantBytes(p) + TenantBytes(p) - 1}
			if got, err := Bound(cfg, TableBytes, TenantBytes(p)); got != 3 || err != nil {
				t.Fatalf("Bound: got %d, %v, want 3", got, err)
			}
			r := newRegistry(t, cfg, newFakeClock())
			for i := range 3 {
				if d := mustAcquire(t, r, ipv4(i), 1); !d.Allowed {
					t.Fatalf("Acquire(%s): got %+v, want allowed", ipv4(i), d)
				}
			}
			if d := mustAcquire(t, r, ipv4(3), 1); d.Allowed || !d.RegistryFull {
				t.Errorf("Acquire of a fourth tenant: got %+v, want denied with RegistryFull", d)
			}
			if got := r.Stats().Tenants; got != 3 {
				t.Errorf("tenants: got %d, want 3", got)
			}
		})
	}
}
