package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/testcontainers/testcontainers-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// grpcPort is the port the service serves gRPC on in its container.
const grpcPort = "8081/tcp"

// envoyConfigPath is where the tests put the Envoy configuration in the
// container.
const envoyConfigPath = "/etc/envoy-ratelimit.yaml"

// withEnvoyConfig gives a container the Envoy configuration yaml, and
// exposes its gRPC port. The configuration is copied from a file, read
// again for each container the customizers serve.
func withEnvoyConfig(t *testing.T, yaml string) []testcontainers.ContainerCustomizer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return []testcontainers.ContainerCustomizer{
		testcontainers.WithExposedPorts(grpcPort),
		testcontainers.WithEnv(map[string]string{"RATELIMITER_ENVOY_CONFIG": envoyConfigPath}),
		testcontainers.WithFiles(testcontainers.ContainerFile{HostFilePath: path, ContainerFilePath: envoyConfigPath, FileMode: 0o444}),
	}
}

// dialGRPC returns a gRPC connection to the service's gRPC port.
func dialGRPC(t *testing.T, svc *service) *grpc.ClientConn {
	t.Helper()
	ctx := context.Background()
	host, err := svc.ctr.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	port, err := svc.ctr.MappedPort(ctx, grpcPort)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(fmt.Sprintf("%s:%s", host, port.Port()), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func rlsDescriptor(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// The container serves Envoy's rate limit service on its gRPC port by the
// rules of --envoy-config, and gRPC health.
func TestEnvoyRateLimitService(t *testing.T) {
	svc := startService(t, nil, withEnvoyConfig(t, `domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
`)...)
	conn := dialGRPC(t, svc)
	rl := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{rlsDescriptor("remote_address", "203.0.113.7")}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := rl.ShouldRateLimit(t.Context(), req)
		if err != nil || resp.OverallCode != want || len(resp.Statuses) != 1 || resp.Statuses[0].Code != want {
			t.Fatalf("request %d: %v %v, want %v", i, resp, err, want)
		}
	}
	if _, err := rl.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Descriptors: req.Descriptors}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no domain: %v, want INVALID_ARGUMENT", err)
	}
	h, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v %v", h, err)
	}
}

// 2,000 concurrent ShouldRateLimit calls with three descriptors each,
// spread over three replicas on one Redis, admit exactly the smallest of
// the three limits, and charge nothing for the denied ones: the other two
// rules keep what the admitted calls left.
func TestEnvoyAcrossReplicas(t *testing.T) {
	const calls, workers = 2000, 64
	const yaml = `domain: e2e
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 500}
  - key: route
    rate_limit: {unit: year, requests_per_unit: 800, algorithm: sliding_log}
  - key: global
    rate_limit: {unit: year, requests_per_unit: 1000}
`
	_, replicas := sharedRedis(t, 3, map[string]string{"RATELIMITER_REDIS_TIMEOUT": "2s"}, withEnvoyConfig(t, yaml)...)
	clients := make([]rlsv3.RateLimitServiceClient, len(replicas))
	for i, r := range replicas {
		clients[i] = rlsv3.NewRateLimitServiceClient(dialGRPC(t, r))
	}
	descriptors := func(hits uint64) []*commonv3.RateLimitDescriptor {
		ds := []*commonv3.RateLimitDescriptor{rlsDescriptor("user", "u1"), rlsDescriptor("route", "/search"), rlsDescriptor("global", "all")}
		if hits == 0 {
			for _, d := range ds {
				d.HitsAddend = wrapperspb.UInt64(0)
			}
		}
		return ds
	}
	var (
		mu      sync.Mutex
		ok, out int
		errs    []error
		wg      sync.WaitGroup
		next    = make(chan int)
		extra   []string // answers past the limit, for the failure message
	)
	for range workers {
		wg.Go(func() {
			for i := range next {
				resp, err := clients[i%len(clients)].ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: descriptors(1)})
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					ok++
					if ok > 500 && len(extra) < 3 {
						extra = append(extra, fmt.Sprintf("replica %d: %v", i%len(clients), resp))
					}
				default:
					out++
				}
				mu.Unlock()
			}
		})
	}
	for i := range calls {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d calls failed, the first: %v", len(errs), errs[0])
	}
	if ok != 500 || out != calls-500 {
		t.Errorf("admitted %d and denied %d of %d, want exactly 500 admitted; past the limit: %v", ok, out, calls, extra)
		for i, r := range replicas {
			_, stderr, _ := r.logs(context.Background())
			t.Logf("replica %d's log:\n%s", i, stderr)
		}
	}
	resp, err := clients[0].ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: descriptors(0)})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint32{0, 300, 500} {
		if got := resp.Statuses[i].LimitRemaining; got != want {
			t.Errorf("descriptor %d: %d left, want %d (denied calls must charge nothing)", i, got, want)
		}
	}
}
