package main

import (
	"context"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/ratelimiter/ratelimiter/internal/rls"
)

// healthInterval is how often the gRPC health service reads the
// service's readiness.
const healthInterval = time.Second

// newGRPCServer returns the gRPC server of the service: Envoy's rate limit
// service, gRPC health checking and server reflection. Until ctx is done
// its health follows ready, as /readyz does, for the whole server ("") and
// for the rate limit service by name; then it reports NOT_SERVING.
func newGRPCServer(ctx context.Context, svc *rls.Service, ready func() bool) *grpc.Server {
	srv := grpc.NewServer()
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
