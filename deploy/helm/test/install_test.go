//go:build apiserver

// The install test needs etcd, kube-apiserver and helm binaries, so it is
// built only with the apiserver tag: scripts/helm-install-test.sh builds the
// three from pinned modules and runs it. Pods never start (there is no
// kubelet or controller manager); what is tested is that a real API server
// accepts, stores, updates and deletes every object the chart makes,
// the Prometheus Operator's ServiceMonitor and PrometheusRule included,
// validated by the operator's own CRDs (from the module go.mod pins).

package helmtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	crd "github.com/prometheus-operator/prometheus-operator/example"
)

const (
	installRelease   = "rl"
	installNamespace = "ratelimiter-install"
)

// cluster is a kube-apiserver backed by etcd, both on loopback.
type cluster struct {
	kubeconfig string
	config     *rest.Config
}

func TestInstall(t *testing.T) {
	etcd, apiserver, helmPath := binary(t, "RATELIMITER_ETCD"), binary(t, "RATELIMITER_KUBE_APISERVER"), binary(t, "RATELIMITER_HELM")
	c := startCluster(t, etcd, apiserver)
	kube := kubernetes.NewForConfigOrDie(c.config)
	ctx := t.Context()

	// helm runs the helm command and returns its output; with log set the
	// output goes to the test log too.
	helm := func(log bool, args ...string) (string, error) {
		t.Helper()
		dir := t.TempDir()
		cmd := exec.CommandContext(ctx, helmPath, append(args, "--kubeconfig", c.kubeconfig)...)
		cmd.Env = append(os.Environ(),
			"HELM_CACHE_HOME="+filepath.Join(dir, "cache"),
			"HELM_CONFIG_HOME="+filepath.Join(dir, "config"),
			"HELM_DATA_HOME="+filepath.Join(dir, "data"))
		out, err := cmd.CombinedOutput()
		if log || err != nil {
			t.Logf("$ helm %s\n%s", strings.Join(args, " "), out)
		}
		return string(out), err
	}
	helmRun := func(args ...string) string {
		t.Helper()
		out, err := helm(true, args...)
		if err != nil {
			t.Fatalf("helm %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	manifestOf := func(release string) []*unstructured.Unstructured {
		t.Helper()
		out, err := helm(false, "get", "manifest", release, "--namespace", installNamespace)
		if err != nil {
			t.Fatalf("helm get manifest: %v", err)
		}
		return manifestObjects(t, out)
	}
	manifest := func() []*unstructured.Unstructured {
		t.Helper()
		return manifestOf(installRelease)
	}
	chart := filepath.Join("..", "ratelimiter")

	// Several replicas on the in-memory backend would each enforce the
	// whole limit: the chart refuses them before anything is created.
	out, err := helm(true, "install", "refused", chart, "--namespace", installNamespace, "--create-namespace",
		"--set", "replicaCount=3")
	if err == nil || !strings.Contains(out, "replica") {
		t.Fatalf("helm install with replicaCount=3: err = %v, output %q; want a refusal that explains replicas", err, out)
	}
	if releases, _ := helm(false, "list", "--namespace", installNamespace, "--all", "--short"); strings.TrimSpace(releases) != "" {
		t.Fatalf("helm list after the refused install = %q, want no releases", releases)
	}

	// The ServiceMonitor and PrometheusRule are custom resources: the API
	// server knows them, and validates them, once the operator's CRDs are
	// installed.
	installCRDs(t, c, "servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com")

	// Install with the admin token, a limiter, and the optional objects on.
	helmRun("install", installRelease, chart, "--namespace", installNamespace, "--create-namespace",
		"--set", "adminToken.value=install-token",
		"--set", "networkPolicy.enabled=true",
		"--set", "metrics.serviceMonitor.enabled=true",
		"--set", "metrics.serviceMonitor.labels.release=monitoring",
		"--set", "metrics.prometheusRule.enabled=true",
		"--set", "metrics.prometheusRule.alertLabels.team=platform",
		"--set", "metrics.grafanaDashboard.enabled=true",
		"--set", "config.limiters[0].name=upstream",
		"--set", "config.limiters[0].limit=5",
		"--set", "config.limiters[0].period=1m")
	objects := manifest()
	if len(objects) == 0 {
		t.Fatal("helm get manifest listed no objects")
	}
	checkStored(t, c, objects)
	checkCustomResources(t, c, objects)

	dep, err := kube.AppsV1().Deployments(installNamespace).Get(ctx, installRelease+"-ratelimiter", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get deployment: %v", err)
	}
	checkDeployment(t, dep)
	cm, err := kube.CoreV1().ConfigMaps(installNamespace).Get(ctx, installRelease+"-ratelimiter", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get configmap: %v", err)
	}
	file := configFile(t, cm)
	if !strings.Contains(file, "name: upstream") || !strings.Contains(file, "limit: 5") {
		t.Errorf("config file in the ConfigMap = %q, want the upstream limiter with limit 5", file)
	}
	var secretName string
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secretName = v.Secret.SecretName
		}
	}
	if secretName == "" {
		t.Fatalf("deployment mounts no secret: volumes %+v", dep.Spec.Template.Spec.Volumes)
	}
	secret, err := kube.CoreV1().Secrets(installNamespace).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get secret: %v", err)
	}
	if len(secret.Data) != 1 {
		t.Errorf("secret %s holds %d keys, want the admin token only", secretName, len(secret.Data))
	}
	for key, value := range secret.Data {
		if string(value) != "install-token" {
			t.Errorf("secret %s key %s = %q, want %q", secretName, key, value, "install-token")
		}
	}
	checksum := dep.Spec.Template.Annotations["checksum/config"]
	if checksum == "" {
		t.Fatalf("deployment pod template has no checksum/config annotation: %v", dep.Spec.Template.Annotations)
	}

	// Upgrade with a changed per-IP policy: the ConfigMap follows and the
	// pod template changes, so the pods roll.
	helmRun("upgrade", installRelease, chart, "--namespace", installNamespace, "--reuse-values",
		"--set", "config.tenants.limit=7",
		"--set", "config.tenants.period=10s")
	cm, err = kube.CoreV1().ConfigMaps(installNamespace).Get(ctx, installRelease+"-ratelimiter", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get configmap after upgrade: %v", err)
	}
	file = configFile(t, cm)
	if !strings.Contains(file, "limit: 7") || !strings.Contains(file, "period: 10s") {
		t.Errorf("config file after upgrade = %q, want tenants limit 7 per 10s", file)
	}
	dep, err = kube.AppsV1().Deployments(installNamespace).Get(ctx, installRelease+"-ratelimiter", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get deployment after upgrade: %v", err)
	}
	if got := dep.Spec.Template.Annotations["checksum/config"]; got == checksum {
		t.Errorf("checksum/config after upgrade = %s, unchanged: pods would not roll", got)
	}
	if dep.Generation < 2 {
		t.Errorf("deployment generation after upgrade = %d, want >= 2", dep.Generation)
	}
	history := helmRun("history", installRelease, "--namespace", installNamespace)
	if !strings.Contains(history, "Upgrade complete") {
		t.Errorf("helm history has no completed upgrade:\n%s", history)
	}
	objects = manifest()
	checkStored(t, c, objects)

	// Uninstall removes every object the release made.
	helmRun("uninstall", installRelease, "--namespace", installNamespace, "--wait", "--timeout", "60s")
	checkGone(t, c, objects)
	if out := helmRun("list", "--namespace", installNamespace, "--all", "--short"); strings.TrimSpace(out) != "" {
		t.Errorf("helm list after uninstall = %q, want no releases", out)
	}

	// With the Redis backend, several replicas share one state: the chart
	// accepts them, and the password reaches the pods only as a file.
	const redisRelease, redisPassword = "rl-redis", "install-redis-password"
	helmRun("install", redisRelease, chart, "--namespace", installNamespace,
		"--set", "replicaCount=3",
		"--set", "backend.type=redis",
		"--set", "backend.redis.addrs={redis-0.redis:6379,redis-1.redis:6379}",
		"--set", "backend.redis.password="+redisPassword,
		"--set", "networkPolicy.enabled=true",
		"--set", "networkPolicy.egress.enabled=true")
	redisObjects := manifestOf(redisRelease)
	checkStored(t, c, redisObjects)
	dep, err = kube.AppsV1().Deployments(installNamespace).Get(ctx, redisRelease+"-ratelimiter", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get redis deployment: %v", err)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
		t.Errorf("redis deployment replicas = %v, want 3", dep.Spec.Replicas)
	}
	redisEnv := map[string]string{}
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		redisEnv[e.Name] = e.Value
	}
	if redisEnv["RATELIMITER_BACKEND"] != "redis" || redisEnv["RATELIMITER_REDIS_ADDRS"] != "redis-0.redis:6379,redis-1.redis:6379" {
		t.Errorf("redis deployment env = %v, want the redis backend and both addresses", redisEnv)
	}
	if _, ok := redisEnv["RATELIMITER_REDIS_PASSWORD"]; ok || redisEnv["RATELIMITER_REDIS_PASSWORD_FILE"] == "" {
		t.Errorf("redis deployment env = %v, want the password as a file only", redisEnv)
	}
	secret, err = kube.CoreV1().Secrets(installNamespace).Get(ctx, redisRelease+"-ratelimiter-redis", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get redis password secret: %v", err)
	}
	if got := string(secret.Data["redis-password"]); got != redisPassword {
		t.Errorf("redis password secret holds %q, want %q", got, redisPassword)
	}
	pdb, err := kube.PolicyV1().PodDisruptionBudgets(installNamespace).Get(ctx, redisRelease+"-ratelimiter", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get redis disruption budget: %v", err)
	}
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != "AlwaysAllow" {
		t.Errorf("redis disruption budget unhealthyPodEvictionPolicy = %v, want AlwaysAllow", p)
	}
	helmRun("uninstall", redisRelease, "--namespace", installNamespace, "--wait", "--timeout", "60s")
	checkGone(t, c, redisObjects)
}

// installCRDs creates the named CustomResourceDefinitions from the
// Prometheus Operator's CRD files and waits until the API server serves
// them.
func installCRDs(t *testing.T, c *cluster, names ...string) {
	t.Helper()
	var all bytes.Buffer
	if err := crd.PrintAll(&all); err != nil {
		t.Fatalf("the Prometheus Operator's CRDs: %v", err)
	}
	crds := dynamic.NewForConfigOrDie(c.config).Resource(schema.GroupVersionResource{
		Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	found := map[string]bool{}
	for _, obj := range manifestObjects(t, all.String()) {
		if obj.GetKind() != "CustomResourceDefinition" || !slices.Contains(names, obj.GetName()) {
			continue
		}
		found[obj.GetName()] = true
		if _, err := crds.Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CRD %s: %v", obj.GetName(), err)
		}
		t.Logf("created CRD %s (operator version %s)", obj.GetName(), obj.GetAnnotations()["operator.prometheus.io/version"])
	}
	for _, name := range names {
		if !found[name] {
			t.Fatalf("the Prometheus Operator's CRD files have no %s", name)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !crdEstablished(t, crds, name) {
			if time.Now().After(deadline) {
				t.Fatalf("CRD %s not established after 30s", name)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func crdEstablished(t *testing.T, crds dynamic.NamespaceableResourceInterface, name string) bool {
	t.Helper()
	got, err := crds.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get CRD %s: %v", name, err)
	}
	conditions, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
	for _, c := range conditions {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// checkCustomResources checks that the release's ServiceMonitor and
// PrometheusRule are in the API server, and that the server really checks
// them against the CRDs' schemas: a copy of each with a field the schema
// refuses is rejected, naming the field.
func checkCustomResources(t *testing.T, c *cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	broken := map[string]struct {
		path  []string
		value any
	}{
		"ServiceMonitor": {[]string{"spec", "endpoints"}, []any{map[string]any{"port": "http", "interval": "thirty seconds"}}},
		"PrometheusRule": {[]string{"spec", "groups"}, []any{map[string]any{"name": "g", "rules": []any{map[string]any{"alert": "A", "expr": "up == 0", "for": "fifteen minutes"}}}}},
	}
	for kind, b := range broken {
		var obj *unstructured.Unstructured
		for _, o := range objs {
			if o.GetKind() == kind && o.GetAPIVersion() == "monitoring.coreos.com/v1" {
				obj = o
			}
		}
		if obj == nil {
			t.Errorf("the release has no %s", kind)
			continue
		}
		client := resource(t, c, obj)
		if _, err := client.Get(t.Context(), obj.GetName(), metav1.GetOptions{}); err != nil {
			t.Errorf("%s %s: %v", kind, obj.GetName(), err)
		}
		bad := obj.DeepCopy()
		bad.SetName(obj.GetName() + "-invalid")
		if err := unstructured.SetNestedField(bad.Object, b.value, b.path...); err != nil {
			t.Fatal(err)
		}
		_, err := client.Create(t.Context(), bad, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) {
			t.Errorf("create %s with %v = %v: got %v, want the CRD's schema to refuse it", kind, b.path, b.value, err)
			continue
		}
		t.Logf("the API server refuses a broken %s: %v", kind, err)
	}
}

// binary returns the path an environment variable names, failing the test
// when it is unset or not executable: this test never skips.
func binary(t *testing.T, env string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		t.Fatalf("%s is not set: run scripts/helm-install-test.sh, which builds etcd, kube-apiserver and helm", env)
	}
	if info, err := os.Stat(path); err != nil || info.Mode()&0o111 == 0 {
		t.Fatalf("%s=%s is not an executable file (%v)", env, path, err)
	}
	return path
}

func checkDeployment(t *testing.T, dep *appsv1.Deployment) {
	t.Helper()
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("deployment replicas = %v, want 1", dep.Spec.Replicas)
	}
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("deployment has %d containers, want 1", len(pod.Containers))
	}
	ctr := pod.Containers[0]
	for name, p := range map[string]*corev1.Probe{"liveness": ctr.LivenessProbe, "readiness": ctr.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe = %+v, want an HTTP GET probe", name, p)
			continue
		}
		want := map[string]string{"liveness": "/livez", "readiness": "/readyz"}[name]
		if p.HTTPGet.Path != want || p.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe = GET %s on port %s, want GET %s on port http", name, p.HTTPGet.Path, p.HTTPGet.Port.String(), want)
		}
	}
	sc := ctr.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("container has no securityContext")
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Errorf("runAsNonRoot = %v, want true", sc.RunAsNonRoot)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("readOnlyRootFilesystem = %v, want true", sc.ReadOnlyRootFilesystem)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("allowPrivilegeEscalation = %v, want false", sc.AllowPrivilegeEscalation)
	case sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL":
		t.Errorf("capabilities = %+v, want drop ALL", sc.Capabilities)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && pod.SecurityContext != nil {
		seccomp = pod.SecurityContext.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile = %+v, want RuntimeDefault", seccomp)
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		env[e.Name] = e.Value
	}
	for _, name := range []string{"RATELIMITER_CONFIG", "RATELIMITER_ADMIN_TOKEN_FILE", "RATELIMITER_SHUTDOWN_DELAY"} {
		if env[name] == "" {
			t.Errorf("container env %s is unset; env = %v", name, env)
		}
	}
	t.Logf("deployment %s/%s: image %s, probes /livez and /readyz, non-root, read-only root, grace %ds",
		dep.Namespace, dep.Name, ctr.Image, *pod.TerminationGracePeriodSeconds)
}

func configFile(t *testing.T, cm *corev1.ConfigMap) string {
	t.Helper()
	if len(cm.Data) != 1 {
		t.Fatalf("configmap %s holds %d keys, want one config file", cm.Name, len(cm.Data))
	}
	for _, v := range cm.Data {
		return v
	}
	return ""
}

// manifestObjects parses helm's rendered manifest into objects.
func manifestObjects(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(manifest, "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		var m map[string]any
		// The split took the newline before "---": give it back, or a
		// block scalar ending the document would lose its last newline.
		if err := yaml.Unmarshal([]byte(doc+"\n"), &m); err != nil {
			t.Fatalf("parse manifest document: %v\n%s", err, doc)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// resource finds where obj lives in the API server.
func resource(t *testing.T, c *cluster, obj *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	dc := discovery.NewDiscoveryClientForConfigOrDie(c.config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(schema.GroupKind{Group: gvk.Group, Kind: gvk.Kind}, gvk.Version)
	if err != nil {
		t.Fatalf("no resource for %s: %v", gvk, err)
	}
	client := dynamic.NewForConfigOrDie(c.config).Resource(mapping.Resource)
	if mapping.Scope.Name() == "namespace" {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = installNamespace
		}
		return client.Namespace(ns)
	}
	return client
}

// checkStored fails t unless every object of a release's manifest is in
// the API server as rendered: each field the chart set has the value it
// set, once the server has defaulted the ones it left out and put its own
// beside them (see storedAs).
func checkStored(t *testing.T, c *cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, obj := range objs {
		got, err := resource(t, c, obj).Get(t.Context(), obj.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
			continue
		}
		want := obj.Object
		if data, ok := want["stringData"].(map[string]any); ok {
			want = storedSecret(want, data)
		}
		diffs := storedAs(obj.GetKind(), want, got.Object)
		for _, d := range diffs {
			t.Errorf("%s %s: %s", obj.GetKind(), obj.GetName(), d)
		}
		t.Logf("in the API server: %-24s %s/%s (uid %s, resourceVersion %s): %d fields as rendered, %d differ",
			got.GetKind(), got.GetNamespace(), got.GetName(), got.GetUID(), got.GetResourceVersion(), countLeaves(want), len(diffs))
	}
}

// storedAs lists where got, an object as the API server returns it, differs
// from want, the object as rendered. Maps compare key by key over want's
// keys only, lists element by element and of equal length, and scalars by
// value; quantities compare by amount, since the server writes them in
// canonical form ("0.5" is stored as "500m"). A null in want is a field
// the chart leaves out.
func storedAs(path string, want, got any) []string {
	switch w := want.(type) {
	case nil:
		return nil
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: got %v, want an object", path, got)}
		}
		var diffs []string
		for k, v := range w {
			diffs = append(diffs, storedAs(path+"."+k, v, g[k])...)
		}
		return diffs
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{fmt.Sprintf("%s: got %v, want %d elements", path, got, len(w))}
		}
		var diffs []string
		for i := range w {
			diffs = append(diffs, storedAs(fmt.Sprintf("%s[%d]", path, i), w[i], g[i])...)
		}
		return diffs
	}
	ws, gs := fmt.Sprint(want), fmt.Sprint(got)
	if got != nil && ws == gs {
		return nil
	}
	if got == nil && (ws == "0" || ws == "false" || ws == "") {
		return nil // the server leaves out a field at its zero value
	}
	wq, werr := apiresource.ParseQuantity(ws)
	gq, gerr := apiresource.ParseQuantity(gs)
	if got != nil && werr == nil && gerr == nil && wq.Cmp(gq) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%s: got %#v, want %#v", path, got, want)}
}

// storedSecret is a rendered Secret as the API server stores it: its
// stringData merged into data, base64-encoded.
func storedSecret(obj, stringData map[string]any) map[string]any {
	out := maps.Clone(obj)
	delete(out, "stringData")
	data := map[string]any{}
	if d, ok := obj["data"].(map[string]any); ok {
		maps.Copy(data, d)
	}
	for k, v := range stringData {
		data[k] = base64.StdEncoding.EncodeToString([]byte(fmt.Sprint(v)))
	}
	out["data"] = data
	return out
}

// countLeaves is how many scalar fields v holds.
func countLeaves(v any) int {
	switch v := v.(type) {
	case map[string]any:
		n := 0
		for _, x := range v {
			n += countLeaves(x)
		}
		return n
	case []any:
		n := 0
		for _, x := range v {
			n += countLeaves(x)
		}
		return n
	case nil:
		return 0
	}
	return 1
}

func checkGone(t *testing.T, c *cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, obj := range objs {
		_, err := resource(t, c, obj).Get(t.Context(), obj.GetName(), metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s %s after uninstall: err = %v, want NotFound", obj.GetKind(), obj.GetName(), err)
			continue
		}
		t.Logf("removed: %s %s", obj.GetKind(), obj.GetName())
	}
}

// startCluster starts etcd and kube-apiserver on loopback ports and stops
// them, API server first, when the test ends.
func startCluster(t *testing.T, etcd, apiserver string) *cluster {
	t.Helper()
	dir := t.TempDir()
	clientPort, peerPort, securePort := freePort(t), freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	etcdExited := startProcess(t, dir, "etcd", etcd,
		"--name", "default",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		"--listen-metrics-urls", fmt.Sprintf("http://127.0.0.1:%d", freePort(t)))
	waitHTTP(t, http.DefaultClient, etcdURL+"/health", "", etcdExited)

	token := randomHex(t)
	write(t, filepath.Join(dir, "tokens.csv"), token+",admin,admin,system:masters\n")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "sa.key"), string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})))
	write(t, filepath.Join(dir, "sa.pub"), string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})))
	apiserverExited := startProcess(t, dir, "kube-apiserver", apiserver,
		"--etcd-servers", etcdURL,
		// No endpoint reconciler: it refuses a loopback advertise address.
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--endpoint-reconciler-type", "none",
		"--secure-port", fmt.Sprint(securePort),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "AlwaysAllow",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--enable-priority-and-fairness=false")

	server := fmt.Sprintf("https://127.0.0.1:%d", securePort)
	// The server's certificate is self-signed at start-up; the connection
	// never leaves loopback.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	waitHTTP(t, insecure, server+"/readyz", token, apiserverExited)

	kubeconfig := filepath.Join(dir, "kubeconfig")
	write(t, kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
`, server, token))
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	version, err := discovery.NewDiscoveryClientForConfigOrDie(config).ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	t.Logf("kube-apiserver %s on %s, etcd on %s", version.GitVersion, server, etcdURL)
	return &cluster{kubeconfig: kubeconfig, config: config}
}

// waitHTTP polls url until it answers 200, for up to two minutes or until
// the server's process exits.
func waitHTTP(t *testing.T, client *http.Client, url, token string, exited <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s not ready after 2m: %s", url, last)
		case <-exited:
			t.Fatalf("the server exited before %s answered 200 (last: %s)", url, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
