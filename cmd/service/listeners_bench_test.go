package main

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ratelimiter/ratelimiter/internal/config"
	"github.com/ratelimiter/ratelimiter/internal/rls"
)

// BenchmarkGRPCBounds measures ShouldRateLimit calls, as
// BenchmarkGRPCRuntime does, with the gRPC server's bounds at their
// defaults (the call limit's tap, fixed windows, 16 KiB buffers) and
// without them (grpc-go's defaults).
//
//	go test -run '^$' -bench GRPCBounds -benchmem -count 6 ./cmd/service
func BenchmarkGRPCBounds(b *testing.B) {
	bounds := grpcBounds(config.Listeners{
		GRPCMaxMessageBytes: 64 << 10, GRPCMaxStreams: 512, GRPCIdleTimeout: 5 * time.Minute,
	}, slog.New(slog.DiscardHandler))
	for _, bc := range []struct {
		name string
		opts []grpc.ServerOption
	}{
		{"grpc-defaults", nil},
		{"bounds", bounds},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var clients []rlsv3.RateLimitServiceClient
			for _, conn := range serveRLS(b, rls.Options{}, 4, bc.opts...) {
				clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
			}
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(25)
			b.RunParallel(func(pb *testing.PB) {
				c := clients[next.Add(1)%int64(len(clients))]
				for pb.Next() {
					resp, err := c.ShouldRateLimit(b.Context(), benchRequest)
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						b.Errorf("%v %v", resp, err)
						return
					}
				}
			})
		})
	}
}
