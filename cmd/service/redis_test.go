package main

import (
	"context"
	"math/bits"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// replica starts the service on the Redis backend at addr and returns a
// client of it once it reports ready.
func replica(t *testing.T, addr string, env map[string]string) *client.ClientWithResponses {
	t.Helper()
	// A generous Redis timeout unless env sets one: a loaded test machine
	// must not turn decisions degraded where a test does not ask for it.
	all := map[string]string{"RATELIMITER_BACKEND": "redis", "RATELIMITER_REDIS_ADDRS": addr, "RATELIMITER_REDIS_TIMEOUT": "2s"}
	for k, v := range env {
		all[k] = v
	}
	base, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0"}, all)
	c, err := client.NewClientWithResponses(base)
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, c, http.StatusOK)
	return c
}

// waitReady polls /readyz until it answers want, for up to 30 seconds.
func waitReady(t *testing.T, c *client.ClientWithResponses, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := c.GetReadinessWithResponse(t.Context())
		if err == nil && res.StatusCode() == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz did not answer %d within 30s (last: %v, %v)", want, res, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitBackendUp polls /metrics until ratelimiter_backend_up{backend="redis"}
// is want, for up to 30 seconds.
func waitBackendUp(t *testing.T, c *client.ClientWithResponses, want float64) {
	t.Helper()
	const series = `ratelimiter_backend_up{backend="redis"}`
	base := strings.TrimSuffix(c.ClientInterface.(*client.Client).Server, "/")
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, ok := scrape(t, base+"/metrics")[series]
		if ok && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics %s = %v (present %v) after 30s, want %v", series, got, ok, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func acquire(t *testing.T, c *client.ClientWithResponses, name string, permits int64) client.Decision {
	t.Helper()
	res, err := c.AcquireWithResponse(t.Context(), name, client.AcquireRequest{Permits: &permits})
	if err != nil {
		t.Fatal(err)
	}
	if res.JSON200 == nil {
		t.Fatalf("acquire %s: got %s %s, want 200", name, res.Status(), res.Body)
	}
	return *res.JSON200
}

// Two replicas over one Redis behave as one limiter.
func TestRedisBackendIsShared(t *testing.T) {
	addr := redistest.Standalone(t)
	a, b := replica(t, addr, nil), replica(t, addr, nil)
	ctx := context.Background()

	put, err := a.PutLimiterWithResponse(ctx, "shared", client.LimiterSpec{Limit: 10, Period: "1h"})
	if err != nil || put.StatusCode() != http.StatusCreated {
		t.Fatalf("put through a: %v %v", put, err)
	}
	got, err := b.GetLimiterWithResponse(ctx, "shared")
	if err != nil || got.JSON200 == nil || got.JSON200.Limit != 10 {
		t.Fatalf("get through b: %v %v, want the limiter created through a", got, err)
	}
	granted := 0
	for i := range 15 {
		c := a
		if i%2 == 1 {
			c = b
		}
		if d := acquire(t, c, "shared", 1); d.Allowed {
			granted++
		} else if d.Degraded != nil {
			t.Fatalf("decision %d was degraded with Redis up", i)
		}
	}
	if granted != 10 {
		t.Errorf("granted %d of 15 acquisitions through two replicas, want the limit, 10", granted)
	}

	// A batch through either replica sees the same limiter, in order.
	if res, err := a.PutLimiterWithResponse(ctx, "batched", client.LimiterSpec{Limit: 5, Period: "1h"}); err != nil || res.StatusCode() != http.StatusCreated {
		t.Fatalf("put batched: %v %v", res, err)
	}
	three := int64(3)
	items := []client.BatchAcquisition{{Limiter: "batched", Permits: &three}, {Limiter: "shared"}, {Limiter: "batched", Permits: &three}, {Limiter: "nowhere"}, {Limiter: "batched"}}
	batch, err := b.AcquireBatchWithResponse(ctx, client.BatchAcquireRequest{Acquisitions: items})
	if err != nil || batch.JSON200 == nil || len(batch.JSON200.Results) != len(items) {
		t.Fatalf("batch through b: %v %v", batch, err)
	}
	for i, want := range []struct {
		status    int32
		allowed   bool
		remaining int64
	}{{200, true, 2}, {200, false, 0}, {200, false, 2}, {404, false, 0}, {200, true, 1}} {
		r := batch.JSON200.Results[i]
		if r.Status != want.status || (r.Decision != nil) != (want.status == 200) {
			t.Errorf("batch result %d: got %+v, want status %d", i, r, want.status)
			continue
		}
		if d := r.Decision; d != nil && (d.Allowed != want.allowed || d.Remaining != want.remaining || d.Degraded != nil) {
			t.Errorf("batch result %d: got %+v, want allowed=%v remaining=%d", i, *d, want.allowed, want.remaining)
		}
	}
	if av, err := a.GetAvailableWithResponse(ctx, "batched", nil); err != nil || av.JSON200 == nil || av.JSON200.Remaining != 1 {
		t.Errorf("available through a after the batch through b: %v %v, want 1", av, err)
	}

	one := int64(3)
	if res, err := a.AcquireTenantWithResponse(ctx, "198.51.100.7", client.AcquireTenantJSONRequestBody{Permits: &one}); err != nil || res.JSON200 == nil || !res.JSON200.Allowed {
		t.Fatalf("acquire tenant through a: %v %v", res, err)
	}
	av, err := b.GetTenantAvailableWithResponse(ctx, "198.51.100.7")
	if err != nil || av.JSON200 == nil || av.JSON200.Remaining != av.JSON200.Limit-3 {
		t.Fatalf("tenant available through b: %v %v, want 3 taken", av, err)
	}
	k := int32(5)
	low, err := b.ListLowestTenantsWithResponse(ctx, &client.ListLowestTenantsParams{K: &k})
	if err != nil || low.JSON200 == nil || len(low.JSON200.Items) != 1 || low.JSON200.Items[0].Tenant != "198.51.100.7" {
		t.Fatalf("lowest through b: %v %v, want the tenant acquired through a", low, err)
	}
}

// When Redis stops answering, fail-closed denies, turns the replica unready
// and reports the backend down in /metrics; when it answers again, all
// three recover without a restart.
func TestRedisOutageFailClosed(t *testing.T) {
	srv := redistest.StartStandalone(t)
	c := replica(t, srv.Addr, map[string]string{"RATELIMITER_REDIS_TIMEOUT": "1s"})
	if res, err := c.PutLimiterWithResponse(t.Context(), "upstream", client.LimiterSpec{Limit: 100, Period: "1h"}); err != nil || res.StatusCode() != http.StatusCreated {
		t.Fatalf("put: %v %v", res, err)
	}

	srv.Pause(t)
	d := acquire(t, c, "upstream", 1)
	if d.Allowed || d.Degraded == nil || !*d.Degraded {
		t.Errorf("acquire with Redis paused: got %+v, want a degraded denial", d)
	}
	batch, err := c.AcquireBatchWithResponse(t.Context(), client.BatchAcquireRequest{Acquisitions: []client.BatchAcquisition{{Limiter: "upstream"}, {Limiter: "upstream"}}})
	if err != nil || batch.JSON200 == nil {
		t.Fatalf("batch with Redis paused: %v %v, want 200", batch, err)
	}
	for i, r := range batch.JSON200.Results {
		if r.Decision == nil || r.Decision.Allowed || r.Decision.Degraded == nil || !*r.Decision.Degraded {
			t.Errorf("batch result %d with Redis paused: got %+v, want a degraded denial", i, r)
		}
	}
	waitReady(t, c, http.StatusServiceUnavailable)
	waitBackendUp(t, c, 0)

	srv.Unpause(t)
	waitReady(t, c, http.StatusOK)
	waitBackendUp(t, c, 1)
	deadline := time.Now().Add(30 * time.Second)
	for {
		d := acquire(t, c, "upstream", 1)
		if d.Degraded == nil && d.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("decisions still degraded 30s after Redis came back: %+v", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// With fail-open, an outage grants and the replica stays ready, so only
// /metrics tells that Redis is down; a replica started while Redis is
// unreachable serves degraded decisions too.
func TestRedisOutageFailOpen(t *testing.T) {
	srv := redistest.StartStandalone(t)
	env := map[string]string{"RATELIMITER_REDIS_FAILURE_MODE": "fail-open", "RATELIMITER_REDIS_TIMEOUT": "1s"}
	c := replica(t, srv.Addr, env)
	// Under fail-open the replica is ready before it has connected: until
	// it has, a definition cannot be written and the PUT answers 503.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := c.PutLimiterWithResponse(t.Context(), "upstream", client.LimiterSpec{Limit: 1, Period: "1h"})
		if err == nil && res.StatusCode() == http.StatusCreated {
			break
		}
		if err != nil {
			t.Fatalf("put: %v", err)
		}
		if res.StatusCode() != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("put: got %s, want 201 once connected", res.Status())
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitBackendUp(t, c, 1)
	srv.Stop(t)
	for range 3 {
		if d := acquire(t, c, "upstream", 1); !d.Allowed || d.Degraded == nil {
			t.Errorf("acquire with Redis stopped: got %+v, want a degraded grant", d)
		}
	}
	waitReady(t, c, http.StatusOK)
	waitBackendUp(t, c, 0)

	// A replica whose Redis has never answered.
	late := replica(t, srv.Addr, env)
	waitBackendUp(t, late, 0)
	if d := acquire(t, late, "upstream", 1); !d.Allowed || d.Degraded == nil {
		t.Errorf("acquire before Redis ever answered: got %+v, want a degraded grant", d)
	}
}

// A replica opens as many connections to a standalone Redis as
// RATELIMITER_REDIS_CONNS_PER_NODE asks for, and decides over them; 0
// leaves rueidis's default.
func TestRedisConnsPerNode(t *testing.T) {
	// rueidis's default for a standalone server: 2^min(log2(GOMAXPROCS), 2).
	rueidisDefault := 1 << min(bits.Len(uint(runtime.GOMAXPROCS(0)))-1, 2)
	tests := []struct {
		name  string
		value string
		want  int
	}{
		{name: "one", value: "1", want: 1},
		{name: "four", value: "4", want: 4},
		{name: "default", value: "0", want: rueidisDefault},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := redistest.Standalone(t)
			c := replica(t, addr, map[string]string{"RATELIMITER_REDIS_CONNS_PER_NODE": tt.value})
			if res, err := c.PutLimiterWithResponse(t.Context(), "conns", client.LimiterSpec{Limit: 1000, Period: "1h"}); err != nil || res.StatusCode() != http.StatusCreated {
				t.Fatalf("put: %v %v", res, err)
			}
			// rueidis sends each keyed command over a connection picked at
			// random, opening it on first use: 200 decisions open every one
			// of a few connections but for a vanishing chance.
			for i := range 200 {
				if d := acquire(t, c, "conns", 1); !d.Allowed || d.Degraded != nil {
					t.Fatalf("acquisition %d: got %+v, want a grant from Redis", i, d)
				}
			}
			if got := serviceConns(t, addr); got != tt.want {
				t.Errorf("RATELIMITER_REDIS_CONNS_PER_NODE=%s: got %d connections to Redis, want %d", tt.value, got, tt.want)
			}
		})
	}
}

// serviceConns counts the connections to the Redis at addr other than the
// one it opens to ask: the service's, which have no name.
func serviceConns(t *testing.T, addr string) int {
	t.Helper()
	const name = "conns-counter"
	rc, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{addr}, ClientName: name, DisableCache: true, PipelineMultiplex: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	list, err := rc.Do(t.Context(), rc.B().ClientList().Build()).ToString()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if !strings.Contains(line, " name="+name+" ") {
			n++
		}
	}
	return n
}

// A replica told to stop keeps deciding from Redis through its shutdown
// delay: load balancers still send it requests until they see it unready,
// and a degraded denial then would be a wrong answer.
func TestRedisServesThroughShutdownDelay(t *testing.T) {
	srv := redistest.StartStandalone(t)
	env := map[string]string{"RATELIMITER_BACKEND": "redis", "RATELIMITER_REDIS_ADDRS": srv.Addr, "RATELIMITER_SHUTDOWN_DELAY": "1s", "RATELIMITER_REDIS_TIMEOUT": "2s"}
	base, _, done, cancel := start(t, []string{"--listen", "127.0.0.1:0"}, env)
	c, err := client.NewClientWithResponses(base)
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, c, http.StatusOK)
	if res, err := c.PutLimiterWithResponse(t.Context(), "upstream", client.LimiterSpec{Limit: 100, Period: "1h"}); err != nil || res.StatusCode() != http.StatusCreated {
		t.Fatalf("put: %v %v", res, err)
	}
	acquire(t, c, "upstream", 1)

	cancel()
	waitReady(t, c, http.StatusServiceUnavailable)
	if d := acquire(t, c, "upstream", 1); !d.Allowed || d.Degraded != nil {
		t.Errorf("acquire during the shutdown delay: got %+v, want a grant from Redis", d)
	}
	waitRun(t, done)
}

// emptyRedis empties the Redis at addr as a restart without persistence
// would: every key and every loaded script gone.
func emptyRedis(t *testing.T, addr string) {
	t.Helper()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, PipelineMultiplex: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	for _, cmd := range []rueidis.Completed{rc.B().Flushall().Build(), rc.B().ScriptFlush().Build()} {
		if err := rc.Do(t.Context(), cmd).Error(); err != nil {
			t.Fatalf("empty Redis: %v", err)
		}
	}
}

// Limiters declared in the config file outlive a Redis that restarts empty:
// acquisitions on them find them again at once, batches and availability
// too, and List shows them again.
func TestRedisRestartedEmptyKeepsDeclaredLimiters(t *testing.T) {
	addr := redistest.Standalone(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	declared := "limiters:\n  - {name: declared, limit: 1000, period: 1h}\n  - {name: logged, limit: 1000, period: 1h, algorithm: sliding_log}\n"
	if err := os.WriteFile(cfg, []byte(declared), 0o600); err != nil {
		t.Fatal(err)
	}
	c := replica(t, addr, map[string]string{"RATELIMITER_CONFIG": cfg})
	acquire(t, c, "declared", 1)

	emptyRedis(t, addr)
	notFound := 0
	for range 100 {
		permits := int64(1)
		res, err := c.AcquireWithResponse(t.Context(), "declared", client.AcquireRequest{Permits: &permits})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case res.StatusCode() == http.StatusNotFound:
			notFound++
		case res.JSON200 == nil || !res.JSON200.Allowed || res.JSON200.Degraded != nil:
			t.Fatalf("acquire after Redis emptied: got %s %s, want a grant from Redis", res.Status(), res.Body)
		}
	}
	if notFound != 0 {
		t.Errorf("got %d of 100 acquisitions answered 404 after Redis emptied, want 0", notFound)
	}

	emptyRedis(t, addr)
	batch, err := c.AcquireBatchWithResponse(t.Context(), client.BatchAcquireRequest{Acquisitions: []client.BatchAcquisition{{Limiter: "logged"}, {Limiter: "nowhere"}, {Limiter: "logged"}}})
	if err != nil || batch.JSON200 == nil {
		t.Fatalf("batch after Redis emptied: %v %v", batch, err)
	}
	for i, want := range []int32{200, 404, 200} {
		if got := batch.JSON200.Results[i].Status; got != want {
			t.Errorf("batch result %d after Redis emptied: got status %d, want %d", i, got, want)
		}
	}
	emptyRedis(t, addr)
	av, err := c.GetAvailableWithResponse(t.Context(), "logged", nil)
	if err != nil {
		t.Fatal(err)
	}
	if av.JSON200 == nil || av.JSON200.Remaining != 1000 {
		t.Errorf("available after Redis emptied: got %s %s, want a full limiter", av.Status(), av.Body)
	}

	// Nothing acquires "logged" now: the periodic check brings it back.
	emptyRedis(t, addr)
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := c.ListLimitersWithResponse(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if list.JSON200 != nil && len(list.JSON200.Items) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list 30s after Redis emptied: got %s %s, want both declared limiters", list.Status(), list.Body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
