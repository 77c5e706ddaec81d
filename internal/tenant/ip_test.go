package tenant

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	tests := []struct {
		name   string
		ip     string
		prefix int
		want   string
	}{
		{"IPv4", "203.0.113.7", 64, "203.0.113.7"},
		{"IPv4 leading zero octets", "10.0.0.1", 64, "10.0.0.1"},
		{"IPv4 loopback", "127.0.0.1", 64, "127.0.0.1"},
		{"IPv4 broadcast", "255.255.255.255", 64, "255.255.255.255"},
		{"IPv4-mapped IPv6", "::ffff:203.0.113.7", 64, "203.0.113.7"},
		{"IPv4-mapped IPv6 in hex", "::ffff:cb00:7107", 64, "203.0.113.7"},
		{"IPv6 /64", "2001:db8:1:2:aaaa:bbbb:cccc:dddd", 64, "2001:db8:1:2::/64"},
		{"IPv6 /64 other host", "2001:db8:1:2::1", 64, "2001:db8:1:2::/64"},
		{"IPv6 /48", "2001:db8:1:2:aaaa:bbbb:cccc:dddd", 48, "2001:db8:1::/48"},
		{"IPv6 /1", "2001:db8::1", 1, "::/1"},
		{"IPv6 /7 keeps below ff00::/8", "fe80::1", 7, "fe00::/7"},
		{"IPv6 upper case", "2001:DB8::1", 64, "2001:db8::/64"},
		{"IPv6 loopback", "::1", 64, "::/64"},
		{"IPv6 link-local", "fe80::1", 64, "fe80::/64"},
		{"tenant string of a /64", "2001:db8:1:2::/64", 64, "2001:db8:1:2::/64"},
		{"tenant string of a /48", "2001:db8:1::/48", 48, "2001:db8:1::/48"},
		{"prefix with host bits", "2001:db8:1:2::5/64", 64, "2001:db8:1:2::/64"},
		{"prefix with host bits at /48", "2001:db8:1:2::5/48", 48, "2001:db8:1::/48"},
		{"prefix in upper case", "2001:DB8::/64", 64, "2001:db8::/64"},
		{"tenant of the loopback", "::/64", 64, "::/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Normalize(tt.ip, tt.prefix)
			if err != nil {
				t.Fatalf("Normalize(%q, %d): %v", tt.ip, tt.prefix, err)
			}
			if got != tt.want {
				t.Errorf("Normalize(%q, %d) = %q, want %q", tt.ip, tt.prefix, got, tt.want)
			}
		})
	}
}

func TestNormalizeRejects(t *testing.T) {
	tests := []struct {
		name   string
		ip     string
		prefix int
		want   error
	}{
		{"empty", "", 64, ErrInvalidIP},
		{"garbage", "not an ip", 64, ErrInvalidIP},
		{"IPv4 with port", "203.0.113.7:80", 64, ErrInvalidIP},
		{"IPv6 in brackets", "[2001:db8::1]", 64, ErrInvalidIP},
		{"IPv4 out of range", "256.1.1.1", 64, ErrInvalidIP},
		{"IPv4 leading zeros", "010.0.0.1", 64, ErrInvalidIP},
		{"zone", "fe80::1%eth0", 64, ErrInvalidIP},
		{"IPv4-mapped with zone", "::ffff:1.2.3.4%eth0", 64, ErrInvalidIP},
		{"IPv6 unspecified", "::", 64, ErrInvalidIP},
		{"IPv4 unspecified", "0.0.0.0", 64, ErrInvalidIP},
		{"IPv4-mapped unspecified", "::ffff:0.0.0.0", 64, ErrInvalidIP},
		{"IPv6 multicast", "ff02::1", 64, ErrInvalidIP},
		{"IPv6 multicast at /1", "ff02::1", 1, ErrInvalidIP},
		{"IPv4 multicast", "224.0.0.1", 64, ErrInvalidIP},
		{"prefix coarser than the tenant", "2001:db8::/32", 64, ErrInvalidIP},
		{"prefix finer than the tenant", "2001:db8:1:2:3::/80", 64, ErrInvalidIP},
		{"prefix of one address", "2001:db8::1/128", 64, ErrInvalidIP},
		{"prefix of another length", "2001:db8:1:2::5/64", 48, ErrInvalidIP},
		{"prefix length with a leading zero", "2001:db8::/064", 64, ErrInvalidIP},
		{"prefix length missing", "2001:db8::/", 64, ErrInvalidIP},
		{"prefix without an address", "/64", 64, ErrInvalidIP},
		{"two prefix lengths", "2001:db8::/64/64", 64, ErrInvalidIP},
		{"IPv4 /32", "203.0.113.7/32", 64, ErrInvalidIP},
		{"IPv4 prefix", "203.0.113.0/24", 64, ErrInvalidIP},
		{"IPv4-mapped prefix", "::ffff:1.2.3.4/128", 64, ErrInvalidIP},
		{"multicast prefix", "ff00::/64", 64, ErrInvalidIP},
		{"unspecified /128", "::/128", 64, ErrInvalidIP},
		{"malformed prefix", "2001:db8::/200", 64, ErrInvalidIP},
		{"very long", strings.Repeat("1", 10000), 64, ErrInvalidIP},
		{"prefix 0", "2001:db8::1", 0, ErrInvalidConfig},
		{"prefix 65", "2001:db8::1", 65, ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Normalize(tt.ip, tt.prefix)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Normalize(%.20q, %d) = %q, %v; want an error wrapping %v", tt.ip, tt.prefix, got, err, tt.want)
			}
			if len(err.Error()) > 200 {
				t.Errorf("error is %d bytes long, want the input truncated", len(err.Error()))
			}
		})
	}
}

func TestKeysDoNotCollide(t *testing.T) {
	// An IPv4 key must never equal an IPv6 key, whatever the prefix.
	v6 := []string{"2001:db8::1", "fe80::1", "fdff:ffff::1", "feff:ffff:ffff:ffff::1", "::1", "8000::1"}
	for _, bits := range []int{1, 7, 8, 9, 48, 64} {
		for _, a := range v6 {
			k, err := parseKey(a, bits)
			if err != nil {
				t.Fatalf("parseKey(%q, %d): %v", a, bits, err)
			}
			if k>>56 == 0xff {
				t.Errorf("parseKey(%q, %d) = %#x, want a key outside ff00::/8", a, bits, k)
			}
		}
	}
	k, err := parseKey("255.255.255.255", 64)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := k, uint64(0xff00_0000_ffff_ffff); got != want {
		t.Errorf("key of 255.255.255.255 = %#x, want %#x", got, want)
	}
}

func FuzzParseIP(f *testing.F) {
	for _, s := range []string{
		"203.0.113.7", "::ffff:203.0.113.7", "2001:db8:1:2::1", "2001:db8:1:2::/64", "fe80::1%eth0",
		"ff02::1", "::", "0.0.0.0", "", "1.2.3.4/32", "::ffff:1.2.3.4/128", "2001:db8::/200", "::1",
	} {
		f.Add(s, uint8(64))
		f.Add(s, uint8(48))
	}
	f.Fuzz(func(t *testing.T, s string, b uint8) {
		bits := int(b)%MaxIPv6Prefix + 1
		k, err := parseKey(s, bits)
		if err != nil {
			if !errors.Is(err, ErrInvalidIP) {
				t.Fatalf("parseKey(%q, %d): %v, want an error wrapping ErrInvalidIP", s, bits, err)
			}
			return
		}
		tenant := formatKey(k, bits)
		k2, err := parseKey(tenant, bits)
		if err != nil {
			t.Fatalf("parseKey(%q) of the tenant of %q: %v", tenant, s, err)
		}
		if k2 != k {
			t.Fatalf("tenant %q of %q has key %#x, want %#x", tenant, s, k2, k)
		}
		if again := formatKey(k2, bits); again != tenant {
			t.Fatalf("normalizing %q again gave %q", tenant, again)
		}
		// The tenant is canonical and agrees with net/netip.
		if k>>56 == 0xff {
			a, err := netip.ParseAddr(tenant)
			if err != nil || !a.Is4() || a.String() != tenant {
				t.Fatalf("IPv4 tenant %q of %q is not a canonical IPv4 address", tenant, s)
			}
			return
		}
		p, err := netip.ParsePrefix(tenant)
		if err != nil || p.Bits() != bits || p.Masked() != p || p.String() != tenant {
			t.Fatalf("IPv6 tenant %q of %q is not a canonical /%d prefix", tenant, s, bits)
		}
		if a, err := netip.ParseAddr(s); err == nil && !p.Contains(a) {
			t.Fatalf("tenant %q does not contain %q", tenant, s)
		}
	})
}

func TestTenantName(t *testing.T) {
	for _, tc := range []struct{ ip, want string }{
		{"192.0.2.7", "192.0.2.7"},
		{"::ffff:192.0.2.7", "192.0.2.7"},
		{"2001:db8::1", "2001:db8::/64"},
	} {
		k, err := parseKey(tc.ip, DefaultIPv6Prefix)
		if err != nil {
			t.Fatalf("parseKey(%q): %v", tc.ip, err)
		}
		if got := tenantName(tc.ip, k, DefaultIPv6Prefix); got != tc.want || got != formatKey(k, DefaultIPv6Prefix) {
			t.Errorf("tenantName(%q): got %q, want %q, as formatKey gives", tc.ip, got, tc.want)
		}
	}
	ip := "198.51.100.1"
	k, _ := parseKey(ip, DefaultIPv6Prefix)
	if n := testing.AllocsPerRun(100, func() { _ = tenantName(ip, k, DefaultIPv6Prefix) }); n != 0 {
		t.Errorf("tenantName of an address written as its name: %v allocations, want 0", n)
	}
}

// FuzzNormalizeAddr holds NormalizeAddr to Normalize of the address
// written out: the same tenant, or both refusing it.
func FuzzNormalizeAddr(f *testing.F) {
	for _, s := range []string{
		"203.0.113.7", "::ffff:203.0.113.7", "2001:db8:1:2::1", "fe80::1%eth0", "ff02::1", "::", "0.0.0.0",
		"224.0.0.1", "::1", "127.0.0.1", "::ffff:0.0.0.0",
	} {
		a := netip.MustParseAddr(s)
		b := a.AsSlice()
		f.Add(b, a.Zone(), uint8(64))
		f.Add(b, "", uint8(48))
	}
	f.Add([]byte{}, "", uint8(64)) // the zero netip.Addr
	f.Fuzz(func(t *testing.T, b []byte, zone string, bits uint8) {
		prefix := int(bits)%MaxIPv6Prefix + 1
		a, _ := netip.AddrFromSlice(b)
		if a.Is6() {
			a = a.WithZone(zone)
		}
		got, err := NormalizeAddr(a, prefix)
		if !a.IsValid() {
			if !errors.Is(err, ErrInvalidIP) {
				t.Fatalf("NormalizeAddr of the zero address: %q, %v; want an error wrapping ErrInvalidIP", got, err)
			}
			return
		}
		want, werr := Normalize(a.String(), prefix)
		if got != want || (err == nil) != (werr == nil) || err != nil && !errors.Is(err, ErrInvalidIP) {
			t.Fatalf("NormalizeAddr(%v, %d) = %q, %v; Normalize(%q) = %q, %v", a, prefix, got, err, a.String(), want, werr)
		}
	})
}
