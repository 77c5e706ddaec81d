package e2e

import (
	"context"
	"errors"
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
// spread over three replicas on one Redis, admit exactly the limit of each
// rule, and charge nothing for the denied ones. The calls come in three
// groups, each with a key of its own for each rule, and each group drives
// a different rule past its limit: group 1 its user (300 per year, 400
// calls), group 2 its route (500, 600 calls; a sliding log), group 3 its
// global key (700, 1,000 calls); in each group the other two rules have
// room for every call, or count each call under a key of its own. All
// 2,000 calls are in flight at once.
func TestEnvoyAcrossReplicas(t *testing.T) {
	const yaml = `domain: e2e
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 300}
  - key: route
    rate_limit: {unit: year, requests_per_unit: 500, algorithm: sliding_log}
  - key: global
    rate_limit: {unit: year, requests_per_unit: 700}
`
	groups := []struct {
		calls int
		// the values of the call's user, route and global descriptors;
		// "" for one of its own
		user, route, global string
		admits              int
	}{
		{400, "u1", "/r1", "g1", 300},
		{600, "", "/r2", "g2", 500},
		{1000, "", "", "g3", 700},
	}
	_, replicas := sharedRedis(t, 3, map[string]string{"RATELIMITER_REDIS_TIMEOUT": "5s"}, withEnvoyConfig(t, yaml)...)
	clients := make([]rlsv3.RateLimitServiceClient, len(replicas))
	for i, r := range replicas {
		clients[i] = rlsv3.NewRateLimitServiceClient(dialGRPC(t, r))
	}
	valueOr := func(v string, own string) string {
		if v == "" {
			return own
		}
		return v
	}
	type call struct{ group, replica int }
	var calls []call
	var reqs []*rlsv3.RateLimitRequest
	for g, grp := range groups {
		for i := range grp.calls {
			own := fmt.Sprintf("g%d-%d", g+1, i)
			reqs = append(reqs, &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*commonv3.RateLimitDescriptor{
				rlsDescriptor("user", valueOr(grp.user, own)), rlsDescriptor("route", valueOr(grp.route, own)), rlsDescriptor("global", valueOr(grp.global, own)),
			}})
			calls = append(calls, call{g, len(calls) % len(clients)})
		}
	}
	if len(calls) != 2000 {
		t.Fatalf("%d calls, want 2000", len(calls))
	}

	codes := make([]rlsv3.RateLimitResponse_Code, len(calls))
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, c := range calls {
		wg.Go(func() {
			<-start
			resp, err := clients[c.replica].ShouldRateLimit(context.Background(), reqs[i])
			errs[i] = err
			if err == nil {
				codes[i] = resp.OverallCode
			}
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("calls failed: %v", err)
	}
	admitted := make([]int, len(groups))
	for i, c := range calls {
		switch codes[i] {
		case rlsv3.RateLimitResponse_OK:
			admitted[c.group]++
		case rlsv3.RateLimitResponse_OVER_LIMIT:
		default:
			t.Fatalf("call %d: %v", i, codes[i])
		}
	}
	for g, grp := range groups {
		if admitted[g] != grp.admits {
			t.Errorf("group %d: admitted %d of %d calls, want exactly %d", g+1, admitted[g], grp.calls, grp.admits)
		}
	}
	if t.Failed() {
		for i, r := range replicas {
			_, stderr, _ := r.logs(context.Background())
			t.Logf("replica %d's log:\n%s", i, stderr)
		}
	}

	// What each group's shared keys have left: their limit less the
	// admitted calls, nothing for the denied ones.
	limits := []uint32{300, 500, 700}
	for g, grp := range groups {
		check := &rlsv3.RateLimitRequest{Domain: "e2e"}
		var want []uint32
		for r, v := range []string{grp.user, grp.route, grp.global} {
			if v == "" {
				continue
			}
			d := rlsDescriptor([]string{"user", "route", "global"}[r], v)
			d.HitsAddend = wrapperspb.UInt64(0)
			check.Descriptors = append(check.Descriptors, d)
			want = append(want, limits[r]-uint32(admitted[g]))
		}
		resp, err := clients[g%len(clients)].ShouldRateLimit(t.Context(), check)
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range want {
			if got := resp.Statuses[i].LimitRemaining; got != w {
				t.Errorf("group %d, descriptor %v: %d left, want %d (denied calls must charge nothing)", g+1, check.Descriptors[i].Entries, got, w)
			}
		}
	}
}
