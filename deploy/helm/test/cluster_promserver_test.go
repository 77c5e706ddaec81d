//go:build cluster

// The Prometheus server of TestClusterPrometheus: Debian's prometheus as a
// child process, its HTTP API, and the checks the test makes through it.

package helmtest

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// prometheusBinary is Debian's Prometheus server (package prometheus).
const prometheusBinary = "/usr/bin/prometheus"

// promServer is a Prometheus server the test started, and its HTTP API.
type promServer struct {
	base string
	hc   *http.Client
}

// startPrometheus runs Debian's Prometheus on a free loopback port with
// config (whose rule_files the caller wrote), storing its data in a
// temporary directory, and stops it when the test ends. It returns once
// Prometheus reports ready.
func startPrometheus(t *testing.T, dir string, config map[string]any) *promServer {
	t.Helper()
	if _, err := os.Stat(prometheusBinary); err != nil {
		t.Fatalf("%s: %v (install Debian's prometheus package; its daemon need not run)", prometheusBinary, err)
	}
	b, err := sigsyaml.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	configPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	exited := startProcess(t, dir, "prometheus", prometheusBinary,
		"--config.file="+configPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=info")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus config:\n%s", b)
		}
	})
	logPath := filepath.Join(dir, "prometheus.log")

	p := &promServer{base: "http://" + addr, hc: &http.Client{Timeout: 10 * time.Second}}
	waitFor(t, "prometheus ready", 30*time.Second, func() (bool, string) {
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", tail(logPath, 40))
		default:
		}
		resp, err := p.hc.Get(p.base + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return p
}

// api GETs path with query from Prometheus's HTTP API and decodes its data
// into out.
func (p *promServer) api(path string, query url.Values, out any) error {
	u := p.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	resp, err := p.hc.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("GET %s: %s: %w", u, resp.Status, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s", u, resp.Status, body.Error)
	}
	return json.Unmarshal(body.Data, out)
}

// promTarget is an active target of /api/v1/targets.
type promTarget struct {
	Labels     map[string]string `json:"labels"`
	ScrapePool string            `json:"scrapePool"`
	ScrapeURL  string            `json:"scrapeUrl"`
	Health     string            `json:"health"`
	LastError  string            `json:"lastError"`
}

func (p *promServer) targets() ([]promTarget, int, error) {
	var data struct {
		Active  []promTarget `json:"activeTargets"`
		Dropped []struct{}   `json:"droppedTargets"`
	}
	err := p.api("/api/v1/targets", nil, &data)
	return data.Active, len(data.Dropped), err
}

// promRuleGroup is a group of /api/v1/rules.
type promRuleGroup struct {
	Name           string    `json:"name"`
	File           string    `json:"file"`
	Interval       float64   `json:"interval"`
	EvaluationTime float64   `json:"evaluationTime"`
	LastEvaluation time.Time `json:"lastEvaluation"`
	Rules          []struct {
		Name           string      `json:"name"`
		Query          string      `json:"query"`
		Type           string      `json:"type"`
		State          string      `json:"state"`
		Health         string      `json:"health"`
		LastError      string      `json:"lastError"`
		LastEvaluation time.Time   `json:"lastEvaluation"`
		Alerts         []promAlert `json:"alerts"`
	} `json:"rules"`
}

func (p *promServer) rules() ([]promRuleGroup, error) {
	var data struct {
		Groups []promRuleGroup `json:"groups"`
	}
	err := p.api("/api/v1/rules", nil, &data)
	return data.Groups, err
}

// promAlert is an alert of /api/v1/alerts: pending or firing.
type promAlert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"`
	ActiveAt time.Time         `json:"activeAt"`
	Value    string            `json:"value"`
}

func (p *promServer) alerts() ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := p.api("/api/v1/alerts", nil, &data)
	return data.Alerts, err
}

// promSample is one series of an instant vector.
type promSample struct {
	Metric map[string]string
	Value  float64
}

// query evaluates an instant PromQL query, which must return a vector.
func (p *promServer) query(q string) ([]promSample, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := p.api("/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: result type %s, want vector", q, data.ResultType)
	}
	out := make([]promSample, 0, len(data.Result))
	for _, r := range data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v: %w", q, r.Value[1], err)
		}
		out = append(out, promSample{Metric: r.Metric, Value: v})
	}
	return out, nil
}

// labelValues returns the values label takes in the series matching match,
// as Grafana's label_values(match, label) does.
func (p *promServer) labelValues(match, label string) ([]string, error) {
	var values []string
	err := p.api("/api/v1/label/"+url.PathEscape(label)+"/values", url.Values{"match[]": {match}}, &values)
	return values, err
}

// headSeries returns how many series Prometheus's head block holds.
func (p *promServer) headSeries() (int, error) {
	var data struct {
		HeadStats struct {
			NumSeries int `json:"numSeries"`
		} `json:"headStats"`
	}
	err := p.api("/api/v1/status/tsdb", nil, &data)
	return data.HeadStats.NumSeries, err
}

// waitFor polls check every 250ms until it reports done, for at most
// timeout, and returns how long that took; on timeout the test fails with
// check's last word on why it was not done.
func waitFor(t *testing.T, what string, timeout time.Duration, check func() (done bool, why string)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		done, why := check()
		if done {
			took := time.Since(start).Round(10 * time.Millisecond)
			t.Logf("%s: after %s", what, took)
			return took
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not after %s: %s", what, timeout, why)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%s: %v", what, t.Context().Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// rulesHealthy reports whether Prometheus has loaded want rule groups, each
// evaluated at least once, every rule healthy.
func rulesHealthy(prom *promServer, want int) (bool, string) {
	groups, err := prom.rules()
	if err != nil {
		return false, err.Error()
	}
	if len(groups) != want {
		return false, fmt.Sprintf("%d rule groups, want %d", len(groups), want)
	}
	n := 0
	for _, g := range groups {
		if g.LastEvaluation.IsZero() || g.Interval != 1 {
			return false, fmt.Sprintf("group %s: interval %gs, last evaluated %v", g.Name, g.Interval, g.LastEvaluation)
		}
		for _, r := range g.Rules {
			if r.Health != "ok" || r.LastEvaluation.IsZero() {
				return false, fmt.Sprintf("rule %s: health %q (%s), last evaluated %v", r.Name, r.Health, r.LastError, r.LastEvaluation)
			}
			n++
		}
	}
	if n != 3 {
		return false, fmt.Sprintf("%d rules, want the chart's 3 alerts", n)
	}
	return true, ""
}

// backendUp reports whether ratelimiter_backend_up of the release is want
// on every pod, and on no other.
func backendUp(prom *promServer, sel string, want float64, pods map[string]corev1.Pod) (bool, string) {
	series, err := prom.query(fmt.Sprintf(`ratelimiter_backend_up{%s}`, sel))
	if err != nil {
		return false, err.Error()
	}
	got := map[string]float64{}
	for _, s := range series {
		got[s.Metric["pod"]] = s.Value
		if s.Metric["backend"] != "redis" {
			return false, fmt.Sprintf("series %v: backend %q, want redis", s.Metric, s.Metric["backend"])
		}
	}
	for name := range pods {
		if v, ok := got[name]; !ok || v != want {
			return false, fmt.Sprintf("by pod %v, want %g on each of %v", got, want, slices.Collect(maps.Keys(pods)))
		}
	}
	return len(got) == len(pods), fmt.Sprintf("by pod %v", got)
}

// targetNames lists targets by pod and address.
func targetNames(targets []promTarget) []string {
	var out []string
	for _, tg := range targets {
		out = append(out, tg.Labels["pod"]+"@"+tg.Labels["instance"])
	}
	return out
}

// memoryOnlySeries is the series only the memory backend exports: the
// per-IP state each pod holds.
const memoryOnlySeries = "ratelimiter_tenants_tracked"

// checkDashboardQueries reads the dashboard from the ConfigMap the chart
// made in the cluster, resolves its variables through Prometheus as
// Grafana would (label_values), and runs every panel's query: each must
// return series for the release, but the one of memoryOnlySeries.
func checkDashboardQueries(t *testing.T, c *testCluster, prom *promServer, ns, job string) {
	t.Helper()
	cms, err := c.kube.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "grafana_dashboard=1"})
	if err != nil || len(cms.Items) != 1 {
		t.Fatalf("the dashboard's ConfigMap: %v, %d found", err, len(cms.Items))
	}
	var d grafanaDashboard
	if err := json.Unmarshal([]byte(cms.Items[0].Data[dashboardKey]), &d); err != nil {
		t.Fatalf("the dashboard in ConfigMap %s: %v", cms.Items[0].Name, err)
	}
	vars := map[string]string{"namespace": ns, "job": job}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := variableQuery(t, v.Query)
		for name, value := range vars {
			q = strings.ReplaceAll(q, "$"+name, value)
		}
		match, label, ok := parseLabelValues(q)
		if !ok {
			t.Errorf("variable %s: query %q is not label_values(series, label)", v.Name, q)
			continue
		}
		values, err := prom.labelValues(match, label)
		if err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
			continue
		}
		if !slices.Contains(values, vars[v.Name]) {
			t.Errorf("variable %s: %s offers %v, not the release's %q", v.Name, q, values, vars[v.Name])
		}
	}
	// Grafana's $__rate_interval is at least four scrape intervals.
	vars["__rate_interval"] = "15s"
	queries := 0
	for _, p := range d.Panels {
		for _, target := range p.Targets {
			q := target.Expr
			for _, name := range []string{"__rate_interval", "namespace", "job"} {
				q = strings.ReplaceAll(q, "$"+name, vars[name])
			}
			series, err := prom.query(q)
			queries++
			switch {
			case err != nil:
				t.Errorf("panel %q: %v", p.Title, err)
			case strings.Contains(q, memoryOnlySeries):
				// The panel says so: with Redis, the tenants' state is not
				// in the pods.
				if len(series) != 0 {
					t.Errorf("panel %q: %d series on the Redis backend, whose pods hold no tenants; its description says it is empty there", p.Title, len(series))
				}
				t.Logf("panel %q: no data on the Redis backend, as its description says", p.Title)
			case len(series) == 0:
				t.Errorf("panel %q: no data for %s", p.Title, q)
			default:
				t.Logf("panel %q: %d series", p.Title, len(series))
			}
		}
	}
	if queries == 0 {
		t.Error("the dashboard has no queries")
	}
}

// parseLabelValues splits Grafana's label_values(match, label).
func parseLabelValues(q string) (match, label string, ok bool) {
	inner, ok := strings.CutPrefix(strings.TrimSpace(q), "label_values(")
	if !ok {
		return "", "", false
	}
	inner, ok = strings.CutSuffix(inner, ")")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndex(inner, ",")
	if i < 0 {
		return "", "", false
	}
	return strings.TrimSpace(inner[:i]), strings.TrimSpace(inner[i+1:]), true
}
