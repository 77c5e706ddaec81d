package helmtest

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)

const (
	// dashboardFile is the Grafana dashboard the chart ships, relative to
	// the chart, and dashboardKey its key in the dashboard's ConfigMap.
	dashboardFile = "dashboards/ratelimiter.json"
	dashboardKey  = "ratelimiter.json"
	// monitoringOn turns on every monitoring object.
	monitoringOn = `metrics:
  serviceMonitor: {enabled: true}
  prometheusRule: {enabled: true}
  grafanaDashboard: {enabled: true}
`
)

// TestMonitoringOffByDefault: the ServiceMonitor, PrometheusRule and
// dashboard are opt-in, since the first two need the Prometheus Operator's
// CRDs, which a cluster may not have.
func TestMonitoringOffByDefault(t *testing.T) {
	t.Parallel()
	m := render(t, valueSet{name: "defaults"})
	if m.ServiceMonitor != nil || m.PrometheusRule != nil || m.Dashboard != nil {
		t.Errorf("defaults: got ServiceMonitor %v, PrometheusRule %v, dashboard %v; want none",
			m.ServiceMonitor != nil, m.PrometheusRule != nil, m.Dashboard != nil)
	}
	on := render(t, valueSet{name: "monitoring on", extra: monitoringOn})
	if on.ServiceMonitor == nil || on.PrometheusRule == nil || on.Dashboard == nil {
		t.Errorf("monitoring on: got ServiceMonitor %v, PrometheusRule %v, dashboard %v; want all three",
			on.ServiceMonitor != nil, on.PrometheusRule != nil, on.Dashboard != nil)
	}
}

// TestServiceMonitorScrapesTheService checks that the ServiceMonitor
// selects the release's Service, in its namespace, and scrapes /metrics on
// the port the container serves it on, with the settings from values.
func TestServiceMonitorScrapesTheService(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values string
		check  func(t *testing.T, ep monitoringv1.Endpoint)
	}{
		{
			name:   "defaults",
			values: "metrics: {serviceMonitor: {enabled: true}}\n",
			check: func(t *testing.T, ep monitoringv1.Endpoint) {
				if ep.Interval != "30s" || ep.ScrapeTimeout != "" || len(ep.RelabelConfigs) != 0 || len(ep.MetricRelabelConfigs) != 0 {
					t.Errorf("got interval %q, timeout %q, relabelings %v, metric relabelings %v; want 30s and nothing else",
						ep.Interval, ep.ScrapeTimeout, ep.RelabelConfigs, ep.MetricRelabelConfigs)
				}
			},
		},
		{
			name: "every setting",
			values: `containerPort: 9090
service: {port: 80}
metrics:
  serviceMonitor:
    enabled: true
    labels: {release: kube-prometheus-stack}
    interval: 1m
    scrapeTimeout: 15s
    relabelings:
      - {sourceLabels: [__meta_kubernetes_pod_node_name], targetLabel: node, action: replace}
    metricRelabelings:
      - {sourceLabels: [__name__], regex: 'go_.*', action: drop}
`,
			check: func(t *testing.T, ep monitoringv1.Endpoint) {
				if ep.Interval != "1m" || ep.ScrapeTimeout != "15s" {
					t.Errorf("got interval %q, timeout %q; want 1m and 15s", ep.Interval, ep.ScrapeTimeout)
				}
				if len(ep.RelabelConfigs) != 1 || ep.RelabelConfigs[0].TargetLabel != "node" ||
					!slices.Equal(ep.RelabelConfigs[0].SourceLabels, []monitoringv1.LabelName{"__meta_kubernetes_pod_node_name"}) {
					t.Errorf("relabelings: got %+v, want the node relabeling", ep.RelabelConfigs)
				}
				if len(ep.MetricRelabelConfigs) != 1 || ep.MetricRelabelConfigs[0].Action != "drop" || ep.MetricRelabelConfigs[0].Regex != "go_.*" {
					t.Errorf("metric relabelings: got %+v, want the go_.* drop", ep.MetricRelabelConfigs)
				}
			},
		},
		{
			name:   "global interval",
			values: "metrics: {serviceMonitor: {enabled: true, interval: ''}}\n",
			check: func(t *testing.T, ep monitoringv1.Endpoint) {
				if ep.Interval != "" {
					t.Errorf("got interval %q, want none (the Prometheus's global interval)", ep.Interval)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vs := valueSet{name: tt.name, extra: tt.values}
			m := render(t, vs)
			sm := m.ServiceMonitor
			if sm == nil {
				t.Fatal("no ServiceMonitor rendered")
			}
			if sm.Namespace != namespace || !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
				t.Errorf("ServiceMonitor in %q selecting namespaces %v, want both %q", sm.Namespace, sm.Spec.NamespaceSelector.MatchNames, namespace)
			}
			for k, v := range sm.Spec.Selector.MatchLabels {
				if m.Service.Labels[k] != v {
					t.Errorf("selector %s=%s: the Service's label is %q", k, v, m.Service.Labels[k])
				}
			}
			if len(sm.Spec.Selector.MatchLabels) == 0 || len(sm.Spec.Selector.MatchExpressions) != 0 {
				t.Errorf("selector %+v: want labels only", sm.Spec.Selector)
			}
			for k, v := range lookup(t, vs.values(t), "metrics", "serviceMonitor", "labels").(map[string]any) {
				if sm.Labels[k] != v {
					t.Errorf("ServiceMonitor label %s: got %q, want %q", k, sm.Labels[k], v)
				}
			}
			if len(sm.Spec.Endpoints) != 1 {
				t.Fatalf("got %d endpoints, want 1", len(sm.Spec.Endpoints))
			}
			ep := sm.Spec.Endpoints[0]
			// The endpoint names a port of the Service, whose target is
			// the container port /metrics is served on.
			var servicePort bool
			for _, p := range m.Service.Spec.Ports {
				if p.Name == ep.Port {
					servicePort = p.TargetPort.String() == "http"
				}
			}
			c := m.container(t)
			var containerPort bool
			for _, p := range c.Ports {
				containerPort = containerPort || (p.Name == "http" && int64(p.ContainerPort) == lookupInt(t, vs.values(t), "containerPort"))
			}
			if !servicePort || !containerPort {
				t.Errorf("endpoint port %q: want the Service port that targets the container's http port (found %v, %v)", ep.Port, servicePort, containerPort)
			}
			if ep.Path != "/metrics" || ep.Scheme == nil || *ep.Scheme != "http" {
				t.Errorf("endpoint: got path %q scheme %v, want http /metrics", ep.Path, ep.Scheme)
			}
			tt.check(t, ep)
		})
	}
}

// alertRules returns the alerting rules of the rendered PrometheusRule, by
// alert name.
func alertRules(t *testing.T, m *manifests) map[string]monitoringv1.Rule {
	t.Helper()
	if m.PrometheusRule == nil {
		t.Fatal("no PrometheusRule rendered")
	}
	rules := map[string]monitoringv1.Rule{}
	for _, g := range m.PrometheusRule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule without an alert name (recording rules are not expected): %+v", g.Name, r)
				continue
			}
			if _, dup := rules[r.Alert]; dup {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			rules[r.Alert] = r
		}
	}
	return rules
}

// TestPrometheusRuleAlerts checks the shape of each alert: a pending
// duration, a severity, a summary and a description, with the values'
// thresholds and selector in the expression, and that each can be left
// out.
func TestPrometheusRuleAlerts(t *testing.T) {
	t.Parallel()
	const defaultSelector = `namespace="limits",job="rel-ratelimiter"`
	tests := []struct {
		name   string
		values string
		want   map[string][]string // alert -> strings its expression contains
		labels map[string]string   // on every alert, severity aside
		for_   map[string]string
	}{
		{
			name:   "defaults",
			values: "metrics: {prometheusRule: {enabled: true}}\n",
			want: map[string][]string{
				"RatelimiterHighDenialRatio":   {defaultSelector, `result="denied"`, `degraded!="true"`, "[5m]", "> 0.5", ">= 1"},
				"RatelimiterDegradedDecisions": {defaultSelector, `degraded="true"`, "[5m]", "> 0.01"},
				"RatelimiterBackendDown":       {"ratelimiter_backend_up{" + defaultSelector + "} == 0"},
			},
			for_: map[string]string{"RatelimiterHighDenialRatio": "15m", "RatelimiterDegradedDecisions": "5m", "RatelimiterBackendDown": "1m"},
		},
		{
			name: "every setting",
			values: `metrics:
  prometheusRule:
    enabled: true
    labels: {release: kube-prometheus-stack}
    selector: 'job="edge",env="prod"'
    alertLabels: {team: platform}
    highDenialRatio: {threshold: 0.8, minRate: 20, window: 10m, for: 30m, severity: info}
    degradedDecisions: {threshold: 0, window: 2m, for: 0s, severity: page}
    backendDown: {for: 3m, severity: warning}
`,
			want: map[string][]string{
				"RatelimiterHighDenialRatio":   {`{job="edge",env="prod",result="denied"`, "[10m]", "> 0.8", ">= 20"},
				"RatelimiterDegradedDecisions": {`{job="edge",env="prod",degraded="true"}[2m]`, "> 0"},
				"RatelimiterBackendDown":       {`ratelimiter_backend_up{job="edge",env="prod"} == 0`},
			},
			labels: map[string]string{"team": "platform"},
			for_:   map[string]string{"RatelimiterHighDenialRatio": "30m", "RatelimiterDegradedDecisions": "0s", "RatelimiterBackendDown": "3m"},
		},
		{
			name:   "backend alert only",
			values: "metrics: {prometheusRule: {enabled: true, highDenialRatio: {enabled: false}, degradedDecisions: {enabled: false}}}\n",
			want:   map[string][]string{"RatelimiterBackendDown": {"== 0"}},
			for_:   map[string]string{"RatelimiterBackendDown": "1m"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vs := valueSet{name: tt.name, extra: tt.values}
			values := vs.values(t)
			m := render(t, vs)
			for k, v := range lookup(t, values, "metrics", "prometheusRule", "labels").(map[string]any) {
				if m.PrometheusRule.Labels[k] != v {
					t.Errorf("PrometheusRule label %s: got %q, want %q", k, m.PrometheusRule.Labels[k], v)
				}
			}
			rules := alertRules(t, m)
			if got, want := slices.Sorted(maps.Keys(rules)), slices.Sorted(maps.Keys(tt.want)); !slices.Equal(got, want) {
				t.Fatalf("alerts: got %v, want %v", got, want)
			}
			severityKey := map[string]string{
				"RatelimiterHighDenialRatio":   "highDenialRatio",
				"RatelimiterDegradedDecisions": "degradedDecisions",
				"RatelimiterBackendDown":       "backendDown",
			}
			for name, r := range rules {
				expr := r.Expr.String()
				for _, want := range tt.want[name] {
					if !strings.Contains(expr, want) {
						t.Errorf("%s: expression\n%s\nlacks %q", name, expr, want)
					}
				}
				if r.For == nil || string(*r.For) != tt.for_[name] {
					t.Errorf("%s: for %v, want %s", name, r.For, tt.for_[name])
				}
				wantLabels := map[string]string{"severity": lookupString(t, values, "metrics", "prometheusRule", severityKey[name], "severity")}
				maps.Copy(wantLabels, tt.labels)
				if !maps.Equal(r.Labels, wantLabels) {
					t.Errorf("%s: labels %v, want %v", name, r.Labels, wantLabels)
				}
				for _, a := range []string{"summary", "description"} {
					if len(strings.TrimSpace(r.Annotations[a])) < 20 || !strings.Contains(r.Annotations[a], "{{ $labels.") {
						t.Errorf("%s: annotation %s = %q, want a sentence naming the labels it is about", name, a, r.Annotations[a])
					}
				}
			}
		})
	}
}

// TestGrafanaDashboardConfigMap checks that the dashboard's ConfigMap holds
// the chart's dashboard file unchanged, with the label Grafana's sidecar
// looks for, settable.
func TestGrafanaDashboardConfigMap(t *testing.T) {
	t.Parallel()
	file, err := os.ReadFile(filepath.Join(chartDir, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, values                 string
		namespace, label, labelValue string
		annotations                  map[string]string
	}{
		{name: "defaults", values: "metrics: {grafanaDashboard: {enabled: true}}\n",
			namespace: namespace, label: "grafana_dashboard", labelValue: "1"},
		{name: "every setting", values: `metrics:
  grafanaDashboard:
    enabled: true
    namespace: monitoring
    label: example.com/dashboard
    labelValue: ratelimiter
    annotations: {grafana_folder: Platform}
`, namespace: "monitoring", label: "example.com/dashboard", labelValue: "ratelimiter", annotations: map[string]string{"grafana_folder": "Platform"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, valueSet{name: tt.name, extra: tt.values})
			d := m.Dashboard
			if d == nil {
				t.Fatal("no dashboard ConfigMap rendered")
			}
			if d.Namespace != tt.namespace || d.Labels[tt.label] != tt.labelValue {
				t.Errorf("got namespace %q, label %s=%q; want %q and %q", d.Namespace, tt.label, d.Labels[tt.label], tt.namespace, tt.labelValue)
			}
			if tt.annotations != nil && !maps.Equal(d.Annotations, tt.annotations) {
				t.Errorf("annotations: got %v, want %v", d.Annotations, tt.annotations)
			}
			if d.Name == m.ConfigMap.Name {
				t.Errorf("the dashboard's ConfigMap has the configuration's name %s", d.Name)
			}
			if got := d.Data[dashboardKey]; got != strings.TrimRight(string(file), "\n") {
				t.Errorf("ConfigMap key %s differs from %s", dashboardKey, dashboardFile)
			}
			if len(d.Data) != 1 {
				t.Errorf("got keys %v, want only %s", slices.Collect(maps.Keys(d.Data)), dashboardKey)
			}
		})
	}
}

// grafanaDashboard is the part of a Grafana dashboard the tests read.
type grafanaDashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"` // a string, or {query: ...}
			Datasource *grafanaSource  `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int            `json:"id"`
		Title      string         `json:"title"`
		Type       string         `json:"type"`
		Datasource *grafanaSource `json:"datasource"`
		Targets    []struct {
			Expr       string         `json:"expr"`
			Datasource *grafanaSource `json:"datasource"`
		} `json:"targets"`
		FieldConfig struct {
			Defaults struct {
				Unit string `json:"unit"`
			} `json:"defaults"`
		} `json:"fieldConfig"`
	} `json:"panels"`
}

type grafanaSource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func readDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// variableQuery returns the query of a templating variable, which Grafana
// stores as a string or as an object holding it.
func variableQuery(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var q struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(raw, &q); err != nil {
		t.Fatalf("variable query %s: %v", raw, err)
	}
	return q.Query
}

// TestDashboardShape checks what makes the dashboard importable anywhere:
// a fixed uid, a Prometheus data source variable that every panel and
// query uses (no data source of the author's), the panels the chart's
// values promise, each with a query and a unit, and ids that differ.
func TestDashboardShape(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: want both", d.UID, d.Title)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "datasource" && variableQuery(t, v.Query) != "prometheus" {
			t.Errorf("variable %s: a data source variable of type %s, want prometheus", v.Name, variableQuery(t, v.Query))
		}
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			t.Errorf("variable %s: data source %+v, want ${datasource}", v.Name, v.Datasource)
		}
	}
	if vars["datasource"] != "datasource" || vars["namespace"] != "query" || vars["job"] != "query" {
		t.Errorf("variables %v: want datasource, namespace and job", vars)
	}
	ids := map[int]bool{}
	var titles []string
	for _, p := range d.Panels {
		titles = append(titles, p.Title)
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: data source %+v, want ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 || p.FieldConfig.Defaults.Unit == "" {
			t.Errorf("panel %q: %d queries, unit %q; want a query and a unit", p.Title, len(p.Targets), p.FieldConfig.Defaults.Unit)
		}
		for _, q := range p.Targets {
			if q.Datasource == nil || q.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: a query's data source is %+v, want ${datasource}", p.Title, q.Datasource)
			}
			if !strings.Contains(q.Expr, `namespace="$namespace"`) || !strings.Contains(q.Expr, `job="$job"`) {
				t.Errorf("panel %q: query %q does not select $namespace and $job", p.Title, q.Expr)
			}
		}
	}
	for _, want := range []string{"Decisions per second by result", "Denial ratio by limiter", "Permits per second by result",
		"Degraded decisions per second", "Backend up by pod", "Request latency by operation (p50, p99)", "Tenants tracked"} {
		if !slices.Contains(titles, want) {
			t.Errorf("no panel %q in %v", want, titles)
		}
	}
}
