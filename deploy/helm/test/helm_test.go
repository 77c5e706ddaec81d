// Package helmtest checks the Helm chart in ../ratelimiter: helm lint, strict
// validation of the rendered manifests against the Kubernetes API's schemas,
// and properties of the rendered objects, such as that the service accepts
// the configuration the chart gives it.
//
// helm and kubeconform are tool dependencies of this module (go.mod); the
// tests build them, or take them from the build cache, with go tool -n. A
// tool that cannot be built fails the tests.
package helmtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"

	"github.com/ratelimiter/ratelimiter/deploy/helm/test/kubeschema"
)

const (
	// chartDir is the chart, relative to this package's directory, where
	// go test runs the tests.
	chartDir    = "../ratelimiter"
	releaseName = "rel"
	namespace   = "limits"
	// kubeVersion is the Kubernetes version the chart is rendered for, the
	// one whose API schemas the manifests are checked against. helm built
	// from source assumes v1.20.0 when not told, below the chart's
	// kubeVersion.
	kubeVersion = kubeschema.DefaultVersion
)

var (
	helmPath        = sync.OnceValues(func() (string, error) { return toolPath("helm") })
	kubeconformPath = sync.OnceValues(func() (string, error) { return toolPath("kubeconform") })
)

// toolPath returns the path of the executable of a tool that go.mod
// declares, building it first if the build cache does not hold it.
func toolPath(name string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("go", "tool", "-n", name)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go tool -n %s: %w: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	path := strings.TrimSpace(string(out))
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("go tool -n %s printed %q: %w", name, path, err)
	}
	return path, nil
}

// tool returns the path of the named tool's executable, failing the test
// when it cannot be built.
func tool(t *testing.T, path func() (string, error)) string {
	t.Helper()
	p, err := path()
	if err != nil {
		t.Fatalf("tool not available: %v", err)
	}
	return p
}

// runHelm runs helm with args, isolated from the user's Helm configuration,
// and returns its standard output; the error carries its standard error.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(tool(t, helmPath), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "kubeconfig"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("run helm %s: %v", strings.Join(args, " "), err)
		}
		return stdout.String(), fmt.Errorf("helm %s: %w:\n%s", args[0], err, stderr.String())
	}
	return stdout.String(), nil
}

// valueSet is one way to install the chart: values files applied in order
// over the chart's values.yaml, then extra, YAML text.
type valueSet struct {
	name  string
	files []string
	extra string
}

// args returns the --values flags of vs, writing extra to a file.
func (vs valueSet) args(t *testing.T) []string {
	t.Helper()
	var args []string
	for _, f := range vs.files {
		args = append(args, "--values", f)
	}
	if vs.extra != "" {
		// Not in t.TempDir, whose name comes from the test's and may hold
		// a comma: helm splits --values at commas.
		f, err := os.CreateTemp("", "extra-values-*.yaml")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(f.Name()) })
		if _, err := f.WriteString(vs.extra); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--values", f.Name())
	}
	return args
}

// values returns the values vs gives the chart, merged as Helm merges them.
func (vs valueSet) values(t *testing.T) map[string]any {
	t.Helper()
	merged := readValues(t, filepath.Join(chartDir, "values.yaml"))
	for _, f := range vs.files {
		mergeValues(merged, readValues(t, f))
	}
	if vs.extra != "" {
		var extra map[string]any
		if err := yaml.Unmarshal([]byte(vs.extra), &extra); err != nil {
			t.Fatalf("extra values of %s: %v", vs.name, err)
		}
		mergeValues(merged, extra)
	}
	return merged
}

func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// mergeValues merges src into dst: maps key by key, anything else replaced.
func mergeValues(dst, src map[string]any) {
	for k, sv := range src {
		sm, sok := sv.(map[string]any)
		dm, dok := dst[k].(map[string]any)
		if sok && dok {
			mergeValues(dm, sm)
			continue
		}
		dst[k] = sv
	}
}

// lookup returns the value at the path of keys in values, failing the test
// when it is missing.
func lookup(t *testing.T, values map[string]any, keys ...string) any {
	t.Helper()
	var v any = values
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("values: %s is not a map", strings.Join(keys, "."))
		}
		if v, ok = m[k]; !ok {
			t.Fatalf("values: no %s", strings.Join(keys, "."))
		}
	}
	return v
}

// lookupInt is lookup for a number: every number in values is a float64.
func lookupInt(t *testing.T, values map[string]any, keys ...string) int64 {
	t.Helper()
	f, ok := lookup(t, values, keys...).(float64)
	if !ok {
		t.Fatalf("values: %s is not a number", strings.Join(keys, "."))
	}
	return int64(f)
}

func lookupString(t *testing.T, values map[string]any, keys ...string) string {
	t.Helper()
	s, ok := lookup(t, values, keys...).(string)
	if !ok {
		t.Fatalf("values: %s is not a string", strings.Join(keys, "."))
	}
	return s
}

// ciValueSets returns a valueSet for each ci/*-values.yaml file of the
// chart.
func ciValueSets(t *testing.T) []valueSet {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 6 {
		t.Fatalf("got %d ci/*-values.yaml files, want at least 6", len(files))
	}
	sets := make([]valueSet, len(files))
	for i, f := range files {
		sets[i] = valueSet{name: "ci/" + filepath.Base(f), files: []string{f}}
	}
	return sets
}

// allValueSets is the chart's defaults followed by the ci files.
func allValueSets(t *testing.T) []valueSet {
	t.Helper()
	return append([]valueSet{{name: "defaults"}}, ciValueSets(t)...)
}

// template runs helm template for vs and returns the manifests as text.
func template(t *testing.T, vs valueSet) (string, error) {
	t.Helper()
	args := []string{"template", releaseName, chartDir, "--namespace", namespace, "--kube-version", kubeVersion}
	return runHelm(t, append(args, vs.args(t)...)...)
}

// manifests are the objects a render produced, decoded strictly: a field
// the Kubernetes types do not have fails the test.
type manifests struct {
	docs [][]byte // every object, in the order rendered

	Deployment     *appsv1.Deployment
	Service        *corev1.Service
	ServiceAccount *corev1.ServiceAccount
	ConfigMap      *corev1.ConfigMap         // the service's configuration file
	EnvoyConfigMap *corev1.ConfigMap         // the rules of envoy.config
	Secrets        map[string]*corev1.Secret // by name
	PDB            *policyv1.PodDisruptionBudget
	HPA            *autoscalingv2.HorizontalPodAutoscaler
	NetworkPolicy  *networkingv1.NetworkPolicy
	TestPod        *corev1.Pod
	PVC            *corev1.PersistentVolumeClaim // the data directory's, with persistence

	// The optional monitoring objects: the Prometheus Operator's custom
	// resources, decoded strictly into the operator's own Go types, and
	// the ConfigMap holding the Grafana dashboard.
	ServiceMonitor *monitoringv1.ServiceMonitor
	PrometheusRule *monitoringv1.PrometheusRule
	Dashboard      *corev1.ConfigMap
}

// render renders the chart with vs and decodes the result. The Deployment,
// Service, ConfigMap and test pod are always there.
func render(t *testing.T, vs valueSet) *manifests {
	t.Helper()
	out, err := template(t, vs)
	if err != nil {
		t.Fatal(err)
	}
	m := decode(t, out)
	if m.Deployment == nil || m.Service == nil || m.ConfigMap == nil || m.TestPod == nil {
		t.Fatalf("%s: got no Deployment, Service, ConfigMap or test Pod in:\n%s", vs.name, out)
	}
	return m
}

func decode(t *testing.T, out string) *manifests {
	t.Helper()
	m := &manifests{Secrets: make(map[string]*corev1.Secret)}
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(out)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("split manifests: %v", err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("manifest: %v\n%s", err, doc)
		}
		if meta.Kind == "" && len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		m.docs = append(m.docs, doc)
		var dst any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			dst = into(t, &m.Deployment)
		case "v1 Service":
			dst = into(t, &m.Service)
		case "v1 ServiceAccount":
			dst = into(t, &m.ServiceAccount)
		case "v1 ConfigMap":
			// The configuration file's, the Envoy rules' and the
			// dashboard's, told apart by their data and name.
			var cm corev1.ConfigMap
			if err := yaml.Unmarshal(doc, &cm); err != nil {
				t.Fatalf("decode ConfigMap: %v\n%s", err, doc)
			}
			switch _, dashboard := cm.Data[dashboardKey]; {
			case dashboard:
				dst = into(t, &m.Dashboard)
			case strings.HasSuffix(cm.Name, envoyConfigMapSuffix):
				dst = into(t, &m.EnvoyConfigMap)
			default:
				dst = into(t, &m.ConfigMap)
			}
		case "monitoring.coreos.com/v1 ServiceMonitor":
			dst = into(t, &m.ServiceMonitor)
		case "monitoring.coreos.com/v1 PrometheusRule":
			dst = into(t, &m.PrometheusRule)
		case "v1 Secret":
			// The chart may make several Secrets, one for each value.
			dst = new(corev1.Secret)
		case "policy/v1 PodDisruptionBudget":
			dst = into(t, &m.PDB)
		case "autoscaling/v2 HorizontalPodAutoscaler":
			dst = into(t, &m.HPA)
		case "networking.k8s.io/v1 NetworkPolicy":
			dst = into(t, &m.NetworkPolicy)
		case "v1 Pod":
			dst = into(t, &m.TestPod)
		case "v1 PersistentVolumeClaim":
			dst = into(t, &m.PVC)
		default:
			t.Fatalf("unexpected object %s %s", meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, dst); err != nil {
			t.Fatalf("decode %s strictly: %v\n%s", meta.Kind, err, doc)
		}
		if s, ok := dst.(*corev1.Secret); ok {
			if _, dup := m.Secrets[s.Name]; dup {
				t.Fatalf("two Secrets named %s", s.Name)
			}
			m.Secrets[s.Name] = s
		}
	}
	return m
}

// into allocates *p, failing the test if a previous object already did:
// the chart renders at most one object of each kind but Secret.
func into[T any](t *testing.T, p **T) *T {
	t.Helper()
	if *p != nil {
		var zero T
		t.Fatalf("two objects of type %T", zero)
	}
	*p = new(T)
	return *p
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for line := range strings.Lines(string(doc)) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.Bytes()
}

// container returns the Deployment's only container.
func (m *manifests) container(t *testing.T) corev1.Container {
	t.Helper()
	cs := m.Deployment.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("got %d containers, want 1", len(cs))
	}
	return cs[0]
}

// env returns the container's environment: the value of each variable that
// has one, and whether it is set at all.
func env(c corev1.Container) map[string]corev1.EnvVar {
	m := make(map[string]corev1.EnvVar, len(c.Env))
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

// envNames returns the names of the variables in e whose name has prefix,
// sorted.
func envNames(e map[string]corev1.EnvVar, prefix string) []string {
	var names []string
	for n := range maps.Keys(e) {
		if strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// mustFail renders vs, expecting helm to refuse it, and returns its error
// text.
func mustFail(t *testing.T, vs valueSet) string {
	t.Helper()
	out, err := template(t, vs)
	if err == nil {
		t.Fatalf("%s: helm template succeeded, want an error; output:\n%s", vs.name, out)
	}
	return err.Error()
}
