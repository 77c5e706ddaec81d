//go:build cluster

package helmtest

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/client"
)

// tenantLoad drives per-IP acquisitions through a Service from a fixed
// number of workers until stopped: its request n goes to tenant
// first + n/perTenant, so every tenant gets perTenant attempts against the
// release's per-IP limit and the outcome per tenant can be checked exactly.
// Loads never share a tenant (nextTenant). The load is paced at a fixed
// rate: the machine that runs it also runs the whole cluster, and a load
// that took every core would measure CPU starvation (decisions slower than
// the Redis timeout, answered by the failure mode), not the rollout. It counts
// every answer; a transport error, or any status other than 200, is a
// failed request.
type tenantLoad struct {
	api       *client.ClientWithResponses
	workers   int
	rate      float64 // requests per second, over all workers
	perTenant int64
	first     int64

	next     atomic.Int64
	mu       sync.Mutex
	tenants  map[int64]*tenantCount
	failures []string // the first few, for the log
	failed   int
	start    time.Time
	elapsed  time.Duration
}

type tenantCount struct{ attempts, allowed, failed int }

// nextTenant is the first tenant no load has used yet.
var nextTenant atomic.Int64

func newTenantLoad(t *testing.T, base string, workers int, rate float64, perTenant int64) *tenantLoad {
	return &tenantLoad{
		api:       apiClient(t, base, workers),
		workers:   workers,
		rate:      rate,
		perTenant: perTenant,
		first:     nextTenant.Load(),
		tenants:   map[int64]*tenantCount{},
	}
}

// pace runs workers that call one, rate times a second over all of them,
// until ctx is done, and returns when every worker has stopped, with when
// they started and how long they ran.
func pace(ctx context.Context, workers int, rate float64, one func(context.Context)) (start time.Time, elapsed time.Duration) {
	start = time.Now()
	var wg sync.WaitGroup
	interval := time.Duration(float64(workers) / rate * float64(time.Second))
	for w := range workers {
		wg.Go(func() {
			// Workers start spread over one interval, each on its own beat.
			next := start.Add(interval * time.Duration(w) / time.Duration(workers))
			for ctx.Err() == nil {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				next = next.Add(interval)
				one(ctx)
			}
		})
	}
	wg.Wait()
	return start, time.Since(start)
}

// tenantIP is the address of tenant i: 131,072 addresses in 198.18.0.0/15
// (RFC 2544), then 10.0.0.0/8.
func tenantIP(i int64) string {
	if i < 1<<17 {
		return fmt.Sprintf("198.%d.%d.%d", 18+i>>16, i>>8&255, i&255)
	}
	i -= 1 << 17
	return fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
}

// run sends requests until ctx is done, or stop closes, and returns when
// every worker has stopped.
func (l *tenantLoad) run(ctx context.Context) {
	l.start, l.elapsed = pace(ctx, l.workers, l.rate, l.one)
	nextTenant.Store(l.first + l.next.Load()/l.perTenant + 1)
}

func (l *tenantLoad) one(ctx context.Context) {
	n := l.next.Add(1) - 1
	tenant := l.first + n/l.perTenant
	// A request of its own context: stopping the load must not fail the
	// requests under way.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	resp, err := l.api.AcquireTenantWithResponse(rctx, tenantIP(tenant), client.AcquireTenantJSONRequestBody{})
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.tenants[tenant]
	if c == nil {
		c = &tenantCount{}
		l.tenants[tenant] = c
	}
	c.attempts++
	var failure string
	switch {
	case err != nil:
		failure = err.Error()
	case resp.StatusCode() != http.StatusOK || resp.JSON200 == nil:
		failure = fmt.Sprintf("%d %s", resp.StatusCode(), resp.Body)
	case resp.JSON200.Degraded != nil && *resp.JSON200.Degraded:
		failure = "degraded decision"
	case resp.JSON200.Allowed:
		c.allowed++
	}
	if failure != "" {
		c.failed++
		l.failed++
		if len(l.failures) < 10 {
			l.failures = append(l.failures, fmt.Sprintf("%s +%s: %s", tenantIP(tenant), time.Since(l.start).Round(time.Millisecond), failure))
		}
	}
}

// loadResult sums a finished load against the per-IP limit.
type loadResult struct {
	requests, allowed, failed int
	// overAdmitted counts tenants granted more than the limit.
	overAdmitted int
	// underAdmitted counts tenants with no failed request and enough
	// attempts that were granted less than the limit: every attempt up to
	// the limit must be granted when the pods share one state.
	underAdmitted int
	rate          float64 // requests per second
}

func (l *tenantLoad) result(limit int) loadResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	var r loadResult
	for _, c := range l.tenants {
		r.requests += c.attempts
		r.allowed += c.allowed
		r.failed += c.failed
		if c.allowed > limit {
			r.overAdmitted++
		}
		if c.failed == 0 && c.allowed < min(c.attempts, limit) {
			r.underAdmitted++
		}
	}
	r.rate = float64(r.requests) / l.elapsed.Seconds()
	return r
}

// during runs the load while f runs, and for settle after it returns, so
// that the load also covers what f leaves behind (pods terminating).
func (l *tenantLoad) during(t *testing.T, settle time.Duration, f func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx)
	}()
	// Let every worker open its connections first.
	time.Sleep(time.Second)
	f()
	time.Sleep(settle)
	cancel()
	<-done
}
