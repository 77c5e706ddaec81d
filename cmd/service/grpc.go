package main

import (
	"context"
	"runtime"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"

	"github.com/ratelimiter/ratelimiter/internal/rls"
)

// healthInterval is how often the gRPC health service reads the
// service's readiness.
const healthInterval = time.Second

// streamWorkers is how many goroutines serve the gRPC server's calls, each
// one call after another, per processor (GOMAXPROCS): enough for the calls
// in flight while others wait on Redis. A call that finds them all busy
// gets a goroutine of its own, as every call would without them. A new
// goroutine starts with a small stack and grows it, copying it each time,
// on its way down to a decision: on the Redis backend that was 1.4 growths
// and 14% of the service's CPU per call, which a worker grows once and
// keeps (see docs/performance.md, "Garbage collection and stacks").
const streamWorkers = 32

// newGRPCServer returns the gRPC server of the service, with opts: Envoy's
// rate limit service, gRPC health checking and server reflection. Until ctx is done
// its health follows ready, as /readyz does, for the whole server ("") and
// for the rate limit service by name; then it reports NOT_SERVING.
func newGRPCServer(ctx context.Context, svc *rls.Service, ready func() bool, opts ...grpc.ServerOption) *grpc.Server {
	workers := grpc.NumStreamWorkers(uint32(streamWorkers * runtime.GOMAXPROCS(0)))
	srv := grpc.NewServer(append([]grpc.ServerOption{workers}, opts...)...)
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	h := health.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	reflection.Register(srv)
	set := func() {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ready() {
			st = healthpb.HealthCheckResponse_SERVING
		}
		h.SetServingStatus("", st)
		h.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
	}
	set()
	go func() {
		t := time.NewTicker(healthInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				h.Shutdown()
				return
			case <-t.C:
				set()
			}
		}
	}()
	return srv
}

// stopGRPC stops srv gracefully, letting in-flight calls finish, until ctx
// is done; then it stops it at once. It reports whether the calls
// finished.
func stopGRPC(ctx context.Context, srv *grpc.Server) bool {
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
		return true
	case <-ctx.Done():
		srv.Stop()
		<-stopped
		return false
	}
}

// grpcTelemetry is the server option that traces and measures gRPC calls
// (otelgrpc's stats handler) when tracing is on; with tracing off it is
// none, and a call costs no telemetry beyond the rate limit service's own
// metrics (see BenchmarkGRPCTelemetry).
func grpcTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) []grpc.ServerOption {
	if _, off := tp.(tracenoop.TracerProvider); off {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(tp), otelgrpc.WithMeterProvider(mp),
		otelgrpc.WithPropagators(otel.GetTextMapPropagator()),
		// Health checks would drown the traces, as the HTTP probes would.
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
			return !strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.Health/")
		}),
	))}
}
