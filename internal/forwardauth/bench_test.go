package forwardauth

import (
	"net/netip"
	"testing"
)

// BenchmarkItems measures matching a request against the example's rules
// (one by client, one by header on /api/, one by method and path on
// /login), for a plain path and for one written with escapes.
func BenchmarkItems(b *testing.B) {
	cfg := Config{IPv6Prefix: 64, DenyStatus: 429, Rules: []Rule{
		{Limiter: "per-ip", Key: ByClientIP, Permits: 1},
		{Limiter: "per-api-key", Key: ByHeader, Header: "X-Api-Key", PathPrefix: "/api/", Permits: 1},
		{Limiter: "login", Key: ByClientIP, PathPrefix: "/login", Methods: []string{"POST"}, Permits: 1},
	}}
	for _, path := range []string{"/api/v1/users/42", "/%61pi/v1/users%2F42"} {
		b.Run(path, func(b *testing.B) {
			req := Request{Method: "GET", Path: path, Client: netip.MustParseAddr("203.0.113.7"), Header: header("X-Api-Key", "k1")}
			b.ReportAllocs()
			for b.Loop() {
				if items, err := cfg.Items(req); err != nil || len(items) != 2 {
					b.Fatalf("got %v, %v", items, err)
				}
			}
		})
	}
}
