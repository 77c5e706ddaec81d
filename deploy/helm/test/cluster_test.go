//go:build cluster

// The cluster tests run the chart in a real single-node Kubernetes cluster
// that scripts/cluster-up.sh started (RATELIMITER_CLUSTER_DIR names its
// directory): pods run in a private containerd, Services are reached
// through kube-proxy from this host, and names resolve through the
// cluster's DNS. scripts/cluster-test.sh starts the cluster, runs them and
// stops it.

package helmtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// testCluster is the running cluster and the images loaded into it.
type testCluster struct {
	dir        string // RATELIMITER_CLUSTER_DIR
	kubeconfig string
	kube       *kubernetes.Clientset
	helmPath   string
	image      string // the service's image, repository:tag
}

var (
	clusterOnce sync.Once
	clusterVal  *testCluster
	clusterErr  error
)

// kubeCluster returns the running cluster, loading the service's and Redis's
// images into its containerd on first use. Without one the test fails:
// these tests never skip.
func kubeCluster(t *testing.T) *testCluster {
	t.Helper()
	clusterOnce.Do(func() { clusterVal, clusterErr = openCluster(t.Context()) })
	if clusterErr != nil {
		t.Fatalf("test cluster: %v", clusterErr)
	}
	return clusterVal
}

func openCluster(ctx context.Context) (*testCluster, error) {
	dir := os.Getenv("RATELIMITER_CLUSTER_DIR")
	if dir == "" {
		return nil, fmt.Errorf("RATELIMITER_CLUSTER_DIR is not set: run scripts/cluster-test.sh, which starts the cluster")
	}
	c := &testCluster{dir: dir, kubeconfig: filepath.Join(dir, "kubeconfig")}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 50, 100
	if c.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if c.helmPath, err = helmPath(); err != nil {
		return nil, err
	}

	// The images: the service's from ./Dockerfile, Redis's from this
	// machine's redis-server; no registry is reachable, so both go
	// straight into the cluster's containerd.
	out, err := exec.CommandContext(ctx, "../../../scripts/images.sh", "service").Output()
	if err != nil {
		return nil, fmt.Errorf("scripts/images.sh service: %w", exitOutput(err))
	}
	c.image = strings.TrimSpace(string(out))
	if err := redistest.EnsureImage(ctx); err != nil {
		return nil, fmt.Errorf("redis image: %w", err)
	}
	save := exec.CommandContext(ctx, "docker", "save", c.image, redistest.Image)
	load := exec.CommandContext(ctx, "ctr", "-a", filepath.Join(dir, "containerd", "containerd.sock"),
		"-n", "k8s.io", "images", "import", "-")
	pipe, err := save.StdoutPipe()
	if err != nil {
		return nil, err
	}
	load.Stdin = pipe
	var loadOut bytes.Buffer
	load.Stdout, load.Stderr = &loadOut, &loadOut
	if err := load.Start(); err != nil {
		return nil, err
	}
	var saveOut bytes.Buffer
	save.Stderr = &saveOut
	saveErr := save.Run()
	loadErr := load.Wait()
	if saveErr != nil {
		return nil, fmt.Errorf("docker save: %w: %s", saveErr, saveOut.String())
	}
	if err := loadErr; err != nil {
		return nil, fmt.Errorf("ctr images import: %w: %s", err, loadOut.String())
	}
	return c, nil
}

// exitOutput adds a failed command's standard error to its error.
func exitOutput(err error) error {
	if exit, ok := err.(*exec.ExitError); ok {
		return fmt.Errorf("%w: %s", err, exit.Stderr)
	}
	return err
}

// imageValues are the values that make the chart run the image this run
// built, which the kubelet must never try to pull.
func (c *testCluster) imageValues() []string {
	repo, tag, _ := strings.Cut(c.image, ":")
	return []string{"--set", "image.repository=" + repo, "--set", "image.tag=" + tag, "--set", "image.pullPolicy=Never"}
}

// helm runs helm against the cluster, logging the command and its output,
// and fails the test when it fails.
func (c *testCluster) helm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := c.tryHelm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (c *testCluster) tryHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.CommandContext(t.Context(), c.helmPath, append(args, "--kubeconfig", c.kubeconfig)...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("$ helm %s (%s)\n%s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), out)
	return string(out), err
}

// namespace creates a namespace for one test, deleted with everything in it
// when the test ends.
func (c *testCluster) namespace(t *testing.T, name string) string {
	t.Helper()
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dump(name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.kube.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete namespace %s: %v", name, err)
			return
		}
		for ctx.Err() == nil {
			if _, err := c.kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Errorf("namespace %s still there after 2 minutes", name)
	})
	return name
}

// dump prints the namespace's pods and events, for a failed test.
func (c *testCluster) dump(ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, _ := c.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	for _, p := range pods.Items {
		b, _ := json.MarshalIndent(p.Status.ContainerStatuses, "", "  ")
		fmt.Fprintf(os.Stderr, "--- pod %s/%s: %s\n%s\n", ns, p.Name, p.Status.Phase, b)
		for _, container := range p.Spec.Containers {
			tail := int64(40)
			logs, err := c.kube.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: container.Name, TailLines: &tail}).DoRaw(ctx)
			fmt.Fprintf(os.Stderr, "--- logs of %s/%s (%v)\n%s\n", p.Name, container.Name, err, logs)
		}
	}
	events, _ := c.kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	for _, e := range events.Items {
		fmt.Fprintf(os.Stderr, "event %s %s/%s: %s %s\n", e.LastTimestamp.Format(time.TimeOnly), e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
}

// serviceURL returns the base URL of a Service's first port at its cluster
// address, which kube-proxy maps to the Service's ready pods.
func (c *testCluster) serviceURL(t *testing.T, ns, name string) string {
	t.Helper()
	svc, err := c.kube.CoreV1().Services(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get service %s/%s: %v", ns, name, err)
	}
	return fmt.Sprintf("http://%s:%d", svc.Spec.ClusterIP, svc.Spec.Ports[0].Port)
}

// readyPods returns the pods matching selector that are Ready.
func (c *testCluster) readyPods(t *testing.T, ns string, selector labels.Set) []corev1.Pod {
	t.Helper()
	pods, err := c.kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector.String()})
	if err != nil {
		t.Fatalf("list pods: %v", err)
	}
	var ready []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && podReady(&p) {
			ready = append(ready, p)
		}
	}
	return ready
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitReady waits until exactly n pods matching selector are Ready and no
// other pod matches, and returns them.
func (c *testCluster) waitReady(t *testing.T, ns string, selector labels.Set, n int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		all, err := c.kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector.String()})
		if err != nil {
			t.Fatalf("list pods: %v", err)
		}
		ready := c.readyPods(t, ns, selector)
		if len(ready) == n && len(all.Items) == n {
			return ready
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pods Ready (%d in all) after %s", len(ready), n, len(all.Items), timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitEndpoints waits until the Service lists n ready endpoints,
// kube-proxy has written every endpoint change into its rules, and a
// connection to the Service's address (its first port) is accepted, so
// that connections to it reach all n pods. kube-proxy counts a change as
// pending only once its watch has delivered it: until then it reports none
// pending while its rules still reject connections to a Service it knows
// no endpoint of, which the dial catches.
func (c *testCluster) waitEndpoints(t *testing.T, ns, service string, n int) {
	t.Helper()
	svc, err := c.kube.CoreV1().Services(ns).Get(t.Context(), service, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get service %s/%s: %v", ns, service, err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port)))
	b, err := os.ReadFile(filepath.Join(c.dir, "kube-proxy.yaml"))
	if err != nil {
		t.Fatalf("kube-proxy's configuration: %v", err)
	}
	var proxy struct {
		MetricsBindAddress string `json:"metricsBindAddress"`
	}
	if err := yaml.Unmarshal(b, &proxy); err != nil || proxy.MetricsBindAddress == "" {
		t.Fatalf("kube-proxy's metrics address in %s: %v", b, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		slices, err := c.kube.DiscoveryV1().EndpointSlices(ns).List(t.Context(),
			metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + service})
		if err != nil {
			t.Fatalf("list endpoint slices: %v", err)
		}
		ready := 0
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready++
				}
			}
		}
		metrics, err := http.Get("http://" + proxy.MetricsBindAddress + "/metrics")
		pending := "unknown"
		if err == nil {
			body, _ := io.ReadAll(metrics.Body)
			metrics.Body.Close()
			for line := range strings.Lines(string(body)) {
				if v, ok := strings.CutPrefix(line, "kubeproxy_sync_proxy_rules_endpoint_changes_pending "); ok {
					pending = strings.TrimSpace(v)
				}
			}
		}
		dialed := "not tried"
		if ready == n && pending == "0" {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				conn.Close()
				return
			}
			dialed = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s/%s: %d of %d endpoints ready, %s endpoint changes pending in kube-proxy after a minute; dial %s: %s", ns, service, ready, n, pending, addr, dialed)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// containerSpec returns the OCI runtime spec containerd gave a running
// container: what runc really applied, not what the pod asked for.
func (c *testCluster) containerSpec(t *testing.T, containerID string) ociSpec {
	t.Helper()
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := exec.CommandContext(t.Context(), "ctr", "-a", filepath.Join(c.dir, "containerd", "containerd.sock"),
		"-n", "k8s.io", "containers", "info", id).Output()
	if err != nil {
		t.Fatalf("ctr containers info %s: %v", id, exitOutput(err))
	}
	var info struct{ Spec ociSpec }
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("decode container info: %v", err)
	}
	return info.Spec
}

// ociSpec is the part of an OCI runtime spec the tests read.
type ociSpec struct {
	Process struct {
		User struct {
			UID int `json:"uid"`
			GID int `json:"gid"`
		} `json:"user"`
		NoNewPrivileges bool `json:"noNewPrivileges"`
		Capabilities    struct {
			Effective []string `json:"effective"`
		} `json:"capabilities"`
	} `json:"process"`
	Root struct {
		Readonly bool `json:"readonly"`
	} `json:"root"`
	Linux struct {
		Seccomp *struct {
			DefaultAction string `json:"defaultAction"`
		} `json:"seccomp"`
	} `json:"linux"`
}

// apiClient returns the generated client for a base URL, with an HTTP
// client whose connections persist, as a caller's would.
func apiClient(t *testing.T, base string, conns int) *client.ClientWithResponses {
	t.Helper()
	hc := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, IdleConnTimeout: 90 * time.Second},
	}
	cl, err := client.NewClientWithResponses(base, client.WithHTTPClient(hc))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return cl
}
