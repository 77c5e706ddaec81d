//go:build cluster

package helmtest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// redis runs one Redis in the namespace, a Deployment and a Service named
// redis, and returns its address as the pods resolve it.
func (c *testCluster) redis(t *testing.T, ns string) string {
	t.Helper()
	ctx := t.Context()
	sel := map[string]string{"app": "redis"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "redis"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: corev1.PodSpec{
					// Scaled to 0 to stand for an outage: no need to wait.
					TerminationGracePeriodSeconds: ptr(int64(1)),
					Containers: []corev1.Container{{
						Name:            "redis",
						Image:           redistest.Image,
						ImagePullPolicy: corev1.PullNever,
						Args:            []string{"--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--maxmemory-policy", "noeviction"},
						Ports:           []corev1.ContainerPort{{Name: "redis", ContainerPort: 6379}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("redis")}},
							PeriodSeconds: 1,
						},
					}},
				},
			},
		},
	}
	if _, err := c.kube.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create redis deployment: %v", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "redis"},
		Spec: corev1.ServiceSpec{
			Selector: sel,
			Ports:    []corev1.ServicePort{{Name: "redis", Port: 6379, TargetPort: intstr.FromString("redis")}},
		},
	}
	if _, err := c.kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create redis service: %v", err)
	}
	c.waitReady(t, ns, sel, 1, time.Minute)
	return fmt.Sprintf("redis.%s.svc.cluster.local:6379", ns)
}

// TestClusterRedis runs three pods on one in-cluster Redis, with the
// PodDisruptionBudget and the NetworkPolicy on, and checks through the
// Service that they decide as one: exactly the limit is admitted from
// 2,000 concurrent acquisitions, a rollout and the loss of a pod under
// load fail no request beyond those in flight on the lost pod and admit
// nothing over the limit, and changes of the limiters and of the admin
// token roll the pods and take effect.
func TestClusterRedis(t *testing.T) {
	c := kubeCluster(t)
	ns := c.namespace(t, "rl-redis")
	addr := c.redis(t, ns)
	const release = "rl"
	const tenantLimit = 5
	// A quarter of what this 2-core machine sends through the Service
	// when nothing paces it (4,600 requests/s, which starves the pods).
	const loadRate, loadWorkers = 1200, 8
	c.helm(t, append([]string{"install", release, chartDir, "--namespace", ns, "--wait", "--timeout", "3m",
		"--set", "replicaCount=3",
		"--set", "backend.type=redis",
		"--set", "backend.redis.addrs={" + addr + "}",
		// One 2-core machine runs the whole cluster, the pods, Redis and
		// the load: a decision can stall past the default 50ms there, and
		// be answered by the failure mode (degraded), which this test would
		// count as a failed request. What it measures is rollouts and pod
		// loss, not latency.
		"--set", "backend.redis.timeout=500ms",
		"--set", "podDisruptionBudget.enabled=true",
		"--set", "networkPolicy.enabled=true",
		"--set", "networkPolicy.egress.enabled=true",
		"--set", "adminToken.value=first-token",
		"--set", "config.limiters[0].name=burst",
		"--set", "config.limiters[0].limit=100",
		"--set", "config.limiters[0].period=1h",
		"--set", fmt.Sprintf("config.tenants.limit=%d", tenantLimit),
		"--set", "config.tenants.period=1h"}, c.imageValues()...)...)
	selector := labels.Set{"app.kubernetes.io/instance": release, "app.kubernetes.io/name": "ratelimiter"}
	c.waitReady(t, ns, selector, 3, time.Minute)
	c.waitEndpoints(t, ns, release+"-ratelimiter", 3)
	base := c.serviceURL(t, ns, release+"-ratelimiter")

	t.Run("exactly the limit of 2000 concurrent acquisitions", func(t *testing.T) {
		api := apiClient(t, base, 64)
		var (
			wg                      sync.WaitGroup
			mu                      sync.Mutex
			allowed, denied, failed int
			firstFailure            string
			start                   = make(chan struct{})
		)
		for range 2000 {
			wg.Go(func() {
				<-start
				resp, err := api.AcquireWithResponse(t.Context(), "burst", client.AcquireJSONRequestBody{})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					failed++
					firstFailure = err.Error()
				case resp.JSON200 == nil || resp.JSON200.Degraded != nil:
					failed++
					firstFailure = fmt.Sprintf("%d %s", resp.StatusCode(), resp.Body)
				case resp.JSON200.Allowed:
					allowed++
				default:
					denied++
				}
			})
		}
		close(start)
		wg.Wait()
		t.Logf("2000 concurrent acquisitions of 1 against a limit of 100: %d allowed, %d denied, %d failed", allowed, denied, failed)
		if allowed != 100 || denied != 1900 || failed != 0 {
			t.Errorf("want 100 allowed, 1900 denied, 0 failed; first failure: %s", firstFailure)
		}
		// Every pod decided some of them: the Service spread the load.
		for _, p := range c.readyPods(t, ns, selector) {
			m := get(t, fmt.Sprintf("http://%s:8080/metrics", p.Status.PodIP))
			if !strings.Contains(m, `ratelimiter_decisions_total{limiter="burst",result="denied"`) {
				t.Errorf("pod %s decided no acquisition of burst", p.Name)
			}
		}
	})

	// underLoad runs change under a paced per-IP load until the release has
	// 3 Ready pods again and a little after, reports the figures, and
	// fails on more than maxFailed failed requests or on any tenant granted
	// other than exactly its limit.
	underLoad := func(t *testing.T, what string, maxFailed int, change func()) {
		t.Helper()
		l := newTenantLoad(t, base, loadWorkers, loadRate, 8)
		var took time.Duration
		l.during(t, 2*time.Second, func() {
			start := time.Now()
			change()
			c.waitReady(t, ns, selector, 3, 2*time.Minute)
			took = time.Since(start)
		})
		r := l.result(tenantLimit)
		t.Logf("%s: took %s; load over %s from %d workers: %d requests (%.0f/s), %d allowed, %d failed, %d tenants over the limit, %d under",
			what, took.Round(time.Millisecond), l.elapsed.Round(time.Millisecond), l.workers, r.requests, r.rate, r.allowed, r.failed, r.overAdmitted, r.underAdmitted)
		for _, f := range l.failures {
			t.Logf("failed: %s", f)
		}
		if r.failed > maxFailed {
			t.Errorf("%d failed requests, want at most %d", r.failed, maxFailed)
		}
		if r.overAdmitted != 0 || r.underAdmitted != 0 {
			t.Errorf("%d tenants over the limit, %d under it", r.overAdmitted, r.underAdmitted)
		}
		if r.requests < 500 {
			t.Errorf("only %d requests: the load did not cover the change", r.requests)
		}
	}
	deletePod := func(t *testing.T, opts metav1.DeleteOptions) {
		victim := c.readyPods(t, ns, selector)[0]
		if err := c.kube.CoreV1().Pods(ns).Delete(t.Context(), victim.Name, opts); err != nil {
			t.Fatalf("delete pod: %v", err)
		}
	}

	t.Run("rollout under load", func(t *testing.T) {
		underLoad(t, "rollout of 3 pods", 0, func() {
			// helm returns when the new pods are ready; underLoad waits
			// for the old ones to finish draining.
			c.helm(t, "upgrade", release, chartDir, "--namespace", ns, "--reuse-values", "--wait", "--timeout", "3m",
				"--set", "podAnnotations.rollout=one")
		})
	})
	t.Run("pod deleted under load", func(t *testing.T) {
		underLoad(t, "pod deleted, replaced", 0, func() { deletePod(t, metav1.DeleteOptions{}) })
	})
	t.Run("pod deleted without grace under load", func(t *testing.T) {
		// Grace period 0: the pod object goes at once and the kubelet
		// stops its container with the least grace it allows, so requests
		// in flight on it may fail. Each worker has at most one.
		underLoad(t, "pod deleted without grace, replaced", loadWorkers, func() {
			deletePod(t, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		})
	})

	t.Run("limiter and admin token changes roll the pods", func(t *testing.T) {
		before := podNames(c.readyPods(t, ns, selector))
		c.helm(t, "upgrade", release, chartDir, "--namespace", ns, "--reuse-values", "--wait", "--timeout", "3m",
			"--set", "config.limiters[0].name=burst",
			"--set", "config.limiters[0].limit=50",
			"--set", "config.limiters[0].period=1h",
			"--set", "adminToken.value=second-token")
		after := c.waitReady(t, ns, selector, 3, 2*time.Minute)
		for _, p := range after {
			if before[p.Name] {
				t.Errorf("pod %s survived a change of its configuration", p.Name)
			}
			// Each pod, asked directly, has the new limit.
			api := apiClient(t, fmt.Sprintf("http://%s:8080", p.Status.PodIP), 1)
			got, err := api.GetLimiterWithResponse(t.Context(), "burst")
			if err != nil {
				t.Fatalf("get limiter: %v", err)
			}
			if got.JSON200 == nil || got.JSON200.Limit != 50 {
				t.Errorf("pod %s: limiter burst is %s, want limit 50", p.Name, got.Body)
			}
		}
		api := apiClient(t, base, 1)
		spec := client.PutLimiterJSONRequestBody{Limit: 3, Period: "1m"}
		for token, want := range map[string]int{"first-token": http.StatusUnauthorized, "second-token": http.StatusCreated} {
			resp, err := api.PutLimiterWithResponse(t.Context(), "created", spec, bearer(token))
			if err != nil {
				t.Fatalf("put limiter: %v", err)
			}
			if resp.StatusCode() != want {
				t.Errorf("put limiter with %s: %d %s, want %d", token, resp.StatusCode(), resp.Body, want)
			}
		}
	})
}

func podNames(pods []corev1.Pod) map[string]bool {
	names := map[string]bool{}
	for _, p := range pods {
		names[p.Name] = true
	}
	return names
}

// bearer sets the admin token on a request.
func bearer(token string) client.RequestEditorFn {
	return func(_ context.Context, r *http.Request) error {
		r.Header.Set("Authorization", "Bearer "+token)
		return nil
	}
}
