package helmtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ratelimiter/ratelimiter/deploy/helm/test/kubeschema"
)

// schemaDir holds the JSON schemas of the Kubernetes API kinds, generated
// once per test run from the k8s.io/kubernetes module's swagger.json, and
// removed by TestMain.
var schemaDir = sync.OnceValues(func() (string, error) {
	swagger, err := kubeschema.SwaggerPath(kubeVersion)
	if err != nil {
		return "", err
	}
	doc, err := os.ReadFile(swagger)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "k8s-schemas-")
	if err != nil {
		return "", err
	}
	schemaDirs.Store(dir, true)
	kinds, err := kubeschema.Generate(doc, dir, nil)
	if err != nil {
		return "", err
	}
	if len(kinds) < 100 {
		return "", fmt.Errorf("generated %d schemas from %s, want the whole API", len(kinds), swagger)
	}
	return dir, nil
})

// schemaDirs remembers the directory schemaDir made, for TestMain to remove.
var schemaDirs sync.Map

func TestMain(m *testing.M) {
	code := m.Run()
	schemaDirs.Range(func(dir, _ any) bool {
		os.RemoveAll(dir.(string))
		return true
	})
	os.Exit(code)
}

// crdKinds are the kinds the chart renders that are not built into
// Kubernetes, as apiVersion/kind: kubeconform skips them.
var crdKinds = []string{"monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule"}

// kubeconformResult is one resource of kubeconform's JSON output.
type kubeconformResult struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Version string `json:"version"`
	Status  string `json:"status"`
	Msg     string `json:"msg"`
}

// kubeconform validates the manifests strictly against the generated
// schemas only (never a remote location) and returns a result for every
// resource, valid ones included.
func kubeconform(t *testing.T, manifests string) []kubeconformResult {
	t.Helper()
	dir, err := schemaDir()
	if err != nil {
		t.Fatalf("Kubernetes schemas: %v", err)
	}
	cmd := exec.Command(tool(t, kubeconformPath),
		"-strict",
		// The generated schemas are the Kubernetes API's own kinds; the
		// Prometheus Operator's are decoded strictly into its Go types
		// (decode), and installed into a real API server that validates
		// them against their CRDs (install_test.go).
		"-skip", strings.Join(crdKinds, ","),
		"-schema-location", filepath.Join(dir, "{{ .ResourceKind }}{{ .KindSuffix }}.json"),
		"-output", "json",
		"-verbose",
		"-")
	cmd.Stdin = strings.NewReader(manifests)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run kubeconform: %v", err)
	}
	var out struct {
		Resources []kubeconformResult `json:"resources"`
	}
	if jerr := json.Unmarshal(stdout.Bytes(), &out); jerr != nil {
		t.Fatalf("kubeconform output: %v (exit: %v)\n%s\n%s", jerr, err, stdout.String(), stderr.String())
	}
	invalid := false
	for _, r := range out.Resources {
		invalid = invalid || (r.Status != "statusValid" && r.Status != "statusSkipped")
	}
	if invalid != (err != nil) {
		t.Fatalf("kubeconform exited with %v, inconsistent with its results %+v", err, out.Resources)
	}
	return out.Resources
}

// TestManifestsMatchKubernetesSchemas validates every object the chart
// renders, with its defaults, with each ci values file and with the other
// shapes of the persistence volume, against the Kubernetes API schemas,
// strictly: unknown fields, wrong types and null values are errors, and so
// is a kind with no schema.
func TestManifestsMatchKubernetesSchemas(t *testing.T) {
	t.Parallel()
	sets := append(allValueSets(t),
		valueSet{name: "persistence with the defaults", extra: "persistence: {enabled: true}\n"},
		valueSet{name: "persistence without a StorageClass", extra: "persistence: {enabled: true, storageClassName: '-', accessModes: [ReadWriteOnce, ReadWriteMany]}\n"},
		valueSet{name: "persistence on an existing claim", extra: "persistence: {enabled: true, existingClaim: limits-data}\n"},
		valueSet{name: "tokens and TLS", extra: "tokens: {existingSecret: rl-tokens}\ntls: {existingSecret: web-tls}\nmetrics: {serviceMonitor: {enabled: true, tlsConfig: {insecureSkipVerify: true}}}\n"},
		valueSet{name: "TLS with client certificates", extra: "tls: {existingSecret: web-tls, clientAuth: true}\n"},
	)
	for _, vs := range sets {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			out, err := template(t, vs)
			if err != nil {
				t.Fatal(err)
			}
			m := decode(t, out)
			results := kubeconform(t, out)
			if len(results) != len(m.docs) {
				t.Errorf("kubeconform checked %d resources, want %d (every rendered object)", len(results), len(m.docs))
			}
			for _, r := range results {
				skipped := r.Status == "statusSkipped" && slices.Contains(crdKinds, r.Version+"/"+r.Kind)
				if r.Status != "statusValid" && !skipped {
					t.Errorf("%s %s %s: got %s: %s", r.Version, r.Kind, r.Name, r.Status, r.Msg)
				}
			}
		})
	}
}

// TestKubeconformRejectsBrokenManifests makes sure the validation above can
// fail: a valid object passes, and the same object broken in one way fails
// with a message naming the problem.
func TestKubeconformRejectsBrokenManifests(t *testing.T) {
	t.Parallel()
	const valid = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: web
          image: web:1
          ports:
            - name: http
              containerPort: 8080
          resources:
            requests: {cpu: 100m, memory: 64Mi}
          readinessProbe:
            httpGet: {path: /readyz, port: http}
`
	tests := []struct {
		name     string
		old, new string // replaced in valid
		wantMsg  string // "" means valid
	}{
		{name: "valid", wantMsg: ""},
		{name: "quantity as a number", old: "cpu: 100m", new: "cpu: 1", wantMsg: ""},
		{name: "probe port as a number", old: "port: http}", new: "port: 8080}", wantMsg: ""},
		{name: "probe port as an object", old: "port: http}", new: "port: {name: http}}", wantMsg: "/port'"},
		{name: "unknown field", old: "  replicas: 1", new: "  replicas: 1\n  replica: 2", wantMsg: "additional properties 'replica' not allowed"},
		{name: "unknown nested field", old: "          image: web:1", new: "          image: web:1\n          imagePullPolicyy: Always", wantMsg: "additional properties 'imagePullPolicyy' not allowed"},
		{name: "wrong type", old: "replicas: 1", new: "replicas: one", wantMsg: "/spec/replicas': got string, want integer"},
		{name: "port of wrong type", old: "containerPort: 8080", new: "containerPort: [8080]", wantMsg: "/containerPort': got array, want integer"},
		{name: "null", old: "image: web:1", new: "image: null", wantMsg: "/image': got null, want string"},
		{name: "missing required field", old: "        - name: web\n", new: "        -\n", wantMsg: "missing property 'name'"},
		{name: "duplicate key", old: "  replicas: 1", new: "  replicas: 1\n  replicas: 2", wantMsg: "already set"},
		{name: "unknown kind", old: "kind: Deployment", new: "kind: Deploymint", wantMsg: "could not find schema for Deploymint"},
		{name: "unknown version", old: "apps/v1", new: "apps/v2", wantMsg: "could not find schema for Deployment"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := valid
			if tt.old != "" {
				if !strings.Contains(doc, tt.old) {
					t.Fatalf("test bug: %q not in the manifest", tt.old)
				}
				doc = strings.Replace(doc, tt.old, tt.new, 1)
			}
			results := kubeconform(t, doc)
			if len(results) != 1 {
				t.Fatalf("got %d results, want 1: %+v", len(results), results)
			}
			r := results[0]
			if tt.wantMsg == "" {
				if r.Status != "statusValid" {
					t.Errorf("got %s: %s, want valid", r.Status, r.Msg)
				}
				return
			}
			if r.Status == "statusValid" {
				t.Fatalf("got valid, want an error containing %q", tt.wantMsg)
			}
			if !strings.Contains(r.Msg, tt.wantMsg) {
				t.Errorf("got %s: %s, want a message containing %q", r.Status, r.Msg, tt.wantMsg)
			}
		})
	}
}

// TestKubeconformSkipsOnlyTheOperatorKinds: the skip list covers the
// Prometheus Operator's two kinds in their own group and version, and no
// other kind of the same name.
func TestKubeconformSkipsOnlyTheOperatorKinds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		apiVersion, kind, want string
	}{
		{"monitoring.coreos.com/v1", "ServiceMonitor", "statusSkipped"},
		{"monitoring.coreos.com/v1", "PrometheusRule", "statusSkipped"},
		{"monitoring.coreos.com/v1alpha1", "ServiceMonitor", "statusError"},
		{"example.com/v1", "PrometheusRule", "statusError"},
		{"monitoring.coreos.com/v1", "PodMonitor", "statusError"},
	}
	for _, tt := range tests {
		t.Run(tt.apiVersion+"/"+tt.kind, func(t *testing.T) {
			t.Parallel()
			doc := fmt.Sprintf("apiVersion: %s\nkind: %s\nmetadata:\n  name: x\nspec: {}\n", tt.apiVersion, tt.kind)
			results := kubeconform(t, doc)
			if len(results) != 1 || results[0].Status != tt.want {
				t.Errorf("got %+v, want one result %s", results, tt.want)
			}
		})
	}
}
