package tenant

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
)

// fakeClock is a clock that moves only when told to.
type fakeClock = clocktest.Clock

func newFakeClock() *fakeClock { return clocktest.New(time.Unix(1_700_000_000, 0)) }

func newRegistry(t testing.TB, cfg Config, c *fakeClock) *Registry {
	t.Helper()
	r, err := New(cfg, c.Limiter())
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return r
}

func mustAcquire(t testing.TB, r *Registry, ip string, n int64) Decision {
	t.Helper()
	d, err := r.Acquire(context.Background(), ip, n)
	if err != nil {
		t.Fatalf("Acquire(%q, %d): %v", ip, n, err)
	}
	return d
}

func mustAvailable(t testing.TB, r *Registry, ip string) Availability {
	t.Helper()
	a, err := r.Available(context.Background(), ip)
	if err != nil {
		t.Fatalf("Available(%q): %v", ip, err)
	}
	return a
}

func mustLowest(t testing.TB, r *Registry, k int) []Entry {
	t.Helper()
	es, err := r.Lowest(context.Background(), k)
	if err != nil {
		t.Fatalf("Lowest(%d): %v", k, err)
	}
	return es
}

var algorithms = []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog}

func TestNewValidates(t *testing.T) {
	valid := limiter.Policy{Limit: 9, Period: time.Minute}
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{"zero policy", Config{}, limiter.ErrInvalidPolicy},
		{"bad burst", Config{Policy: limiter.Policy{Limit: 9, Period: time.Minute, Burst: 10}}, limiter.ErrInvalidPolicy},
		{"prefix 65", Config{Policy: valid, IPv6Prefix: 65}, ErrInvalidConfig},
		{"negative prefix", Config{Policy: valid, IPv6Prefix: -1}, ErrInvalidConfig},
		{"negative max tenants", Config{Policy: valid, MaxTenants: -1}, ErrInvalidConfig},
		{"defaults", Config{Policy: valid}, nil},
		{"prefix 1, one tenant", Config{Policy: valid, IPv6Prefix: 1, MaxTenants: 1}, nil},
		{"negative max bytes", Config{Policy: valid, MaxBytes: -1}, ErrInvalidConfig},
		{"max bytes below one tenant", Config{Policy: valid, MaxBytes: TableBytes + 47}, ErrInvalidConfig},
		{"max bytes of one tenant", Config{Policy: valid, MaxBytes: TableBytes + 48}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg, nil)
			if !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
				t.Errorf("New(%+v) error = %v, want %v", tt.cfg, err, tt.want)
			}
		})
	}
}

func TestPolicyIsNormalized(t *testing.T) {
	r := newRegistry(t, Config{Policy: limiter.Policy{Limit: 9, Period: time.Minute}}, newFakeClock())
	want := limiter.Policy{Limit: 9, Period: time.Minute, Algorithm: limiter.GCRA, Burst: 9}
	if got := r.Policy(); got != want {
		t.Errorf("Policy() = %+v, want %+v", got, want)
	}
}

// TestSeedExamples follows the example for each tenant: a policy of
// 9 per period, 0 of 9 used; 10 permits are denied as exceeding capacity and
// change nothing; 5 permits leave 4.
func TestSeedExamples(t *testing.T) {
	for _, alg := range algorithms {
		for _, ip := range []string{"203.0.113.7", "2001:db8:1:2::1"} {
			t.Run(string(alg)+"/"+ip, func(t *testing.T) {
				c := newFakeClock()
				r := newRegistry(t, Config{Policy: limiter.Policy{Limit: 9, Period: time.Minute, Algorithm: alg}}, c)
				if got := mustAvailable(t, r, ip).Remaining; got != 9 {
					t.Fatalf("available before any acquisition: got %d, want 9", got)
				}
				d := mustAcquire(t, r, ip, 10)
				if d.Allowed || !d.ExceedsCapacity || d.RegistryFull {
					t.Fatalf("acquire 10: got %+v, want a denial exceeding capacity", d)
				}
				if got := mustAvailable(t, r, ip).Remaining; got != 9 {
					t.Fatalf("available after the denial: got %d, want 9", got)
				}
				if got := r.Stats().Tenants; got != 0 {
					t.Fatalf("tenants after a denial: got %d, want 0", got)
				}
				d = mustAcquire(t, r, ip, 5)
				if !d.Allowed || d.Remaining != 4 || d.Limit != 9 {
					t.Fatalf("acquire 5: got %+v, want allowed with 4 remaining of 9", d)
				}
				a := mustAvailable(t, r, ip)
				if a.Remaining != 4 || a.Limit != 9 {
					t.Fatalf("available after 5: got %+v, want 4 of 9", a)
				}
				// Another host of the same /64 shares the bucket; another
				// IPv4 address does not.
				other := map[bool]string{true: "203.0.113.8", false: "2001:db8:1:2::ffff"}[ip == "203.0.113.7"]
				want := map[bool]int64{true: 9, false: 4}[ip == "203.0.113.7"]
				if got := mustAvailable(t, r, other).Remaining; got != want {
					t.Errorf("available of %s: got %d, want %d", other, got, want)
				}
			})
		}
	}
}

func TestTenantStrings(t *testing.T) {
	r := newRegistry(t, Config{Policy: limiter.Policy{Limit: 9, Period: time.Minute}, IPv6Prefix: 48}, newFakeClock())
	tests := []struct{ ip, want string }{
		{"203.0.113.7", "203.0.113.7"},
		{"::ffff:203.0.113.7", "203.0.113.7"},
		{"2001:db8:1:2::1", "2001:db8:1::/48"},
	}
	for _, tt := range tests {
		if got := mustAcquire(t, r, tt.ip, 1).Tenant; got != tt.want {
			t.Errorf("Acquire(%q).Tenant = %q, want %q", tt.ip, got, tt.want)
		}
		if got := mustAvailable(t, r, tt.ip).Tenant; got != tt.want {
			t.Errorf("Available(%q).Tenant = %q, want %q", tt.ip, got, tt.want)
		}
		if got, err := r.Tenant(tt.ip); err != nil || got != tt.want {
			t.Errorf("Tenant(%q) = %q, %v; want %q", tt.ip, got, err, tt.want)
		}
	}
	if got := mustAvailable(t, r, "203.0.113.7").Remaining; got != 7 {
		t.Errorf("IPv4 and IPv4-mapped share a bucket: got %d remaining, want 7", got)
	}
}

func TestInvalidInputChangesNothing(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			r := newRegistry(t, Config{Policy: limiter.Policy{Limit: 9, Period: time.Minute, Algorithm: alg}}, newFakeClock())
			ctx := context.Background()
			mustAcquire(t, r, "203.0.113.7", 2)
			for _, n := range []int64{0, -1, limiter.MaxLimit + 1} {
				_, err := r.Acquire(ctx, "203.0.113.7", n)
				if !errors.Is(err, limiter.ErrInvalidPermits) {
					t.Errorf("Acquire(permits=%d) error = %v, want ErrInvalidPermits", n, err)
				}
			}
			for _, ip := range []string{"", "garbage", "fe80::1%eth0", "ff02::1", "::", "0.0.0.0"} {
				_, err := r.Acquire(ctx, ip, 1)
				if !errors.Is(err, ErrInvalidIP) {
					t.Errorf("Acquire(%q) error = %v, want ErrInvalidIP", ip, err)
				}
				_, err = r.Available(ctx, ip)
				if !errors.Is(err, ErrInvalidIP) {
					t.Errorf("Available(%q) error = %v, want ErrInvalidIP", ip, err)
				}
			}
			_, err := r.Acquire(ctx, "garbage", 1)
			if want := `tenant: acquire "garbage": invalid IP address`; err == nil || len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
				t.Errorf("error = %v, want it to start with %q", err, want)
			}
			for _, k := range []int{0, -1, MaxLowest + 1} {
				if _, err := r.Lowest(ctx, k); !errors.Is(err, ErrInvalidK) {
					t.Errorf("Lowest(%d) error = %v, want ErrInvalidK", k, err)
				}
			}
			if got := mustAvailable(t, r, "203.0.113.7").Remaining; got != 7 {
				t.Errorf("remaining after invalid calls: got %d, want 7", got)
			}
			if got := r.Stats(); got.Tenants != 1 {
				t.Errorf("Stats() = %+v, want 1 tenant", got)
			}
		})
	}
}

func TestLowestOrder(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			c := newFakeClock()
			r := newRegistry(t, Config{Policy: limiter.Policy{Limit: 10, Period: time.Second, Algorithm: alg}}, c)
			if got := mustLowest(t, r, 5); len(got) != 0 {
				t.Fatalf("Lowest of an empty registry: got %v, want none", got)
			}
			mustAcquire(t, r, "192.0.2.1", 3)
			mustAcquire(t, r, "192.0.2.2", 7)
			mustAcquire(t, r, "2001:db8::1", 3)
			mustAcquire(t, r, "192.0.2.3", 1)
			got := mustLowest(t, r, 3)
			want := []Entry{
				{Tenant: "192.0.2.2", Remaining: 3, Limit: 10, ResetAfter: 700 * time.Millisecond},
				{Tenant: "2001:db8::/64", Remaining: 7, Limit: 10, ResetAfter: 300 * time.Millisecond},
				{Tenant: "192.0.2.1", Remaining: 7, Limit: 10, ResetAfter: 300 * time.Millisecond},
			}
			if alg == limiter.SlidingLog {
				for i := range want {
					want[i].ResetAfter = time.Second
				}
			}
			if len(got) != len(want) {
				t.Fatalf("Lowest(3) = %+v, want %+v", got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("Lowest(3)[%d] = %+v, want %+v", i, got[i], want[i])
				}
			}
			c.Advance(time.Second)
			if got := mustLowest(t, r, 10); len(got) != 0 {
				t.Errorf("Lowest once every bucket is full again: got %v, want none", got)
			}
		})
	}
}

func TestFullTenantsAreDropped(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			c := newFakeClock()
			r := newRegistry(t, Config{Policy: limiter.Policy{Limit: 2, Period: time.Second, Algorithm: alg}}, c)
			for i := range 1000 {
				mustAcquire(t, r, ipv4(i), 1)
			}
			if got := r.Stats().Tenants; got != 1000 {
				t.Fatalf("tenants: got %d, want 1000", got)
			}
			c.Advance(time.Second)
			// Each operation drops a bounded number of full tenants, so a
			// few operations per tenant empty the registry.
			for i := range 1000 {
				mustAvailable(t, r, ipv4(i))
			}
			if got := r.Stats(); got.Tenants != 0 {
				t.Errorf("Stats() after every bucket refilled = %+v, want no tenants", got)
			}
		})
	}
}

// ipv4 returns a distinct IPv4 address for each i.
func ipv4(i int) string {
	return ipv4Of(uint32(0x0a000000 + i))
}

func ipv4Of(v uint32) string {
	return formatKey(v4Tag|uint64(v), 64)
}
