package forwardauth

import (
	"net/netip"
	"strings"
	"testing"
)

// TestClientIPCannotBeSpoofed holds Resolve to the shapes of the known
// spoofing bugs: a forwarding header believed from any peer
// (go-chi/httprate#53), the leftmost X-Forwarded-For taken for the client
// (ulule/limiter), a hop count that reads the wrong end of the chain
// (envoyproxy/gateway#2252), and headers that are malformed, repeated,
// oversized or of the other kind.
func TestClientIPCannotBeSpoofed(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	trusted := ClientIP{Trusted: proxies}
	long := strings.Repeat("198.51.100.1, ", 10*MaxHops) + "203.0.113.7"
	trustedChain := strings.Repeat("10.0.0.9, ", MaxHops) + "10.0.0.8"
	tests := []struct {
		name   string
		c      ClientIP
		peer   string
		header []string
		want   string
		src    Source
	}{
		{"no proxies: the peer, whatever the header says", ClientIP{}, "203.0.113.5:5000", []string{"1.1.1.1"}, "203.0.113.5", FromPeer},
		{"an untrusted peer's header is ignored (httprate#53)", trusted, "203.0.113.5:5000", []string{"1.1.1.1"}, "203.0.113.5", FromPeer},
		{"the rightmost untrusted address, not the leftmost (ulule/limiter)", trusted, "10.0.0.1:80", []string{"6.6.6.6, 203.0.113.7"}, "203.0.113.7", FromHeader},
		{"past every trusted hop", trusted, "10.0.0.1:80", []string{"6.6.6.6, 203.0.113.7, 10.0.0.2"}, "203.0.113.7", FromHeader},
		{"repeated header lines are one list, in order", trusted, "10.0.0.1:80", []string{"6.6.6.6", "203.0.113.7"}, "203.0.113.7", FromHeader},
		{"a client's trusted-looking address further left is not reached", trusted, "10.0.0.1:80", []string{"10.9.9.9, 203.0.113.7"}, "203.0.113.7", FromHeader},
		{"malformed where the client should be: the peer", trusted, "10.0.0.1:80", []string{"203.0.113.7, garbage"}, "10.0.0.1", FromPeerFallback},
		{"an empty last element: the peer", trusted, "10.0.0.1:80", []string{"203.0.113.7,"}, "10.0.0.1", FromPeerFallback},
		{"no header from a proxy: the peer", trusted, "10.0.0.1:80", nil, "10.0.0.1", FromPeerFallback},
		{"a long header is read from the right only", trusted, "10.0.0.1:80", []string{long}, "203.0.113.7", FromHeader},
		{"MaxHops trusted addresses in a row: the peer", trusted, "10.0.0.1:80", []string{trustedChain}, "10.0.0.1", FromPeerFallback},
		{"a zone: the peer", trusted, "10.0.0.1:80", []string{"fe80::1%eth0"}, "10.0.0.1", FromPeerFallback},
		{"spaces around addresses", trusted, "10.0.0.1:80", []string{" 6.6.6.6 ,\t203.0.113.7 "}, "203.0.113.7", FromHeader},
		{"ports and brackets", trusted, "[fd00::1]:80", []string{"[2001:db8::1]:4711"}, "2001:db8::1", FromHeader},
		{"IPv6 in brackets without a port", trusted, "[fd00::1]:80", []string{"[2001:db8::1]"}, "2001:db8::1", FromHeader},
		{"IPv4 with a port", trusted, "10.0.0.1:80", []string{"203.0.113.7:41000"}, "203.0.113.7", FromHeader},
		{"IPv4-mapped addresses are IPv4, peer included", trusted, "[::ffff:10.0.0.1]:80", []string{"::ffff:203.0.113.7"}, "203.0.113.7", FromHeader},
		{"every hop trusted: the leftmost", trusted, "10.0.0.1:80", []string{"10.0.0.3, 10.0.0.2"}, "10.0.0.3", FromHeader},
		{"hops: the address that many hops left of the peer (gateway#2252)", ClientIP{Hops: 1}, "10.0.0.1:80", []string{"6.6.6.6, 203.0.113.7"}, "203.0.113.7", FromHeader},
		{"hops: two proxies", ClientIP{Hops: 2}, "10.0.0.1:80", []string{"6.6.6.6, 203.0.113.7, 10.0.0.2"}, "203.0.113.7", FromHeader},
		{"hops: fewer addresses than hops", ClientIP{Hops: 3}, "10.0.0.1:80", []string{"203.0.113.7"}, "10.0.0.1", FromPeerFallback},
		{"hops: malformed where the client should be", ClientIP{Hops: 1}, "10.0.0.1:80", []string{"203.0.113.7, x"}, "10.0.0.1", FromPeerFallback},
		{"forwarded: the rightmost for=", ClientIP{Trusted: proxies, Header: Forwarded}, "10.0.0.1:80",
			[]string{`for=6.6.6.6, for="[2001:db8::7]:4711";proto=https`}, "2001:db8::7", FromHeader},
		{"forwarded: case and spaces", ClientIP{Trusted: proxies, Header: Forwarded}, "10.0.0.1:80",
			[]string{`proto=http; For=203.0.113.7 ;by=10.0.0.1`}, "203.0.113.7", FromHeader},
		{"forwarded: unknown", ClientIP{Trusted: proxies, Header: Forwarded}, "10.0.0.1:80", []string{"for=unknown"}, "10.0.0.1", FromPeerFallback},
		{"forwarded: obfuscated", ClientIP{Trusted: proxies, Header: Forwarded}, "10.0.0.1:80", []string{"for=_hidden"}, "10.0.0.1", FromPeerFallback},
		{"forwarded: for= twice in one element", ClientIP{Trusted: proxies, Header: Forwarded}, "10.0.0.1:80",
			[]string{"for=6.6.6.6;for=203.0.113.7"}, "10.0.0.1", FromPeerFallback},
		{"forwarded: an element without for=", ClientIP{Trusted: proxies, Header: Forwarded}, "10.0.0.1:80",
			[]string{"for=203.0.113.7, proto=https"}, "10.0.0.1", FromPeerFallback},
		{"forwarded: a broken quoted string", ClientIP{Trusted: proxies, Header: Forwarded}, "10.0.0.1:80", []string{`for="203.0.113.7`}, "10.0.0.1", FromPeerFallback},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.c.Check(); err != nil {
				t.Fatal(err)
			}
			got, src, ok := tt.c.Resolve(tt.peer, tt.header)
			if !ok || got.String() != tt.want || src != tt.src {
				t.Errorf("Resolve(%q, %q): got %v from %v (ok %v), want %s from %v", tt.peer, tt.header, got, src, ok, tt.want, tt.src)
			}
		})
	}
}

// The header a ClientIP does not read cannot name the client: with
// X-Forwarded-For configured, a Forwarded header the client sent is never
// consulted, since the caller passes only the configured header's values;
// and a peer that is no address is reported.
func TestClientIPPeer(t *testing.T) {
	c := ClientIP{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	for _, peer := range []string{"", "@", "unix:/run/x.sock", "10.0.0.1%eth0:80"} {
		if a, _, ok := c.Resolve(peer, []string{"203.0.113.7"}); ok {
			t.Errorf("Resolve(%q): got %v, want no address", peer, a)
		}
	}
}

func TestClientIPCheck(t *testing.T) {
	p := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, c := range []ClientIP{{Hops: -1}, {Hops: MaxTrustedHops + 1}, {Hops: 1, Trusted: p}, {Header: "x-real-ip"}} {
		if c.Check() == nil {
			t.Errorf("Check(%+v): got nil, want an error", c)
		}
	}
}

// FuzzClientIP: whatever the header, the client is the peer or an address
// the header holds to the right of every untrusted one, and never one
// written left of a malformed element.
func FuzzClientIP(f *testing.F) {
	f.Add("6.6.6.6, 203.0.113.7, 10.0.0.2", false)
	f.Add(`for=6.6.6.6, for="[2001:db8::7]:4711"`, true)
	f.Add("203.0.113.7, garbage", false)
	c := ClientIP{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	f.Fuzz(func(t *testing.T, header string, forwarded bool) {
		c := c
		if forwarded {
			c.Header = Forwarded
		}
		got, src, ok := c.Resolve("10.0.0.1:80", []string{header})
		if !ok {
			t.Fatal("a valid peer reported as none")
		}
		if src != FromHeader {
			if got != netip.MustParseAddr("10.0.0.1") {
				t.Fatalf("fallback to %v, want the peer", got)
			}
			return
		}
		// The answer is the rightmost element that is a valid address not
		// in the trusted range, every element right of it being a valid
		// trusted address.
		elems := strings.Split(header, ",")
		for i := len(elems) - 1; i >= 0; i-- {
			var a netip.Addr
			if forwarded {
				a, _ = forwardedFor(elems[i])
			} else {
				a, _ = parseHop(strings.TrimSpace(elems[i]))
			}
			if !a.IsValid() {
				t.Fatalf("got %v from the header, but element %d (%q) is malformed and lies right of it or is it", got, i, elems[i])
			}
			if !c.trusts(a) || i == 0 {
				if a != got {
					t.Fatalf("got %v, want %v (element %d of %q)", got, a, i, header)
				}
				return
			}
		}
	})
}

// FuzzParseHop holds parseHop to its plain reading: an address and port
// if the string is one, else an address, bracketed or not; parseHop
// tries the first only for strings of its shape.
func FuzzParseHop(f *testing.F) {
	for _, s := range []string{"203.0.113.7", "203.0.113.7:41000", "[2001:db8::1]:41000", "[2001:db8::1]", "2001:db8::1",
		"::ffff:1.2.3.4", "[::ffff:1.2.3.4]:1", "fe80::1%eth0", "[fe80::1%eth0]:80", "1.2.3.4:", "a:b", "[::]:]", ""} {
		f.Add(s)
	}
	plain := func(s string) (netip.Addr, bool) {
		if s == "" || len(s) > len("[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535") {
			return netip.Addr{}, false
		}
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return unmap(ap.Addr())
		}
		a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
		if err != nil || strings.HasPrefix(s, "[") != strings.HasSuffix(s, "]") {
			return netip.Addr{}, false
		}
		return unmap(a)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseHop(s)
		want, wok := plain(s)
		if got != want || ok != wok {
			t.Fatalf("parseHop(%q) = %v, %v; want %v, %v", s, got, ok, want, wok)
		}
	})
}
