package tenant

// Key returns the key of the tenant that address ip counts as when IPv6 is
// aggregated to ipv6Prefix bits (0 means DefaultIPv6Prefix), and the
// tenant's name as Decision.Tenant gives it. It is for backends that keep
// tenants outside a Registry: the key is stable across processes and
// versions, so it can name a tenant in shared storage.
//
// The key of an IPv6 tenant is its prefix's first 64 bits; an IPv4 address
// a.b.c.d (IPv4-mapped IPv6 included) is 0xff00_0000_aabb_ccdd. So keys
// order IPv6 prefixes in address order, then IPv4 addresses in address
// order: the order in which Lowest breaks its last ties.
//
// ip is read as Normalize reads it. The error wraps ErrInvalidIP for an
// address that cannot name a tenant, and ErrInvalidConfig for an ipv6Prefix
// out of range.
func Key(ip string, ipv6Prefix int) (key uint64, name string, err error) {
	if ipv6Prefix == 0 {
		ipv6Prefix = DefaultIPv6Prefix
	}
	if err := checkPrefix(ipv6Prefix); err != nil {
		return 0, "", err
	}
	k, err := parseKey(ip, ipv6Prefix)
	if err != nil {
		return 0, "", err
	}
	return k, formatKey(k, ipv6Prefix), nil
}

// KeyName returns the name of the tenant whose key (from Key) is key, with
// the ipv6Prefix the key was made with (0 means DefaultIPv6Prefix).
func KeyName(key uint64, ipv6Prefix int) string {
	if ipv6Prefix == 0 {
		ipv6Prefix = DefaultIPv6Prefix
	}
	return formatKey(key, ipv6Prefix)
}
