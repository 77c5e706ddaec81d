//go:build cluster

package helmtest

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestClusterDefault installs the chart with its default values, plus a
// limiter, and uses it through its Service: the pod runs as the chart says,
// helm test passes, and every kind of request is answered.
func TestClusterDefault(t *testing.T) {
	c := kubeCluster(t)
	ns := c.namespace(t, "rl-default")
	const release = "rl"
	args := append([]string{"install", release, chartDir, "--namespace", ns, "--wait", "--timeout", "3m",
		"--set", "config.limiters[0].name=upstream",
		"--set", "config.limiters[0].limit=5",
		"--set", "config.limiters[0].period=1m"}, c.imageValues()...)
	c.helm(t, args...)

	selector := labels.Set{"app.kubernetes.io/instance": release, "app.kubernetes.io/name": "ratelimiter"}
	pods := c.waitReady(t, ns, selector, 1, time.Minute)

	// What the runtime applied: the chart's numeric non-root user, a
	// read-only root filesystem, no capabilities, no privilege escalation,
	// the runtime's seccomp profile.
	status := pods[0].Status.ContainerStatuses[0]
	if !status.Ready || status.RestartCount != 0 {
		t.Errorf("container ready=%t restarts=%d", status.Ready, status.RestartCount)
	}
	spec := c.containerSpec(t, status.ContainerID)
	if spec.Process.User.UID != 65532 || spec.Process.User.GID != 65532 {
		t.Errorf("container runs as %d:%d, want 65532:65532", spec.Process.User.UID, spec.Process.User.GID)
	}
	if !spec.Root.Readonly {
		t.Error("container's root filesystem is writable")
	}
	if !spec.Process.NoNewPrivileges {
		t.Error("container may gain privileges")
	}
	if len(spec.Process.Capabilities.Effective) != 0 {
		t.Errorf("container has capabilities %v", spec.Process.Capabilities.Effective)
	}
	if spec.Linux.Seccomp == nil {
		t.Error("container has no seccomp profile")
	}

	// helm test: a pod asks the Service, by its DNS name, whether the
	// service is ready.
	c.helm(t, "test", release, "--namespace", ns, "--timeout", "2m")

	base := c.serviceURL(t, ns, release+"-ratelimiter")
	api := apiClient(t, base, 4)
	ctx := t.Context()

	got, err := api.GetLimiterWithResponse(ctx, "upstream")
	if err != nil {
		t.Fatalf("get limiter from values: %v", err)
	}
	if got.JSON200 == nil {
		t.Fatalf("get limiter from values: %s", got.Body)
	}
	if got.JSON200.Limit != 5 {
		t.Errorf("limiter upstream: limit %d, want 5", got.JSON200.Limit)
	}
	acq, err := api.AcquireWithResponse(ctx, "upstream", client.AcquireJSONRequestBody{Permits: ptr(int64(3))})
	if err != nil {
		t.Fatalf("acquire 3 of 5: %v", err)
	}
	if acq.JSON200 == nil || !acq.JSON200.Allowed || acq.JSON200.Remaining != 2 {
		t.Fatalf("acquire 3 of 5: %s", acq.Body)
	}
	// All or nothing: 3 more do not fit, and nothing is taken.
	acq, err = api.AcquireWithResponse(ctx, "upstream", client.AcquireJSONRequestBody{Permits: ptr(int64(3))})
	if err != nil {
		t.Fatalf("acquire 3 more: %v", err)
	}
	if acq.JSON200 == nil || acq.JSON200.Allowed {
		t.Fatalf("acquire 3 more: %s", acq.Body)
	}
	avail, err := api.GetAvailableWithResponse(ctx, "upstream", nil)
	if err != nil {
		t.Fatalf("available after a denial: %v", err)
	}
	if avail.JSON200 == nil || avail.JSON200.Remaining != 2 {
		t.Fatalf("available after a denial: %s", avail.Body)
	}

	tenant, err := api.AcquireTenantWithResponse(ctx, "203.0.113.9", client.AcquireTenantJSONRequestBody{})
	if err != nil {
		t.Fatalf("per-IP acquire: %v", err)
	}
	if tenant.JSON200 == nil || !tenant.JSON200.Allowed {
		t.Fatalf("per-IP acquire: %s", tenant.Body)
	}
	lowest, err := api.ListLowestTenantsWithResponse(ctx, &client.ListLowestTenantsParams{})
	if err != nil {
		t.Fatalf("lowest tenants: %v", err)
	}
	if lowest.JSON200 == nil || len(lowest.JSON200.Items) != 1 || lowest.JSON200.Items[0].Tenant != "203.0.113.9" {
		t.Fatalf("lowest tenants: %s", lowest.Body)
	}

	docs := get(t, base+"/docs")
	if !strings.Contains(docs, "<html") {
		t.Errorf("/docs is not a page: %.200s", docs)
	}
	metrics := get(t, base+"/metrics")
	for _, want := range []string{
		`ratelimiter_decisions_total{limiter="upstream",result="allowed"`,
		`ratelimiter_decisions_total{limiter="upstream",result="denied"`,
		`ratelimiter_decisions_total{limiter="_tenant",result="allowed"`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}

	// A rollout under load fails no request: the new pod is ready before
	// the old one stops, and the old one drains. The memory backend keeps
	// its state in the pod, so the new pod starts with full buckets: only
	// failures are counted here (TestClusterRedis checks the counts).
	l := newTenantLoad(t, base, 8, 1200, 8)
	var took time.Duration
	l.during(t, 2*time.Second, func() {
		start := time.Now()
		c.helm(t, "upgrade", release, chartDir, "--namespace", ns, "--reuse-values", "--wait", "--timeout", "3m",
			"--set", "podAnnotations.rollout=one")
		c.waitReady(t, ns, selector, 1, 2*time.Minute)
		took = time.Since(start)
	})
	r := l.result(100)
	t.Logf("rollout of 1 pod: took %s; load over %s from %d workers: %d requests (%.0f/s), %d failed",
		took.Round(time.Millisecond), l.elapsed.Round(time.Millisecond), l.workers, r.requests, r.rate, r.failed)
	for _, f := range l.failures {
		t.Logf("failed: %s", f)
	}
	if r.failed != 0 || r.requests < 500 {
		t.Errorf("%d of %d requests failed, want 0 of at least 500", r.failed, r.requests)
	}
}

// get fetches a URL and returns its body, failing the test unless it
// answers 200.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(body)
}

func ptr[T any](v T) *T { return &v }
