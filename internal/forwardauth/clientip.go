package forwardauth

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Forwarding headers a ClientIP reads the chain of proxies from.
const (
	XForwardedFor = "x-forwarded-for"
	Forwarded     = "forwarded" // RFC 7239
)

// MaxHops is the most addresses a ClientIP reads from a forwarding header,
// from its right: a chain of trusted proxies longer than that is not one
// anybody runs, and the bound keeps the work per request small whatever a
// client sends.
const MaxHops = 32

// MaxTrustedHops is the largest ClientIP.Hops.
const MaxTrustedHops = MaxHops

// ClientIP finds the address of the client a request comes from, which no
// client can choose. Each proxy appends to the forwarding header the
// address it got the request from, so only the right end of the header,
// written by proxies one trusts, can be believed; whatever lies further
// left was written by the client, or by proxies it chose.
//
// The chain is the header's addresses, left to right (all its lines in
// order, as RFC 9110 joins repeated fields), then the socket's peer
// address. With Trusted, the client is the rightmost address of the chain
// that is not in a trusted range; with Hops, it is the address Hops places
// left of the peer, the peer being the last of Hops proxies. With neither
// (the zero ClientIP), the client is the peer and the header is ignored.
//
// A chain that cannot name the client that way (a malformed address, an
// obfuscated Forwarded node such as "unknown" or "_hidden", an address
// with a zone, MaxHops trusted addresses in a row, fewer addresses than
// Hops) yields the peer, as Source reports: never an address to the left
// of the problem, which a client could have written. Only the right end
// of the header is read, up to the client: a client that sends a long
// one gains nothing.
type ClientIP struct {
	// Trusted are the proxies' address ranges; IPv4-mapped IPv6 addresses
	// are matched as IPv4.
	Trusted []netip.Prefix
	// Hops is the number of proxies in front of the service, from 1 to
	// MaxTrustedHops; 0 uses Trusted. At most one of Hops and Trusted may
	// be set.
	Hops int
	// Header is XForwardedFor (the zero value means it) or Forwarded.
	Header string
}

// Source says where a ClientIP found the client's address.
type Source uint8

const (
	// FromPeer: the socket's peer is the client, since it is not a trusted
	// proxy.
	FromPeer Source = iota
	// FromHeader: the forwarding header named the client.
	FromHeader
	// FromPeerFallback: the peer is a trusted proxy, but the header could
	// not name the client (see ClientIP); the peer stands for it.
	FromPeerFallback
)

// String returns "peer", "header" or "peer-fallback".
func (s Source) String() string {
	switch s {
	case FromHeader:
		return "header"
	case FromPeerFallback:
		return "peer-fallback"
	}
	return "peer"
}

// Check reports why c cannot be used.
func (c ClientIP) Check() error {
	switch {
	case c.Header != "" && c.Header != XForwardedFor && c.Header != Forwarded:
		return fmt.Errorf("forwardauth: unknown forwarding header %q (want %q or %q)", c.Header, XForwardedFor, Forwarded)
	case c.Hops < 0 || c.Hops > MaxTrustedHops:
		return fmt.Errorf("forwardauth: trusted hops must be between 0 and %d, got %d", MaxTrustedHops, c.Hops)
	case c.Hops > 0 && len(c.Trusted) > 0:
		return errors.New("forwardauth: set trusted proxies or trusted hops, not both")
	}
	return nil
}

// Resolve returns the client's address of a request from the socket peer
// peer (an address, with or without a port) and the values of the
// forwarding header, one per line received. IPv4-mapped IPv6 addresses
// come back as IPv4. ok is false only when peer itself is no address.
func (c ClientIP) Resolve(peer string, header []string) (client netip.Addr, src Source, ok bool) {
	p, ok := parseHop(peer)
	if !ok {
		return netip.Addr{}, FromPeer, false
	}
	if c.Hops == 0 && !c.trusts(p) {
		return p, FromPeer, true
	}
	var buf [MaxHops]netip.Addr
	hops := c.chain(buf[:0], header)
	if c.Hops > 0 {
		// The peer is the last proxy; the header's last Hops-1 addresses
		// are the others, and the one before them is the client.
		if len(hops) < c.Hops || !hops[c.Hops-1].IsValid() {
			return p, FromPeerFallback, true
		}
		return hops[c.Hops-1], FromHeader, true
	}
	for _, a := range hops {
		if !a.IsValid() {
			return p, FromPeerFallback, true
		}
		if !c.trusts(a) {
			return a, FromHeader, true
		}
	}
	// Every address read is a trusted proxy's: the leftmost stands for the
	// client, as the closest to it that can be believed, unless there are
	// more than MaxHops of them.
	if n := len(hops); n > 0 && n < MaxHops {
		return hops[n-1], FromHeader, true
	}
	return p, FromPeerFallback, true
}

func (c ClientIP) trusts(a netip.Addr) bool {
	for _, p := range c.Trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// chain appends to hops the header's addresses from the right, at most
// MaxHops of them (all the header's lines are one list, in order), an
// invalid netip.Addr standing for each element that is not an address.
// Only the right end is read: whatever a client writes further left costs
// nothing.
func (c ClientIP) chain(hops []netip.Addr, header []string) []netip.Addr {
	for i := len(header) - 1; i >= 0; i-- {
		line := header[i]
		for len(hops) < MaxHops {
			j := strings.LastIndexByte(line, ',')
			elem := line[j+1:]
			var a netip.Addr
			if c.Header == Forwarded {
				a, _ = forwardedFor(elem)
			} else {
				a, _ = parseHop(strings.TrimSpace(elem))
			}
			hops = append(hops, a)
			if j < 0 {
				break
			}
			line = line[:j]
		}
	}
	return hops
}

// parseHop reads one address of a chain: an IP address, optionally with a
// port ("203.0.113.7:41000", "[2001:db8::1]:41000") or in brackets
// ("[2001:db8::1]"), without a zone. IPv4-mapped addresses are unmapped.
func parseHop(s string) (netip.Addr, bool) {
	if s == "" || len(s) > len("[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535") {
		return netip.Addr{}, false
	}
	// Only an IPv4 address with a port (one colon) or a bracketed IPv6
	// one with a port ("]:") can be an address and port: the others are
	// spared a failed parse, which allocates its error.
	if strings.Count(s, ":") == 1 || strings.Contains(s, "]:") {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return unmap(ap.Addr())
		}
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return unmap(a)
}

func unmap(a netip.Addr) (netip.Addr, bool) {
	if a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// forwardedFor reads the for= parameter of one element of a Forwarded
// header (RFC 7239): a token or a quoted string, its node an address with
// an optional port, IPv6 in brackets. An element without for=, with two,
// or whose node is obfuscated or unknown, yields false.
func forwardedFor(elem string) (netip.Addr, bool) {
	var node string
	found := false
	for pair := range strings.SplitSeq(elem, ";") {
		name, value, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(name, "for") {
			continue
		}
		if found {
			return netip.Addr{}, false
		}
		found = true
		node = value
		if strings.HasPrefix(value, `"`) {
			u, err := strconv.Unquote(value)
			if err != nil {
				return netip.Addr{}, false
			}
			node = u
		}
	}
	if !found {
		return netip.Addr{}, false
	}
	return parseHop(node)
}
