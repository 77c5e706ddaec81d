package tenant

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
)

// A tenant's key is a uint64, so that tables hold it inline:
//
//   - IPv6: the first 64 bits of the address with every bit past the prefix
//     length cleared, i.e. the prefix itself.
//   - IPv4 a.b.c.d: 0xff00_0000_aabb_ccdd, the first 64 bits of an address
//     under ff00::/8. That range is IPv6 multicast, which is never the source
//     of a request and is rejected as input, and clearing bits of any other
//     address never yields a first byte of 0xff, so no IPv6 key can take it.
const v4Tag = uint64(0xff) << 56

// Normalize returns the tenant that address ip counts as when IPv6 is
// aggregated to ipv6Prefix bits (1 to MaxIPv6Prefix): the canonical IPv4
// address for IPv4 and IPv4-mapped IPv6 ("::ffff:203.0.113.7" gives
// "203.0.113.7"), and the prefix for IPv6 ("2001:db8:1:2::/64"). It also
// accepts a tenant it returned, so it is idempotent: an IPv6 prefix exactly
// ipv6Prefix bits long names that tenant, its bits past the prefix ignored
// ("2001:db8:1:2::5/64" is "2001:db8:1:2::/64"). A prefix of any other
// length is refused, since a shorter one spans several tenants and a
// longer one is only part of one; so is an IPv4 prefix, since an IPv4
// tenant is written as a plain address.
//
// The error wraps ErrInvalidIP for an empty or malformed address, one with
// a zone ("fe80::1%eth0"), the unspecified addresses and multicast
// addresses, and ErrInvalidConfig for an ipv6Prefix out of range.
func Normalize(ip string, ipv6Prefix int) (string, error) {
	if err := checkPrefix(ipv6Prefix); err != nil {
		return "", err
	}
	k, err := parseKey(ip, ipv6Prefix)
	if err != nil {
		return "", err
	}
	return formatKey(k, ipv6Prefix), nil
}

// NormalizeAddr is Normalize of an address already parsed: the tenant a
// counts as, without writing a out and reading it back. The error wraps
// ErrInvalidIP for an invalid netip.Addr, one with a zone, the unspecified
// addresses and multicast addresses, and ErrInvalidConfig for an
// ipv6Prefix out of range.
func NormalizeAddr(a netip.Addr, ipv6Prefix int) (string, error) {
	if err := checkPrefix(ipv6Prefix); err != nil {
		return "", err
	}
	if !a.IsValid() {
		return "", fmt.Errorf("%w: no address", ErrInvalidIP)
	}
	k, why := addrKey(a, ipv6Prefix)
	if why != "" {
		return "", invalidIP(a.String(), why)
	}
	return formatKey(k, ipv6Prefix), nil
}

// checkPrefix reports an IPv6 prefix length tenants cannot be grouped by.
func checkPrefix(ipv6Prefix int) error {
	if ipv6Prefix < 1 || ipv6Prefix > MaxIPv6Prefix {
		return fmt.Errorf("%w: IPv6 prefix must be between 1 and %d, got %d", ErrInvalidConfig, MaxIPv6Prefix, ipv6Prefix)
	}
	return nil
}

// maxIPLen bounds the input echoed back in an error.
const maxIPLen = 64

func quoteIP(s string) string {
	if len(s) > maxIPLen {
		s = s[:maxIPLen] + "…"
	}
	return fmt.Sprintf("%q", s)
}

func invalidIP(s, why string) error {
	return fmt.Errorf("%w: %s %s", ErrInvalidIP, quoteIP(s), why)
}

// parseKey returns the key of the tenant s counts as; bits is the IPv6
// prefix length, from 1 to 64.
func parseKey(s string, bits int) (uint64, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: empty address", ErrInvalidIP)
	}
	if strings.IndexByte(s, '/') >= 0 {
		return parsePrefixKey(s, bits)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return 0, invalidIP(s, "is not an IP address")
	}
	k, why := addrKey(a, bits)
	if why != "" {
		return 0, invalidIP(s, why)
	}
	return k, nil
}

// addrKey is parseKey of address a, or why a is no tenant.
func addrKey(a netip.Addr, bits int) (k uint64, why string) {
	if a.Zone() != "" {
		return 0, "has a zone"
	}
	a = a.Unmap()
	if why := notSource(a); why != "" {
		return 0, why
	}
	if a.Is4() {
		b := a.As4()
		return v4Tag | uint64(binary.BigEndian.Uint32(b[:])), ""
	}
	b := a.As16()
	return binary.BigEndian.Uint64(b[:8]) & prefixMask(bits), ""
}

// parsePrefixKey accepts an IPv6 prefix bits long, such as a tenant string
// returned by formatKey.
func parsePrefixKey(s string, bits int) (uint64, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return 0, invalidIP(s, "is not an IP address or IPv6 prefix")
	}
	a := p.Addr()
	if !a.Is6() || a.Is4In6() {
		return 0, invalidIP(s, "is a prefix but not an IPv6 one")
	}
	if p.Bits() != bits {
		return 0, invalidIP(s, fmt.Sprintf("is a prefix of another length than IPv6 tenants (/%d)", bits))
	}
	// A prefix such as ::/64 holds sources (::1) though its first address
	// is unspecified; bits is at most 64, so it is never a single address.
	if a = p.Masked().Addr(); a.IsMulticast() {
		return 0, invalidIP(s, "is multicast")
	}
	b := a.As16()
	return binary.BigEndian.Uint64(b[:8]) & prefixMask(bits), nil
}

// notSource says why a is never the source of a request, or "" when it
// can be. IPv6 multicast must be rejected: its range holds the IPv4 keys.
func notSource(a netip.Addr) string {
	switch {
	case a.IsUnspecified():
		return "is unspecified"
	case a.IsMulticast():
		return "is multicast"
	}
	return ""
}

func prefixMask(bits int) uint64 { return ^uint64(0) << (64 - bits) }

// formatKey returns the tenant string of key k; bits is the IPv6 prefix
// length the key was made with.
// tenantName is formatKey(k, bits) for the key parsed from ip: ip itself
// when it is already written that way, as IPv4 addresses usually are,
// which spares the hot path an allocation.
func tenantName(ip string, k uint64, bits int) string {
	if k&^uint64(0xffff_ffff) == v4Tag {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(k))
		var buf [len("255.255.255.255")]byte
		name := netip.AddrFrom4(b).AppendTo(buf[:0])
		if string(name) == ip {
			return ip
		}
		return string(name)
	}
	return formatKey(k, bits)
}

func formatKey(k uint64, bits int) string {
	if k&^uint64(0xffff_ffff) == v4Tag {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(k))
		return netip.AddrFrom4(b).String()
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], k)
	return netip.PrefixFrom(netip.AddrFrom16(b), bits).String()
}
