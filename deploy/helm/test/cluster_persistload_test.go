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

// persistTarget is one bucket the persistence test takes permits from: a
// limiter, one key of a keyed limiter, or a per-IP tenant.
type persistTarget struct {
	limiter, key string // a limiter, and the key for a keyed one
	tenant       string // or a per-IP tenant
	limit        int64
}

func (p persistTarget) String() string {
	switch {
	case p.tenant != "":
		return "tenant " + p.tenant
	case p.key != "":
		return fmt.Sprintf("limiter %s key %s", p.limiter, p.key)
	}
	return "limiter " + p.limiter
}

// acquire takes permits from the target. Only an answer 200 counts: failure
// describes any other outcome (a transport error, another status, a
// degraded decision), which grants nothing the caller may rely on.
func (p persistTarget) acquire(ctx context.Context, api *client.ClientWithResponses, permits int64) (allowed bool, failure string) {
	body := client.AcquireJSONRequestBody{Permits: &permits}
	var (
		status int
		raw    []byte
		d      *client.Decision
		td     *client.TenantDecision
		err    error
	)
	if p.tenant != "" {
		var resp *client.AcquireTenantResponse
		if resp, err = api.AcquireTenantWithResponse(ctx, p.tenant, body); err == nil {
			status, raw, td = resp.StatusCode(), resp.Body, resp.JSON200
		}
	} else {
		if p.key != "" {
			body.Key = &p.key
		}
		var resp *client.AcquireResponse
		if resp, err = api.AcquireWithResponse(ctx, p.limiter, body); err == nil {
			status, raw, d = resp.StatusCode(), resp.Body, resp.JSON200
		}
	}
	switch {
	case err != nil:
		return false, err.Error()
	case status != http.StatusOK || d == nil && td == nil:
		return false, fmt.Sprintf("%d %s", status, raw)
	case d != nil && d.Degraded != nil && *d.Degraded, td != nil && td.Degraded != nil && *td.Degraded:
		return false, "degraded decision"
	case d != nil:
		return d.Allowed, ""
	}
	return td.Allowed, ""
}

// available returns how many permits the target could grant now.
func (p persistTarget) available(ctx context.Context, api *client.ClientWithResponses) (int64, error) {
	if p.tenant != "" {
		resp, err := api.GetTenantAvailableWithResponse(ctx, p.tenant)
		if err != nil {
			return 0, err
		}
		if resp.JSON200 == nil {
			return 0, fmt.Errorf("%d %s", resp.StatusCode(), resp.Body)
		}
		return resp.JSON200.Remaining, nil
	}
	var params *client.GetAvailableParams
	if p.key != "" {
		params = &client.GetAvailableParams{Key: &p.key}
	}
	resp, err := api.GetAvailableWithResponse(ctx, p.limiter, params)
	if err != nil {
		return 0, err
	}
	if resp.JSON200 == nil {
		return 0, fmt.Errorf("%d %s", resp.StatusCode(), resp.Body)
	}
	return resp.JSON200.Remaining, nil
}

// persistLoad acquires one permit at a time from a fixed list of targets,
// round robin, from a few workers at a paced rate (the same machine runs
// the cluster), and counts per target the permits granted by answers 200.
// A restart of the pod makes requests fail: those are counted apart and
// grant nothing.
type persistLoad struct {
	api     *client.ClientWithResponses
	targets []persistTarget
	workers int
	rate    float64 // requests per second, over all workers

	next     atomic.Int64
	mu       sync.Mutex
	granted  map[persistTarget]int64
	grants   int64 // all targets
	denied   int
	failed   int
	failures []string // the first few, for the log
	// The first and the last failure, since start: the restart's gap as
	// the callers saw it.
	firstFailure, lastFailure time.Duration
	start                     time.Time
	elapsed                   time.Duration
}

func newPersistLoad(t *testing.T, base string, targets []persistTarget, workers int, rate float64) *persistLoad {
	return &persistLoad{
		api:     apiClient(t, base, workers),
		targets: targets,
		workers: workers,
		rate:    rate,
		granted: map[persistTarget]int64{},
	}
}

// run sends requests until ctx is done, and returns when every worker has
// stopped.
func (l *persistLoad) run(ctx context.Context) {
	l.start, l.elapsed = pace(ctx, l.workers, l.rate, l.one)
}

func (l *persistLoad) one(ctx context.Context) {
	target := l.targets[(l.next.Add(1)-1)%int64(len(l.targets))]
	// A request of its own context: stopping the load must not fail the
	// requests under way, whose grants would then go uncounted.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	allowed, failure := target.acquire(rctx, l.api, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case failure != "":
		at := time.Since(l.start)
		if l.failed == 0 {
			l.firstFailure = at
		}
		l.lastFailure = at
		l.failed++
		if len(l.failures) < 5 {
			l.failures = append(l.failures, fmt.Sprintf("%s +%s: %s", target, at.Round(time.Millisecond), failure))
		}
	case allowed:
		l.granted[target]++
		l.grants++
	default:
		l.denied++
	}
}

// total is the number of permits granted so far, over all targets.
func (l *persistLoad) total() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.grants
}

// during runs the load while change runs, and for settle after it returns.
func (l *persistLoad) during(t *testing.T, settle time.Duration, change func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx)
	}()
	time.Sleep(2 * time.Second) // grants before the change
	change()
	time.Sleep(settle)
	cancel()
	<-done
}
