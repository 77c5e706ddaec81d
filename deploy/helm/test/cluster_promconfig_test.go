//go:build cluster

// What TestClusterPrometheus gives Prometheus: the Prometheus Operator's
// CRDs in the cluster, the scrape job the operator would make of the
// chart's ServiceMonitor, with the Kubernetes discovery it needs, and the
// labels the chart's alerts select by.

package helmtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	crd "github.com/prometheus-operator/prometheus-operator/example"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/discovery"
	"github.com/prometheus/prometheus/discovery/kubernetes"
	"github.com/prometheus/prometheus/discovery/targetgroup"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	yamlv2 "go.yaml.in/yaml/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

var (
	crdResource  = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	smResource   = monitoringv1.SchemeGroupVersion.WithResource(monitoringv1.ServiceMonitorName)
	ruleResource = monitoringv1.SchemeGroupVersion.WithResource(monitoringv1.PrometheusRuleName)
)

// ensureOperatorCRDs creates the ServiceMonitor and PrometheusRule CRDs from
// the Prometheus Operator's CRD files unless the cluster has them, waits
// until they are served, and deletes the ones it created when the test
// ends (after the test's namespaces, whose cleanups run first when they
// are registered later).
func ensureOperatorCRDs(t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	var all bytes.Buffer
	if err := crd.PrintAll(&all); err != nil {
		t.Fatalf("the Prometheus Operator's CRDs: %v", err)
	}
	crds := dyn.Resource(crdResource)
	want := []string{smResource.GroupResource().String(), ruleResource.GroupResource().String()}
	dec := yaml.NewYAMLOrJSONDecoder(&all, 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("the Prometheus Operator's CRD files: %v", err)
		}
		if obj.GetKind() != "CustomResourceDefinition" || !slices.Contains(want, obj.GetName()) {
			continue
		}
		want = slices.DeleteFunc(want, func(n string) bool { return n == obj.GetName() })
		_, err := crds.Create(t.Context(), &obj, metav1.CreateOptions{})
		switch {
		case apierrors.IsAlreadyExists(err):
			t.Logf("CRD %s already in the cluster: kept", obj.GetName())
			continue
		case err != nil:
			t.Fatalf("create CRD %s: %v", obj.GetName(), err)
		}
		name := obj.GetName()
		t.Logf("created CRD %s (operator %s)", name, obj.GetAnnotations()["operator.prometheus.io/version"])
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := crds.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete CRD %s: %v", name, err)
			}
		})
		waitFor(t, "CRD "+name+" established", 30*time.Second, func() (bool, string) {
			got, err := crds.Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			conditions, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conditions {
				if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return true, ""
				}
			}
			return false, fmt.Sprintf("conditions %v", conditions)
		})
	}
	if len(want) != 0 {
		t.Fatalf("the Prometheus Operator's CRD files have no %v", want)
	}
}

// invalidLabelChars is what the operator replaces with _ to make a
// Kubernetes label name a Prometheus label name.
var invalidLabelChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// scrapeJobs are the scrape jobs the Prometheus Operator makes of a
// ServiceMonitor as the API server stores it, one per endpoint:
// generateServiceMonitorConfig in pkg/prometheus/promcfg.go of the
// operator's module (the version go.mod pins), with its defaults (the
// endpoints role, the label selector as relabelling, one shard), for the
// fields the chart can set. Prometheus reaches the API server through
// kubeconfig instead of a pod's service account. A field set that this
// translation does not know fails the test, so that the jobs never
// silently differ from what the operator would run.
func scrapeJobs(t *testing.T, u *unstructured.Unstructured, kubeconfig string) []map[string]any {
	t.Helper()
	var sm monitoringv1.ServiceMonitor
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &sm); err != nil {
		t.Fatalf("decode ServiceMonitor %s: %v", u.GetName(), err)
	}
	checkKnown(t, u.Object, []string{"spec"}, "selector", "namespaceSelector", "endpoints")
	checkKnown(t, u.Object, []string{"spec", "selector"}, "matchLabels")
	checkKnown(t, u.Object, []string{"spec", "namespaceSelector"}, "matchNames")
	endpoints, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
	var jobs []map[string]any
	for i, ep := range sm.Spec.Endpoints {
		m, _ := endpoints[i].(map[string]any)
		checkKnown(t, map[string]any{"ep": m}, []string{"ep"}, "port", "path", "scheme", "interval", "scrapeTimeout", "relabelings", "metricRelabelings")
		jobs = append(jobs, scrapeJob(t, &sm, i, ep, kubeconfig))
	}
	return jobs
}

func scrapeJob(t *testing.T, sm *monitoringv1.ServiceMonitor, i int, ep monitoringv1.Endpoint, kubeconfig string) map[string]any {
	t.Helper()
	if ep.Port == "" {
		t.Fatalf("ServiceMonitor %s: endpoint %d has no port name", sm.Name, i)
	}
	relabel := []map[string]any{
		{"source_labels": []string{"job"}, "target_label": "__tmp_prometheus_job_name"},
	}
	for _, k := range slices.Sorted(maps.Keys(sm.Spec.Selector.MatchLabels)) {
		name := invalidLabelChars.ReplaceAllString(k, "_")
		relabel = append(relabel, map[string]any{
			"action":        "keep",
			"source_labels": []string{"__meta_kubernetes_service_label_" + name, "__meta_kubernetes_service_labelpresent_" + name},
			"regex":         fmt.Sprintf("(%s);true", sm.Spec.Selector.MatchLabels[k]),
		})
	}
	target := []string{"__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"}
	relabel = append(relabel,
		map[string]any{"action": "keep", "source_labels": []string{"__meta_kubernetes_endpoint_port_name"}, "regex": ep.Port},
		map[string]any{"source_labels": target, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
		map[string]any{"source_labels": target, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_service_name"}, "target_label": "service"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_pod_container_name"}, "target_label": "container"},
		map[string]any{"action": "drop", "source_labels": []string{"__meta_kubernetes_pod_phase"}, "regex": "(Failed|Succeeded)"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_service_name"}, "target_label": "job", "replacement": "${1}"},
		map[string]any{"target_label": "endpoint", "replacement": ep.Port},
	)
	relabel = append(relabel, relabelConfigs(ep.RelabelConfigs)...)
	// The operator's sharding; its config reloader puts the pod's shard
	// number, 0 for a single shard, in place of $(SHARD).
	relabel = append(relabel,
		map[string]any{"source_labels": []string{"__address__", "__tmp_disable_sharding"}, "target_label": "__tmp_hash", "regex": "(.+);", "replacement": "$1", "action": "replace"},
		map[string]any{"source_labels": []string{"__tmp_hash"}, "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
		map[string]any{"source_labels": []string{"__tmp_hash", "__tmp_disable_sharding"}, "regex": "0;|.+;.+", "action": "keep"},
	)

	sd := map[string]any{"role": "endpoints", "kubeconfig_file": kubeconfig}
	namespaces := sm.Spec.NamespaceSelector.MatchNames
	if len(namespaces) == 0 {
		namespaces = []string{sm.Namespace}
	}
	sd["namespaces"] = map[string]any{"names": namespaces}
	job := map[string]any{
		"job_name":              fmt.Sprintf("serviceMonitor/%s/%s/%d", sm.Namespace, sm.Name, i),
		"honor_labels":          false,
		"kubernetes_sd_configs": []any{sd},
		"relabel_configs":       relabel,
	}
	if ep.Interval != "" {
		job["scrape_interval"] = string(ep.Interval)
	}
	if ep.ScrapeTimeout != "" {
		job["scrape_timeout"] = string(ep.ScrapeTimeout)
	}
	if ep.Path != "" {
		job["metrics_path"] = ep.Path
	}
	if ep.Scheme != nil {
		job["scheme"] = ep.Scheme.String()
	}
	if m := relabelConfigs(ep.MetricRelabelConfigs); len(m) > 0 {
		job["metric_relabel_configs"] = m
	}
	return job
}

// checkKnown fails the test if the object at path in obj has a key
// outside known.
func checkKnown(t *testing.T, obj map[string]any, path []string, known ...string) {
	t.Helper()
	m, _, err := unstructured.NestedMap(obj, path...)
	if err != nil {
		t.Fatalf("ServiceMonitor %s: %v", strings.Join(path, "."), err)
	}
	for k := range m {
		if !slices.Contains(known, k) {
			t.Fatalf("the ServiceMonitor's %s sets %s, which scrapeJob does not translate: teach it how the operator does", strings.Join(path, "."), k)
		}
	}
}

// relabelConfigs writes the operator's RelabelConfig objects as Prometheus
// relabel_configs.
func relabelConfigs(rcs []monitoringv1.RelabelConfig) []map[string]any {
	var out []map[string]any
	for _, rc := range rcs {
		m := map[string]any{}
		if len(rc.SourceLabels) > 0 {
			m["source_labels"] = rc.SourceLabels
		}
		if rc.Separator != nil {
			m["separator"] = *rc.Separator
		}
		if rc.TargetLabel != "" {
			m["target_label"] = rc.TargetLabel
		}
		if rc.Regex != "" {
			m["regex"] = rc.Regex
		}
		if rc.Modulus != 0 {
			m["modulus"] = rc.Modulus
		}
		if rc.Replacement != nil {
			m["replacement"] = *rc.Replacement
		}
		if rc.Action != "" {
			m["action"] = rc.Action
		}
		out = append(out, m)
	}
	return out
}

// kubernetesSDToFiles runs the kubernetes_sd_configs of a scrape job in
// this process, with Prometheus's own Kubernetes discovery (the
// prometheus/prometheus module go.mod pins), and hands the targets it finds,
// with all their __meta_kubernetes_* labels, to Prometheus through
// file_sd_configs in dir, which replace them in the job. Debian builds its
// prometheus without the Kubernetes discovery (its client library's
// dependencies are not packaged), so kubernetes_sd_configs does not parse
// there; the relabelling, the scrapes and the rules are still Debian's
// Prometheus's own work. The discovery stops when the test ends.
func kubernetesSDToFiles(t *testing.T, dir string, job map[string]any) {
	t.Helper()
	sds, _ := job["kubernetes_sd_configs"].([]any)
	if len(sds) == 0 {
		t.Fatalf("scrape job %v has no kubernetes_sd_configs", job["job_name"])
	}
	var files []string
	for i, raw := range sds {
		b, err := yamlv2.Marshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		var sd kubernetes.SDConfig
		if err := yamlv2.UnmarshalStrict(b, &sd); err != nil {
			t.Fatalf("kubernetes_sd_configs[%d] of %v: %v\n%s", i, job["job_name"], err, b)
		}
		metrics := sd.NewDiscovererMetrics(promclient.NewRegistry(), discovery.NewRefreshMetrics(promclient.NewRegistry()))
		if err := metrics.Register(); err != nil {
			t.Fatal(err)
		}
		base := filepath.Join(dir, fmt.Sprintf("sd-%s-%d", invalidLabelChars.ReplaceAllString(fmt.Sprint(job["job_name"]), "_"), i))
		logFile, err := os.Create(base + ".log")
		if err != nil {
			t.Fatal(err)
		}
		d, err := sd.NewDiscoverer(discovery.DiscovererOptions{Logger: slog.New(slog.NewTextHandler(logFile, nil)), Metrics: metrics})
		if err != nil {
			t.Fatalf("kubernetes discovery %d of %v: %v", i, job["job_name"], err)
		}
		path := base + ".json"
		if err := writeTargetFile(path, nil); err != nil {
			t.Fatal(err)
		}
		files = append(files, path)

		ctx, cancel := context.WithCancel(context.Background())
		updates := make(chan []*targetgroup.Group)
		done := make(chan struct{})
		go d.Run(ctx, updates)
		go func() {
			defer close(done)
			groups := map[string]*targetgroup.Group{}
			for {
				select {
				case <-ctx.Done():
					return
				case tgs := <-updates:
					for _, tg := range tgs {
						groups[tg.Source] = tg
					}
					if err := writeTargetFile(path, groups); err != nil {
						t.Errorf("write %s: %v", path, err)
					}
				}
			}
		}()
		t.Cleanup(func() {
			cancel()
			<-done
			metrics.Unregister()
			logFile.Close()
			if t.Failed() {
				t.Logf("targets discovered, %s:\n%s\nlast lines of %s.log:\n%s", path, tail(path, 60), base, tail(base+".log", 20))
			}
		})
	}
	delete(job, "kubernetes_sd_configs")
	job["file_sd_configs"] = []any{map[string]any{"files": files, "refresh_interval": "1s"}}
}

// writeTargetFile writes target groups as a file_sd file, one entry per
// target with its group's labels and its own, replacing the file at once.
func writeTargetFile(path string, groups map[string]*targetgroup.Group) error {
	type entry struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	entries := []entry{}
	for _, source := range slices.Sorted(maps.Keys(groups)) {
		tg := groups[source]
		for _, target := range tg.Targets {
			lbls := map[string]string{}
			for k, v := range tg.Labels {
				lbls[string(k)] = string(v)
			}
			for k, v := range target {
				lbls[string(k)] = string(v)
			}
			addr := lbls[model.AddressLabel]
			delete(lbls, model.AddressLabel)
			entries = append(entries, entry{Targets: []string{addr}, Labels: lbls})
		}
	}
	b, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ruleSelectors returns the label matchers every alert's expression
// applies to every series it selects, other than the series name: what
// the scrape must give the release's series for the alerts to see them.
func ruleSelectors(t *testing.T, groups []any) []*labels.Matcher {
	t.Helper()
	var common []*labels.Matcher
	first := true
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			expr, _, _ := unstructured.NestedString(r.(map[string]any), "expr")
			parsed, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
			if err != nil {
				t.Fatalf("rule expression %q: %v", expr, err)
			}
			parser.Inspect(parsed, func(n parser.Node, _ []parser.Node) error {
				vs, ok := n.(*parser.VectorSelector)
				if !ok {
					return nil
				}
				var these []*labels.Matcher
				for _, m := range vs.LabelMatchers {
					if m.Name != labels.MetricName {
						these = append(these, m)
					}
				}
				if first {
					common, first = these, false
					return nil
				}
				common = slices.DeleteFunc(common, func(m *labels.Matcher) bool {
					return !slices.ContainsFunc(these, func(o *labels.Matcher) bool { return o.String() == m.String() })
				})
				return nil
			})
		}
	}
	names := map[string]bool{}
	for _, m := range common {
		names[m.Name] = true
	}
	if !names["namespace"] || !names["job"] {
		t.Fatalf("the alerts' common matchers %v do not select by namespace and job", common)
	}
	return common
}
