package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimiter/ratelimiter/internal/redistest"
	"github.com/ratelimiter/ratelimiter/internal/rls"
)

// envoyConfig writes an envoyproxy/ratelimit configuration file.
func envoyConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// dial returns a gRPC connection to the service whose logs are l.
func dial(t *testing.T, l *logs) *grpc.ClientConn {
	t.Helper()
	var addr string
	select {
	case addr = <-l.grpc:
	case <-time.After(30 * time.Second):
		t.Fatal("the service did not log a gRPC address")
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The service answers Envoy's rate limit protocol, gRPC health and
// reflection on its gRPC port, by the rules of --envoy-config; its health
// turns NOT_SERVING when the shutdown begins.
func TestGRPC(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	cfg := envoyConfig(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	base, stderr, done, cancel := start(t, []string{"--listen", "127.0.0.1:0", "--envoy-config", cfg}, map[string]string{"RATELIMITER_SHUTDOWN_DELAY": "1s"})
	conn := dial(t, stderr)

	rl := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}},
	}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := rl.ShouldRateLimit(t.Context(), req)
		if err != nil || resp.OverallCode != want {
			t.Fatalf("request %d: %v %v, want %v", i, resp, err, want)
		}
	}

	// The rule's hits are on /metrics, by result.
	m := scrape(t, base+"/metrics")
	if m[`ratelimiter_envoy_hits_total{result="within_limit"}`]+m[`ratelimiter_envoy_hits_total{result="near_limit"}`] != 2 || m[`ratelimiter_envoy_hits_total{result="over_limit"}`] != 1 {
		t.Errorf("hits on /metrics: %v", m)
	}
	// The rule is a keyed limiter of the service, listed by the HTTP API.
	if body := get(t, base+"/v1/limiters", http.StatusOK); !strings.Contains(body, `"name":"envoy.web.user.`) {
		t.Errorf("GET /v1/limiters: %s", body)
	}

	health := healthpb.NewHealthClient(conn)
	for _, service := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v %v, want SERVING", service, resp, err)
		}
	}

	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	listed, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, s := range listed.GetListServicesResponse().GetService() {
		services = append(services, s.Name)
	}
	if !slices.Contains(services, "envoy.service.ratelimit.v3.RateLimitService") || !slices.Contains(services, "grpc.health.v1.Health") {
		t.Errorf("reflection lists %v", services)
	}
	stream.CloseSend()

	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{})
		if err == nil && resp.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health during the shutdown delay: %v %v, want NOT_SERVING", resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitRun(t, done)
}

// On Redis the rules' limiters are created once Redis answers, and
// replicas decide together.
func TestGRPCOnRedis(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	addr := redistest.Standalone(t)
	cfg := envoyConfig(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	env := map[string]string{"RATELIMITER_BACKEND": "redis", "RATELIMITER_REDIS_ADDRS": addr, "RATELIMITER_REDIS_TIMEOUT": "2s", "RATELIMITER_ENVOY_CONFIG": cfg}
	var clients []rlsv3.RateLimitServiceClient
	for range 2 {
		_, stderr, _, _ := start(t, []string{"--listen", "127.0.0.1:0"}, env)
		clients = append(clients, rlsv3.NewRateLimitServiceClient(dial(t, stderr)))
	}
	req := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "bob"}}},
	}}
	var codes []rlsv3.RateLimitResponse_Code
	deadline := time.Now().Add(30 * time.Second)
	for len(codes) < 5 {
		resp, err := clients[len(codes)%2].ShouldRateLimit(t.Context(), req)
		if err != nil {
			// UNAVAILABLE until the replica reaches Redis.
			if time.Now().After(deadline) {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		codes = append(codes, resp.OverallCode)
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	if want := []rlsv3.RateLimitResponse_Code{ok, ok, ok, over, over}; !slices.Equal(codes, want) {
		t.Errorf("two replicas: %v, want %v", codes, want)
	}
}

// The Envoy configuration is reloaded when its file changes and on
// SIGHUP; a broken file is logged with its line and leaves the previous
// configuration in force.
func TestGRPCReload(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	dir := t.TempDir()
	path := filepath.Join(dir, "envoy.yaml")
	write := func(yaml string) {
		t.Helper()
		// Written aside and renamed, as a ConfigMap volume swaps its files.
		tmp := filepath.Join(dir, "next")
		if err := os.WriteFile(tmp, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(userRule(2))
	_, stderr, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--envoy-config", dir}, nil)
	rl := rlsv3.NewRateLimitServiceClient(dial(t, stderr))
	ask := func(ctx context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return rl.ShouldRateLimit(ctx, r)
	}
	waitLimit := func(want uint32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for limitOf(t, ask) != want {
			if time.Now().After(deadline) {
				t.Fatalf("limit %d, want %d after a reload", limitOf(t, ask), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if got := limitOf(t, ask); got != 2 {
		t.Fatalf("limit %d, want 2", got)
	}
	write(userRule(5))
	waitLimit(5)

	write("domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 9}\n")
	deadline := time.Now().Add(10 * time.Second)
	for !slices.ContainsFunc(stderr.snapshot(), func(rec map[string]any) bool {
		return rec["msg"] == "envoy configuration not reloaded; the previous one stays in force" && strings.Contains(fmt.Sprint(rec["error"]), path+":4")
	}) {
		if time.Now().After(deadline) {
			t.Fatalf("no error naming %s:4 logged; messages: %v", path, stderr.messages())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := limitOf(t, ask); got != 5 {
		t.Errorf("after a broken file: limit %d, want 5 still", got)
	}

	// SIGHUP reloads at once, even files that did not change, which the
	// watcher leaves alone: one more reload is logged after the signal.
	write(userRule(7))
	waitLimit(7)
	reloads := func() int {
		n := 0
		for _, rec := range stderr.snapshot() {
			if rec["msg"] == "envoy configuration reloaded" {
				n++
			}
		}
		return n
	}
	before := reloads()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for !slices.ContainsFunc(stderr.snapshot(), func(rec map[string]any) bool { return rec["reason"] == "SIGHUP" }) || reloads() == before {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP: no reload logged; messages: %v", stderr.messages())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The watcher, checking every second, finds nothing to reload.
	time.Sleep(2 * reloadInterval)
	if n := reloads(); n != before+1 {
		t.Errorf("%d reloads after one SIGHUP of unchanged files, want 1", n-before)
	}
}

// With tracing on, a ShouldRateLimit call leaves a server span, a child
// of the trace its caller propagated, with OpenTelemetry's RPC attributes;
// a refused request is no error of the server's; a call its caller did
// not sample, a health check and a call of an unknown method leave none.
func TestGRPCTracing(t *testing.T) {
	// The propagator the service sets (see internal/telemetry).
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	conn := serveRLS(t, rls.Options{MeterProvider: mp}, 1, grpcTelemetry(tp)...)[0]
	rl := rlsv3.NewRateLimitServiceClient(conn)

	traceID, parentID := "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	// An unsampled caller leaves no span (the sampler follows the parent).
	unsampled := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+traceID+"-"+parentID+"-00")
	if _, err := rl.ShouldRateLimit(unsampled, benchRequest); err != nil {
		t.Fatal(err)
	}
	resp, err := rl.ShouldRateLimit(ctx, benchRequest)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v %v", resp, err)
	}
	if _, err := rl.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: benchRequest.Descriptors}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no domain: %v, want INVALID_ARGUMENT", err)
	}
	// A method the server does not have leaves none: the names of spans
	// are the server's own.
	if err := conn.Invoke(ctx, "/no.such.Service/Method", benchRequest, new(rlsv3.RateLimitResponse)); status.Code(err) != codes.Unimplemented {
		t.Fatalf("an unknown method: %v, want UNIMPLEMENTED", err)
	}

	// A server span ends as its call ends, after the answer is sent.
	deadline := time.Now().Add(5 * time.Second)
	for len(rec.Ended()) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // for any span that should not be there
	spans := rec.Ended()
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	const name = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	if !slices.Equal(names, []string{name, name}) {
		t.Fatalf("spans %v, want those of the two sampled ShouldRateLimit calls", names)
	}
	for i, want := range []string{"OK", "INVALID_ARGUMENT"} {
		s := spans[i]
		if s.SpanKind() != trace.SpanKindServer {
			t.Errorf("span %d: kind %v, want server", i, s.SpanKind())
		}
		if got := s.SpanContext().TraceID().String(); got != traceID {
			t.Errorf("span %d: trace %s, want the caller's %s", i, got, traceID)
		}
		if got := s.Parent(); got.SpanID().String() != parentID || !got.IsRemote() {
			t.Errorf("span %d: parent %s (remote %v), want the caller's %s", i, got.SpanID(), got.IsRemote(), parentID)
		}
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		wantAttrs := map[string]string{"rpc.system.name": "grpc", "rpc.method": name, "rpc.response.status_code": want}
		if !maps.Equal(attrs, wantAttrs) {
			t.Errorf("span %d: attributes %v, want %v", i, attrs, wantAttrs)
		}
		if s.Status().Code != otelcodes.Unset {
			t.Errorf("span %d: status %v, want unset (no fault of the server's)", i, s.Status())
		}
	}
}
