package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// redisAlias is the Redis container's name on the test's network.
const redisAlias = "redis"

// sharedRedis starts a Redis container and n service replicas using it on a
// network of their own, all terminated when t ends; opts customize the
// replicas' containers.
func sharedRedis(t *testing.T, n int, env map[string]string, opts ...testcontainers.ContainerCustomizer) (*testcontainers.DockerContainer, []*service) {
	t.Helper()
	requireDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := redistest.EnsureImage(ctx); err != nil {
		t.Fatalf("redis image: %v", err)
	}
	nw, err := network.New(ctx)
	if err != nil {
		t.Fatalf("network: %v", err)
	}
	testcontainers.CleanupNetwork(t, nw)
	redis, err := testcontainers.Run(ctx, redistest.Image,
		// Saving on shutdown, as a production Redis does, so that the
		// outage test's restart keeps the limiters.
		testcontainers.WithCmd("--bind", "0.0.0.0", "--protected-mode", "no", "--dir", "/", "--save", "3600 1"),
		network.WithNetwork([]string{redisAlias}, nw),
		testcontainers.WithWaitStrategy(wait.ForLog("Ready to accept connections")),
	)
	testcontainers.CleanupContainer(t, redis)
	if err != nil {
		t.Fatalf("start redis: %v", err)
	}
	all := map[string]string{
		"RATELIMITER_BACKEND":     "redis",
		"RATELIMITER_REDIS_ADDRS": redisAlias + ":6379",
	}
	for k, v := range env {
		all[k] = v
	}
	replicas := make([]*service, n)
	for i := range replicas {
		replicas[i] = startService(t, all, append([]testcontainers.ContainerCustomizer{network.WithNetwork(nil, nw)}, opts...)...)
	}
	return redis, replicas
}

// Three replicas on one Redis admit exactly the limit, however the
// acquisitions spread over them, and agree on the lowest-capacity tenants.
func TestReplicasShareRedis(t *testing.T) {
	// Exactness is the point here, not the timeout: the other tests of the
	// suite run beside this one on the same cores, and a decision that
	// waits past the default 50 ms is denied as degraded, by design (the
	// outage test covers that). A generous timeout keeps every decision
	// Redis's own.
	_, replicas := sharedRedis(t, 3, map[string]string{"RATELIMITER_REDIS_TIMEOUT": "2s"})
	ctx := t.Context()
	put(t, replicas[0].api, "upstream", client.LimiterSpec{Limit: 100, Period: "1h"})

	const requests = 2000
	var (
		next                      atomic.Int64
		allowed, denied, degraded atomic.Int64
		mu                        sync.Mutex
		failures                  []string
		wg                        sync.WaitGroup
		one                       = int64(1)
		perReplica                [3]atomic.Int64
	)
	for w := range 48 {
		wg.Go(func() {
			api := replicas[w%len(replicas)].api
			for next.Add(1) <= requests {
				res, err := api.AcquireWithResponse(ctx, "upstream", client.AcquireRequest{Permits: &one})
				switch {
				case err != nil:
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
				case res.JSON200 == nil:
					mu.Lock()
					failures = append(failures, res.Status()+" "+string(res.Body))
					mu.Unlock()
				case res.JSON200.Degraded != nil:
					degraded.Add(1)
				case res.JSON200.Allowed:
					allowed.Add(1)
					perReplica[w%len(replicas)].Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d acquisitions failed, first: %s", len(failures), failures[0])
	}
	if got := allowed.Load(); got != 100 {
		t.Errorf("admitted %d of %d concurrent acquisitions through 3 replicas, want exactly the limit, 100", got, requests)
	}
	if got := denied.Load(); got != requests-100 {
		t.Errorf("denied %d, want %d", got, requests-100)
	}
	if got := degraded.Load(); got != 0 {
		t.Errorf("%d decisions were degraded with Redis up", got)
	}
	t.Logf("admitted %d of %d (per replica %d, %d, %d)", allowed.Load(), requests,
		perReplica[0].Load(), perReplica[1].Load(), perReplica[2].Load())
	for i, r := range replicas {
		res, err := r.api.GetAvailableWithResponse(ctx, "upstream", nil)
		if err != nil || res.JSON200 == nil || res.JSON200.Remaining != 0 {
			t.Errorf("replica %d: available = %v %v, want 0 remaining", i, res, err)
		}
	}

	// Batches spread over the replicas are exact too: 24 concurrent batches
	// of 25 acquisitions (600) against a limit of 100.
	put(t, replicas[0].api, "upstream-batch", client.LimiterSpec{Limit: 100, Period: "1h"})
	items := make([]client.BatchAcquisition, 25)
	for i := range items {
		items[i].Limiter = "upstream-batch"
	}
	var batchAllowed atomic.Int64
	for w := range 24 {
		wg.Go(func() {
			res, err := replicas[w%len(replicas)].api.AcquireBatchWithResponse(ctx, client.BatchAcquireRequest{Acquisitions: items})
			if err != nil || res.JSON200 == nil {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("batch: %v %v", res, err))
				mu.Unlock()
				return
			}
			for _, r := range res.JSON200.Results {
				switch {
				case r.Decision == nil || r.Decision.Degraded != nil:
					mu.Lock()
					failures = append(failures, fmt.Sprintf("batch result %+v, want Redis's decision", r))
					mu.Unlock()
				case r.Decision.Allowed:
					batchAllowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d batch failures, first: %s", len(failures), failures[0])
	}
	if got := batchAllowed.Load(); got != 100 {
		t.Errorf("24 concurrent batches of 25 through 3 replicas admitted %d, want exactly the limit, 100", got)
	}

	// Tenant i takes i permits, each through a different replica.
	for i := 1; i <= 12; i++ {
		permits := int64(i)
		ip := fmt.Sprintf("198.51.100.%d", i)
		res, err := replicas[i%3].api.AcquireTenantWithResponse(ctx, ip, client.AcquireTenantJSONRequestBody{Permits: &permits})
		if err != nil || res.JSON200 == nil || !res.JSON200.Allowed {
			t.Fatalf("acquire %d for %s: %v %v", permits, ip, res, err)
		}
	}
	k := int32(5)
	var answers [][]string
	for i, r := range replicas {
		res, err := r.api.ListLowestTenantsWithResponse(ctx, &client.ListLowestTenantsParams{K: &k})
		if err != nil || res.JSON200 == nil {
			t.Fatalf("replica %d: lowest: %v %v", i, res, err)
		}
		var got []string
		for _, e := range res.JSON200.Items {
			got = append(got, fmt.Sprintf("%s:%d", e.Tenant, e.Remaining))
		}
		answers = append(answers, got)
	}
	policy, err := replicas[0].api.GetTenantPolicyWithResponse(ctx)
	if err != nil || policy.JSON200 == nil {
		t.Fatalf("policy: %v %v", policy, err)
	}
	var want []string
	for i := 12; i > 7; i-- {
		want = append(want, fmt.Sprintf("198.51.100.%d:%d", i, policy.JSON200.Limit-int64(i)))
	}
	for i, got := range answers {
		if !slices.Equal(got, want) {
			t.Errorf("replica %d: lowest 5 = %v, want %v", i, got, want)
		}
	}
}

// Redis stops during a load run: answers follow fail-closed within the
// timeout, never a 5xx, and the replica neither leaks goroutines nor grows
// its heap; when Redis is back, decisions are normal again at once.
func TestRedisOutage(t *testing.T) {
	redis, replicas := sharedRedis(t, 1, map[string]string{"RATELIMITER_REDIS_TIMEOUT": "50ms"})
	svc := replicas[0]
	ctx := t.Context()
	put(t, svc.api, "upstream", client.LimiterSpec{Limit: 1_000_000_000, Period: "1h"})

	// load acquires from 16 workers until stop is closed, counting answers.
	type tally struct {
		allowed, deniedDegraded, otherDegraded, errors, status5xx atomic.Int64
		slowest                                                   atomic.Int64 // nanoseconds
	}
	load := func(stop <-chan struct{}) *tally {
		var tl tally
		var wg sync.WaitGroup
		one := int64(1)
		for range 16 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					res, err := svc.api.AcquireWithResponse(ctx, "upstream", client.AcquireRequest{Permits: &one})
					if d := int64(time.Since(start)); d > tl.slowest.Load() {
						tl.slowest.Store(d)
					}
					switch {
					case err != nil:
						tl.errors.Add(1)
					case res.StatusCode() >= 500:
						tl.status5xx.Add(1)
					case res.JSON200 != nil && res.JSON200.Degraded != nil && !res.JSON200.Allowed:
						tl.deniedDegraded.Add(1)
					case res.JSON200 != nil && res.JSON200.Degraded != nil:
						tl.otherDegraded.Add(1)
					case res.JSON200 != nil && res.JSON200.Allowed:
						tl.allowed.Add(1)
					}
				}
			})
		}
		t.Cleanup(wg.Wait)
		return &tl
	}

	before := scrapeRuntime(t, svc)
	stop := make(chan struct{})
	healthy := load(stop)
	time.Sleep(time.Second)
	timeout := 10 * time.Second
	if err := redis.Stop(ctx, &timeout); err != nil {
		t.Fatalf("stop redis: %v", err)
	}
	close(stop)
	stop = make(chan struct{})
	outage := load(stop)
	time.Sleep(3 * time.Second)
	close(stop)
	time.Sleep(100 * time.Millisecond)

	if healthy.allowed.Load() == 0 {
		t.Errorf("no grant before the outage")
	}
	if n := outage.status5xx.Load() + healthy.status5xx.Load(); n != 0 {
		t.Errorf("%d answers were 5xx, want none", n)
	}
	if n := outage.errors.Load(); n != 0 {
		t.Errorf("%d requests failed during the outage, want every one answered", n)
	}
	if outage.deniedDegraded.Load() == 0 || outage.otherDegraded.Load() != 0 {
		t.Errorf("during the outage: %d degraded denials and %d other degraded answers; want fail-closed denials only",
			outage.deniedDegraded.Load(), outage.otherDegraded.Load())
	}
	// A generous bound: the point is no seconds-long stall, as a client
	// without its own deadline would show.
	if slowest := time.Duration(outage.slowest.Load()); slowest > 2*time.Second {
		t.Errorf("slowest answer during the outage took %s, want well under a second with a 50ms Redis timeout", slowest)
	}
	t.Logf("outage: %d degraded denials in 3s, slowest answer %s", outage.deniedDegraded.Load(), time.Duration(outage.slowest.Load()))

	if err := redis.Start(ctx); err != nil {
		t.Fatalf("restart redis: %v", err)
	}
	back := time.Now()
	one := int64(1)
	for {
		res, err := svc.api.AcquireWithResponse(ctx, "upstream", client.AcquireRequest{Permits: &one})
		if err == nil && res.JSON200 != nil && res.JSON200.Degraded == nil && res.JSON200.Allowed {
			break
		}
		if time.Since(back) > 30*time.Second {
			t.Fatalf("decisions still degraded 30s after Redis restarted: %v %v", res, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("normal decisions again %s after Redis accepted connections", time.Since(back).Round(time.Millisecond))

	// Goroutines started during the outage end on their own, some only
	// later: the Go resolver's lookups of the Redis host, which Docker's DNS
	// no longer answers for a stopped container, run to the resolver's
	// timeout whoever gave up waiting for them. A leak is goroutines that
	// stay, so wait well past that timeout before calling it one.
	after, settle := scrapeRuntime(t, svc), time.Now()
	for ; after["go_goroutines"] > before["go_goroutines"]+20; after = scrapeRuntime(t, svc) {
		if time.Since(settle) > 30*time.Second {
			t.Errorf("goroutines grew from %v to %v across the outage, and stayed for 30s", before["go_goroutines"], after["go_goroutines"])
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if after["go_memstats_heap_inuse_bytes"] > 2*before["go_memstats_heap_inuse_bytes"]+8<<20 {
		t.Errorf("heap in use grew from %v to %v bytes across the outage", before["go_memstats_heap_inuse_bytes"], after["go_memstats_heap_inuse_bytes"])
	}
	t.Logf("goroutines %v -> %v (settled in %s), heap in use %v -> %v bytes", before["go_goroutines"], after["go_goroutines"], time.Since(settle).Round(time.Millisecond),
		before["go_memstats_heap_inuse_bytes"], after["go_memstats_heap_inuse_bytes"])
}

// scrapeRuntime reads the service's goroutine count and heap in use from
// /metrics.
func scrapeRuntime(t *testing.T, svc *service) map[string]float64 {
	t.Helper()
	res, err := svc.http.Get(svc.url + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", res.Status)
	}
	got := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && (name == "go_goroutines" || name == "go_memstats_heap_inuse_bytes") {
			if got[name], err = strconv.ParseFloat(value, 64); err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
		}
	}
	if len(got) != 2 {
		t.Fatalf("/metrics lacks go_goroutines or go_memstats_heap_inuse_bytes: %v", got)
	}
	return got
}
