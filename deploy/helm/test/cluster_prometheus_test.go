//go:build cluster

package helmtest

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/ratelimiter/ratelimiter/client"
)

// promValues are the chart's values in TestClusterPrometheus: the Redis
// backend with two replicas, two limiters (one that denies all but its
// first permit, one that never denies), and every monitoring object on,
// with windows and pending durations of seconds so that each alert fires
// within the test. %s is Redis's address.
const promValues = `replicaCount: 2
backend:
  type: redis
  redis:
    addrs: [%s]
config:
  limiters:
    - {name: denied, limit: 1, period: 1h}
    - {name: allowed, limit: 1000000, period: 1s}
metrics:
  serviceMonitor:
    enabled: true
    interval: 1s
  prometheusRule:
    enabled: true
    highDenialRatio: {window: 10s, for: 2s}
    degradedDecisions: {window: 10s, for: 2s}
    backendDown: {for: 2s}
  grafanaDashboard:
    enabled: true
`

// TestClusterPrometheus runs the chart on the Redis backend with its
// ServiceMonitor, PrometheusRule and dashboard on, and a real Prometheus
// (Debian's) that scrapes its pods the way the Prometheus Operator would
// from the ServiceMonitor the API server stores, with the stored
// PrometheusRule's groups as its rules. Debian's build has no Kubernetes
// discovery, so Prometheus's own discovery code runs in the test and hands
// it the targets as files (kubernetesSDToFiles). Through its API: a target
// per pod, up, with the labels the alerts select by; the decision counters
// with the labels the dashboard uses, equal to the decisions the test
// made; every panel of the dashboard the cluster holds has data; the rules
// load and evaluate; denials through the Service fire
// RatelimiterHighDenialRatio for that limiter only; Redis scaled to 0 fires
// RatelimiterBackendDown for each pod (and, with requests sent straight to
// the pods, RatelimiterDegradedDecisions), and Redis back resolves it.
func TestClusterPrometheus(t *testing.T) {
	c := kubeCluster(t)
	restConfig, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(restConfig)
	ensureOperatorCRDs(t, dyn)
	ns := c.namespace(t, "prom-metrics")
	var timings []string
	timed := func(what string, d time.Duration) { timings = append(timings, fmt.Sprintf("%s %s", what, d)) }

	redisAddr := c.redis(t, ns)
	dir := t.TempDir()
	valuesFile := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(valuesFile, fmt.Appendf(nil, promValues, redisAddr), 0o600); err != nil {
		t.Fatal(err)
	}
	const release = "rl"
	start := time.Now()
	c.helm(t, append([]string{"install", release, chartDir, "--namespace", ns, "--wait", "--timeout", "3m",
		"--values", valuesFile}, c.imageValues()...)...)
	timed("helm install --wait", time.Since(start).Round(time.Millisecond))
	selector := k8slabels.Set{"app.kubernetes.io/instance": release, "app.kubernetes.io/name": "ratelimiter"}
	pods := c.waitReady(t, ns, selector, 2, time.Minute)
	podByName := map[string]corev1.Pod{}
	for _, p := range pods {
		podByName[p.Name] = p
	}

	// The objects as the API server stores them, which is what the operator
	// reads: the scrape job from the ServiceMonitor, the rule file from the
	// PrometheusRule's groups.
	fullname := release + "-ratelimiter"
	sm, err := dyn.Resource(smResource).Namespace(ns).Get(t.Context(), fullname, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's ServiceMonitor: %v", err)
	}
	rule, err := dyn.Resource(ruleResource).Namespace(ns).Get(t.Context(), fullname, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's PrometheusRule: %v", err)
	}
	groups, _, err := unstructured.NestedSlice(rule.Object, "spec", "groups")
	if err != nil || len(groups) == 0 {
		t.Fatalf("PrometheusRule %s: groups %v (%v)", fullname, groups, err)
	}
	rulesYAML, err := sigsyaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, rulesYAML, 0o600); err != nil {
		t.Fatal(err)
	}
	alertSelector := ruleSelectors(t, groups)
	t.Logf("the alerts select %v", alertSelector)

	jobs := scrapeJobs(t, sm, c.kubeconfig)
	for _, job := range jobs {
		kubernetesSDToFiles(t, dir, job)
	}
	prom := startPrometheus(t, dir, map[string]any{
		"global":         map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"rule_files":     []string{rulesPath},
		"scrape_configs": jobs,
	})

	// A target per pod, on the pod's address, up, labelled as the alerts
	// and the dashboard select.
	var targets []promTarget
	var dropped int
	timed("targets up", waitFor(t, "a target up per pod", time.Minute, func() (bool, string) {
		var err error
		if targets, dropped, err = prom.targets(); err != nil {
			return false, err.Error()
		}
		up := 0
		for _, tg := range targets {
			if tg.Health == "up" {
				up++
			}
		}
		return len(targets) == len(pods) && up == len(pods), fmt.Sprintf("%d targets, %d up: %+v", len(targets), up, targets)
	}))
	for _, tg := range targets {
		p, ok := podByName[tg.Labels["pod"]]
		if !ok {
			t.Errorf("target %s: pod label %q is none of the release's pods", tg.ScrapeURL, tg.Labels["pod"])
			continue
		}
		wantURL := fmt.Sprintf("http://%s:8080/metrics", p.Status.PodIP)
		if tg.ScrapeURL != wantURL {
			t.Errorf("target of pod %s scrapes %s, want %s", p.Name, tg.ScrapeURL, wantURL)
		}
		want := map[string]string{"namespace": ns, "job": fullname, "service": fullname, "endpoint": "http", "container": "ratelimiter",
			"instance": p.Status.PodIP + ":8080"}
		for k, v := range want {
			if tg.Labels[k] != v {
				t.Errorf("target of pod %s: label %s=%q, want %q (all: %v)", p.Name, k, tg.Labels[k], v, tg.Labels)
			}
		}
		for _, m := range alertSelector {
			if !m.Matches(tg.Labels[m.Name]) {
				t.Errorf("target of pod %s has %s=%q: the alerts' matcher %s never selects its series", p.Name, m.Name, tg.Labels[m.Name], m)
			}
		}
	}
	t.Logf("%d targets (%d discovered endpoints dropped by the ServiceMonitor's relabelling): %v", len(targets), dropped, targetNames(targets))

	// Every rule group loaded from the PrometheusRule, evaluated, healthy.
	timed("rules evaluated", waitFor(t, "every rule evaluated and healthy", 30*time.Second, func() (bool, string) {
		return rulesHealthy(prom, len(groups))
	}))

	sel := fmt.Sprintf(`namespace=%q,job=%q`, ns, fullname)
	timed("backend up", waitFor(t, "ratelimiter_backend_up 1 on each pod", 30*time.Second, func() (bool, string) {
		return backendUp(prom, sel, 1, podByName)
	}))

	// Decisions through the Service: limiter "denied" admits its first
	// permit and denies the rest, "allowed" admits all. Both see more than
	// minRate decisions a second, so the only thing that keeps "allowed"
	// from alerting is its ratio.
	api := apiClient(t, c.serviceURL(t, ns, fullname), 8)
	counts := driveDecisions(t, api, []string{"denied", "allowed"}, func(drive func() string) time.Duration {
		return waitFor(t, "RatelimiterHighDenialRatio firing for limiter denied", 90*time.Second, func() (bool, string) {
			if why := drive(); why != "" {
				t.Fatal(why)
			}
			alerts, err := prom.alerts()
			if err != nil {
				return false, err.Error()
			}
			firing := false
			for _, a := range alerts {
				if a.Labels["alertname"] != "RatelimiterHighDenialRatio" {
					continue
				}
				if a.Labels["limiter"] != "denied" {
					t.Fatalf("RatelimiterHighDenialRatio %s for limiter %q, which denied nothing: %v", a.State, a.Labels["limiter"], a.Labels)
				}
				if a.Labels["namespace"] != ns || a.Labels["job"] != fullname || a.Labels["severity"] != "warning" {
					t.Errorf("RatelimiterHighDenialRatio labels %v", a.Labels)
				}
				firing = firing || a.State == "firing"
			}
			return firing, fmt.Sprintf("alerts %v", alerts)
		})
	})
	timed("high denial ratio firing", counts.took)
	rates, err := prom.query(fmt.Sprintf(`sum by (limiter) (rate(ratelimiter_decisions_total{%s,degraded!="true"}[10s]))`, sel))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rates {
		if r.Metric["limiter"] == "allowed" && r.Value < 1 {
			t.Errorf("limiter allowed saw %.2f decisions/s, under minRate 1: its not alerting proves nothing", r.Value)
		}
	}
	t.Logf("decision rates when the alert fired: %v; made: %v", rates, counts.byKey)

	// The counters Prometheus holds, summed over the pods, are the
	// decisions the test made, with the labels the dashboard uses.
	waitFor(t, "the decision counters equal to the decisions made", 15*time.Second, func() (bool, string) {
		series, err := prom.query(fmt.Sprintf(`ratelimiter_decisions_total{%s,limiter=~"denied|allowed"}`, sel))
		if err != nil {
			return false, err.Error()
		}
		got := map[string]float64{}
		for _, s := range series {
			if _, ok := podByName[s.Metric["pod"]]; !ok {
				return false, fmt.Sprintf("series %v has no pod of the release", s.Metric)
			}
			for _, l := range []string{"instance", "limiter", "result"} {
				if s.Metric[l] == "" {
					return false, fmt.Sprintf("series %v has no %s label", s.Metric, l)
				}
			}
			got[s.Metric["limiter"]+"/"+s.Metric["result"]] += s.Value
		}
		want := map[string]float64{}
		for k, n := range counts.byKey {
			want[k] = float64(n)
		}
		return maps.Equal(got, want), fmt.Sprintf("%d series sum to %v, want %v", len(series), got, want)
	})

	// Redis gone: each pod reports its backend down, is not ready
	// (fail-closed) yet still scraped, and the alert fires per pod.
	scaleDeployment(t, c, ns, "redis", 0)
	start = time.Now()
	c.waitReady(t, ns, k8slabels.Set{"app": "redis"}, 0, time.Minute)
	timed("redis gone", time.Since(start).Round(10*time.Millisecond))
	timed("backend down", waitFor(t, "ratelimiter_backend_up 0 on each pod", 30*time.Second, func() (bool, string) {
		return backendUp(prom, sel, 0, podByName)
	}))
	var direct []*client.ClientWithResponses
	for _, p := range pods {
		direct = append(direct, apiClient(t, fmt.Sprintf("http://%s:8080", p.Status.PodIP), 2))
	}
	degraded := 0
	timed("backend down firing", waitFor(t, "RatelimiterBackendDown and RatelimiterDegradedDecisions firing", time.Minute, func() (bool, string) {
		// Requests straight to the pods, which the Service no longer
		// routes to: each decided by the failure mode, denied.
		for _, cl := range direct {
			r, err := cl.AcquireWithResponse(t.Context(), "allowed", client.AcquireJSONRequestBody{})
			if err != nil || r.JSON200 == nil || r.JSON200.Allowed || r.JSON200.Degraded == nil || !*r.JSON200.Degraded {
				t.Fatalf("acquire with Redis gone: %v %s, want a degraded denial", err, bodyOf(r))
			}
			degraded++
		}
		alerts, err := prom.alerts()
		if err != nil {
			return false, err.Error()
		}
		down, degradedFiring := map[string]bool{}, false
		for _, a := range alerts {
			switch {
			case a.State != "firing":
			case a.Labels["alertname"] == "RatelimiterBackendDown":
				down[a.Labels["pod"]] = a.Labels["backend"] == "redis" && a.Labels["severity"] == "critical"
			case a.Labels["alertname"] == "RatelimiterDegradedDecisions":
				degradedFiring = degradedFiring || a.Labels["result"] == "denied"
			}
		}
		done := len(down) == len(pods) && degradedFiring
		for name := range podByName {
			done = done && down[name]
		}
		return done, fmt.Sprintf("alerts %v", alerts)
	}))
	t.Logf("%d degraded decisions sent straight to the pods", degraded)
	if ready := c.readyPods(t, ns, selector); len(ready) != 0 {
		t.Errorf("%d pods Ready with Redis gone, want 0 (fail-closed)", len(ready))
	}
	if targets, _, err = prom.targets(); err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		if tg.Health != "up" {
			t.Errorf("target %s is %s while its pod is not ready (%s): the not-ready pod must still be scraped", tg.ScrapeURL, tg.Health, tg.LastError)
		}
	}

	// Redis back: the pods reconnect, report it up, are ready again, and
	// the alert resolves.
	scaleDeployment(t, c, ns, "redis", 1)
	back := time.Now()
	c.waitReady(t, ns, k8slabels.Set{"app": "redis"}, 1, time.Minute)
	timed("redis back", time.Since(back).Round(10*time.Millisecond))
	timed("backend up again", waitFor(t, "ratelimiter_backend_up 1 again on each pod", time.Minute, func() (bool, string) {
		return backendUp(prom, sel, 1, podByName)
	}))
	timed("backend down resolved", waitFor(t, "RatelimiterBackendDown resolved", 30*time.Second, func() (bool, string) {
		alerts, err := prom.alerts()
		if err != nil {
			return false, err.Error()
		}
		for _, a := range alerts {
			if a.Labels["alertname"] == "RatelimiterBackendDown" {
				return false, fmt.Sprintf("still %s: %v", a.State, a.Labels)
			}
		}
		return true, ""
	}))
	c.waitReady(t, ns, selector, 2, time.Minute)
	timed("pods ready again (since redis scaled up)", time.Since(back).Round(10*time.Millisecond))

	// The dashboard the cluster holds: its variables find the release, and
	// every panel's query has data.
	checkDashboardQueries(t, c, prom, ns, fullname)

	if ok, why := rulesHealthy(prom, len(groups)); !ok {
		t.Errorf("rules after the test: %s", why)
	}
	n, err := prom.headSeries()
	if err != nil {
		t.Fatal(err)
	}
	decisions, err := prom.query(fmt.Sprintf(`ratelimiter_decisions_total{%s}`, sel))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d targets, %d ratelimiter_decisions_total series, %d series in Prometheus's head; waits: %s",
		len(targets), len(decisions), n, strings.Join(timings, ", "))
}

// scaleDeployment sets a Deployment's replicas through its scale
// subresource, as kubectl scale does.
func scaleDeployment(t *testing.T, c *testCluster, ns, name string, replicas int32) {
	t.Helper()
	s := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: autoscalingv1.ScaleSpec{Replicas: replicas}}
	if _, err := c.kube.AppsV1().Deployments(ns).UpdateScale(t.Context(), name, s, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("scale %s to %d: %v", name, replicas, err)
	}
	t.Logf("scaled %s to %d", name, replicas)
}

// decisionCounts are the decisions driveDecisions made, by
// "limiter/result", and how long its wait took.
type decisionCounts struct {
	byKey map[string]int
	took  time.Duration
}

// driveDecisions acquires a permit of each limiter through api, about 20 a
// second each, for as long as wait runs, and counts the answers: a request
// in flight when wait returns is let finish, so that the counts are every
// decision the pods made. wait calls drive between its polls: drive
// reports a failed request, or "".
func driveDecisions(t *testing.T, api *client.ClientWithResponses, limiters []string, wait func(drive func() string) time.Duration) decisionCounts {
	t.Helper()
	stop := make(chan struct{})
	var (
		mu      sync.Mutex
		counts  = map[string]int{}
		failure string
		wg      sync.WaitGroup
	)
	for _, name := range limiters {
		wg.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				r, err := api.AcquireWithResponse(t.Context(), name, client.AcquireJSONRequestBody{})
				mu.Lock()
				switch {
				case err != nil || r.JSON200 == nil:
					failure = fmt.Sprintf("acquire %s: %v %s", name, err, bodyOf(r))
				case r.JSON200.Allowed:
					counts[name+"/allowed"]++
				default:
					counts[name+"/denied"]++
				}
				mu.Unlock()
			}
		})
	}
	// Also when wait fails the test.
	finish := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer finish()
	took := wait(func() string {
		mu.Lock()
		defer mu.Unlock()
		return failure
	})
	finish()
	if failure != "" {
		t.Fatal(failure)
	}
	return decisionCounts{byKey: counts, took: took}
}

// bodyOf returns a response's status and body for a failure message.
func bodyOf(r *client.AcquireResponse) string {
	if r == nil {
		return ""
	}
	return r.Status() + " " + string(r.Body)
}
