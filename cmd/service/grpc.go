package main

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	otelcodes "go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/ratelimiter/ratelimiter/internal/auth"
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

// grpcTelemetry is the server option that traces gRPC calls when tracing
// is on: each unary call gets a server span named after its method, a
// child of the W3C trace context its caller sent, as the HTTP API's
// requests do; health checks get none, as the HTTP probes get none. With
// tracing off it is none. It is written here rather than taken from
// otelgrpc, whose stats handler also measures every call, and it is an
// interceptor rather than a stats handler, for which grpc-go builds an
// event at each stage of every call: with 1% of calls sampled, otelgrpc's
// handler added 5.4 µs to a call, one of the service's own 3.8 µs, and
// this 1.9 µs (see BenchmarkGRPCTelemetry and docs/performance.md).
func grpcTelemetry(tp trace.TracerProvider) []grpc.ServerOption {
	if _, off := tp.(tracenoop.TracerProvider); off {
		return nil
	}
	tracer := tp.Tracer(tracerScope)
	var methods sync.Map // full method name → *tracedMethod
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, "/grpc.health.v1.Health/") {
			return handler(ctx, req)
		}
		m, ok := methods.Load(info.FullMethod)
		if !ok {
			m, _ = methods.LoadOrStore(info.FullMethod, newTracedMethod(info.FullMethod))
		}
		tm := m.(*tracedMethod)
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			ctx = otel.GetTextMapPropagator().Extract(ctx, metadataCarrier(md))
		}
		ctx, span := tracer.Start(ctx, tm.name, tm.opts...)
		resp, err := handler(ctx, req)
		if span.IsRecording() {
			code := status.Code(err)
			span.SetAttributes(semconv.RPCResponseStatusCode(rpccode.Code(code).String()))
			if serverFault(code) {
				span.SetStatus(otelcodes.Error, code.String())
			}
		}
		span.End()
		return resp, err
	})}
}

// tracerScope names the tracer of the gRPC server's spans.
const tracerScope = "github.com/ratelimiter/ratelimiter/cmd/service/grpc"

// tracedMethod is the name and start options of one method's spans, made
// once per method rather than at every call.
type tracedMethod struct {
	name string
	opts []trace.SpanStartOption
}

// newTracedMethod returns the span name and options of the method named
// fullMethod ("/package.Service/Method"), with OpenTelemetry's RPC
// attributes. Only the server's own methods get this far: grpc-go answers
// a call of any other with UNIMPLEMENTED before the interceptor.
func newTracedMethod(fullMethod string) *tracedMethod {
	name := strings.TrimPrefix(fullMethod, "/")
	return &tracedMethod{name: name, opts: []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.RPCSystemNameGRPC, semconv.RPCMethod(name)),
	}}
}

// serverFault reports whether a call that ended with code failed on the
// server's side, which OpenTelemetry's conventions mark as an error on a
// server span; a refusal of the caller's request (INVALID_ARGUMENT,
// RESOURCE_EXHAUSTED, ...) is not one.
func serverFault(code codes.Code) bool {
	switch code {
	case codes.Unknown, codes.DeadlineExceeded, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// metadataCarrier reads and writes a W3C trace context in gRPC metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// grpcAuth is the server option that checks the bearer token of each
// unary call of a method that requires a scope (auth.Required): Envoy's
// ShouldRateLimit. The token comes in the "authorization" metadata, as
// "Bearer <token>" (Envoy's grpc_service initial_metadata sends it), and
// the decision is guard's, the same the HTTP API takes: a call without a
// token, or with an unknown one, ends UNAUTHENTICATED, one whose token
// lacks the scope PERMISSION_DENIED, before the handler takes anything.
// Health checking and reflection require no scope, and are streams or
// methods the table leaves out, so probes keep working.
func grpcAuth(guard *auth.Guard) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		need, ok := auth.Required(info.FullMethod)
		if !ok {
			return handler(ctx, req)
		}
		var header string
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if v := md.Get("authorization"); len(v) > 0 {
				header = v[0]
			}
		}
		if err := guard.Check(header, need); err != nil {
			return nil, authStatus(err)
		}
		return handler(ctx, req)
	})
}

// authStatus is the gRPC status of a refusal of guard.Check: its text is
// written for the client and quotes no token.
func authStatus(err error) error {
	var e *auth.Error
	if !errors.As(err, &e) {
		return status.Error(codes.Internal, "the call could not be authorized")
	}
	code := codes.Unauthenticated
	if e.Code == auth.Forbidden {
		code = codes.PermissionDenied
	}
	return status.Error(code, e.Error())
}
