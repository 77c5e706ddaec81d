package main

import (
	"net"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimiter/ratelimiter/internal/heapfloor"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	"github.com/ratelimiter/ratelimiter/internal/rls"
)

// BenchmarkGRPCTelemetry measures one ShouldRateLimit call over a loopback
// connection, client and server in the process, with the server's
// telemetry as the service sets it up: none when tracing is off (the
// default), its tracing interceptor when it is on, here with every call
// sampled and with 1% sampled.
//
//	go test -run '^$' -bench GRPCTelemetry -benchmem -count 6 ./cmd/service
func BenchmarkGRPCTelemetry(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	for _, bc := range []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"tracing-off", tracenoop.NewTracerProvider()},
		{"tracing-1pct", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))))},
		{"tracing-all", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := rlsv3.NewRateLimitServiceClient(serveRLS(b, rls.Options{MeterProvider: mp}, 1, grpcTelemetry(bc.tp)...)[0])
			b.ReportAllocs()
			for b.Loop() {
				resp, err := c.ShouldRateLimit(b.Context(), benchRequest)
				if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					b.Fatalf("%v %v", resp, err)
				}
			}
		})
	}
}

// benchRequest is what the benchmarks call ShouldRateLimit with: one
// descriptor of a rule that no run reaches.
var benchRequest = &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{
	{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}},
}}

// serveRLS serves the rate limit service, with the rule of benchRequest
// on the memory backend and opts, on a loopback port until b ends, and
// returns conns connections to it.
func serveRLS(b testing.TB, o rls.Options, conns int, opts ...grpc.ServerOption) []*grpc.ClientConn {
	b.Helper()
	cfg, err := rls.Parse("bench.yaml", []byte("domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"))
	if err != nil {
		b.Fatal(err)
	}
	l := limiter.NewService(memory.New(nil, 0))
	if err := rls.Apply(b.Context(), l, cfg); err != nil {
		b.Fatal(err)
	}
	svc, err := rls.NewService(l, cfg, o)
	if err != nil {
		b.Fatal(err)
	}
	srv := newGRPCServer(b.Context(), svc, func() bool { return true }, opts...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(srv.Stop)
	cs := make([]*grpc.ClientConn, conns)
	for i := range cs {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		cs[i] = conn
	}
	return cs
}

// BenchmarkGRPCRuntime measures ShouldRateLimit calls from 25 goroutines
// per processor over 4 loopback connections, client and server in the
// process, on the memory backend, with the server as the service runs it
// ("service": calls on its stream workers, the heap floor of
// --gc-min-heap at its default), with a goroutine per call (grpc-go's
// default, which grows a new stack for each call), and without the heap
// floor (Go's own pacing, GOGC=100, which collects tens of times a second
// here and shrinks the idle workers' stacks at each collection).
//
//	for i in $(seq 8); do go test -run '^$' -bench GRPCRuntime -benchmem -benchtime 2s ./cmd/service; done
func BenchmarkGRPCRuntime(b *testing.B) {
	for _, bc := range []struct {
		name  string
		opts  []grpc.ServerOption
		floor bool
	}{
		{"service", nil, true},
		{"goroutine-per-call", []grpc.ServerOption{grpc.NumStreamWorkers(0)}, true},
		{"no-heap-floor", nil, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.floor {
				defer heapfloor.Start(heapfloor.Default)()
			}
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
