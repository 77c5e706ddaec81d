//go:build cluster

package helmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ratelimiter/ratelimiter/client"
)

// podUID is the user and group the chart runs the service as
// (podSecurityContext.runAsUser, runAsGroup and fsGroup).
const podUID = 65532

// hostPathVolume creates a PersistentVolume named name on a directory of
// this machine, made beforehand for the claim ns/claim alone (claimRef) and
// without a StorageClass, so that a claim with storageClassName "" binds to
// it and nothing else does. It returns the directory. The volume and the
// directory are deleted when the test ends: call it before creating the
// namespace, so that the namespace, and the claim in it, go first.
func (c *testCluster) hostPathVolume(t *testing.T, name, ns, claim string) string {
	t.Helper()
	// Under the cluster's directory, which scripts/cluster-down.sh deletes
	// should this test's cleanup not run.
	parent := filepath.Join(c.dir, "volumes")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(parent, name+"-")
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet changes the ownership of a volume to the pod's fsGroup
	// only for the volume types that support it: a hostPath volume is
	// mounted as it is (the hostPath plugin's SetUp only checks the path's
	// type). On a directory of root's the service cannot create its file
	// ("permission denied") and the pod crash-loops, fsGroup or not: the
	// chart relies on fsGroup, which covers the usual provisioned volumes.
	// So the directory is made the pod user's here, as an administrator
	// making a hostPath volume would have to make it.
	if err := os.Chown(dir, podUID, podUID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o770); err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: apiresource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: claim},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: ptr(corev1.HostPathDirectory)},
			},
		},
	}
	if _, err := c.kube.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create persistent volume %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		defer os.RemoveAll(dir)
		pvs := c.kube.CoreV1().PersistentVolumes()
		if err := pvs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete persistent volume %s: %v", name, err)
			return
		}
		for ctx.Err() == nil {
			if _, err := pvs.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Errorf("persistent volume %s still there after a minute", name)
	})
	return dir
}

// TestClusterPersistence runs the memory backend with persistence.enabled
// on a PersistentVolume of this machine's disk and restarts its pod under a
// paced load that acquires from limiters created through the API (GCRA,
// sliding log, a keyed limiter's keys) and from per-IP tenants, counting
// every permit granted (answers 200 only). After a pod deleted with its
// grace period and after a helm upgrade that rolls it (both graceful stops:
// SIGTERM, the shutdown, the state saved), the new pod has every limiter as
// it was defined, and every bucket has exactly limit − granted permits left,
// the test's own grants and the load's across the restart included: never
// more (a forgotten grant, over-admission) and never less. After a pod
// force-deleted (a crash for the store: killed before it saves), every
// limiter is there and every bucket, a key and a tenant never seen
// included, is exhausted, and nothing is granted after the restart.
func TestClusterPersistence(t *testing.T) {
	c := kubeCluster(t)
	const (
		release = "rl"
		nsName  = "rl-persistence"
		claim   = release + "-ratelimiter-data"
		// The limits are long enough that nothing refills while the test
		// runs, so that what is left is exactly limit − granted. GCRA
		// refills one permit every period/limit: 8784h (the longest
		// period) / 1000 is 8.8 hours. The sliding log frees a permit one
		// period after it was granted: 24h.
		limiterLimit = 1000
		// Small enough that the load exhausts a tenant across the
		// restarts: 8784h / 100 is one permit every 18 days.
		tenantLimit = 100
		// Paced far below what the machine serves (the same 2 cores run
		// the cluster): about 8 acquisitions a second per target.
		loadRate, loadWorkers = 50, 5
	)
	hostDir := c.hostPathVolume(t, nsName+"-data", nsName, claim)
	ns := c.namespace(t, nsName)
	c.helm(t, append([]string{"install", release, chartDir, "--namespace", ns, "--wait", "--timeout", "3m",
		"--set", "persistence.enabled=true",
		"--set", "persistence.storageClassName=-",
		"--set", fmt.Sprintf("config.tenants.limit=%d", tenantLimit),
		"--set", "config.tenants.period=8784h"}, c.imageValues()...)...)
	selector := labels.Set{"app.kubernetes.io/instance": release, "app.kubernetes.io/name": "ratelimiter"}
	pod := c.waitReady(t, ns, selector, 1, time.Minute)[0]
	c.waitEndpoints(t, ns, release+"-ratelimiter", 1)
	ctx := t.Context()

	dep, err := c.kube.AppsV1().Deployments(ns).Get(ctx, release+"-ratelimiter", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get deployment: %v", err)
	}
	if got := dep.Spec.Strategy.Type; got != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("deployment strategy: got %s, want Recreate", got)
	}
	pvc, err := c.kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get claim: %v", err)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName != nsName+"-data" {
		t.Fatalf("claim %s: got %s to volume %q, want Bound to %s-data", claim, pvc.Status.Phase, pvc.Spec.VolumeName, nsName)
	}

	base := c.serviceURL(t, ns, release+"-ratelimiter")
	api := apiClient(t, base, 1)
	specs := map[string]client.PutLimiterJSONRequestBody{
		"daily":     {Limit: limiterLimit, Period: "8784h"},
		"daily-log": {Limit: limiterLimit, Period: "24h", Algorithm: ptr(client.AlgorithmSlidingLog)},
		"per-user":  {Limit: limiterLimit, Period: "8784h", Keyed: ptr(true)},
	}
	defs := map[string]client.Limiter{}
	for name, spec := range specs {
		resp, err := api.PutLimiterWithResponse(ctx, name, spec)
		if err != nil {
			t.Fatalf("create limiter %s: %v", name, err)
		}
		if resp.JSON201 == nil {
			t.Fatalf("create limiter %s: got %d %s, want 201", name, resp.StatusCode(), resp.Body)
		}
		defs[name] = *resp.JSON201
	}

	targets := []persistTarget{
		{limiter: "daily", limit: limiterLimit},
		{limiter: "daily-log", limit: limiterLimit},
		{limiter: "per-user", key: "alice", limit: limiterLimit},
		{limiter: "per-user", key: "bob", limit: limiterLimit},
		{tenant: "198.18.0.1", limit: tenantLimit},
		{tenant: "198.18.0.2", limit: tenantLimit},
	}
	// granted is every permit granted so far, by target: the test's own
	// and the loads'.
	granted := map[persistTarget]int64{}
	for i, take := range []int64{101, 203, 307, 1, 31, 0} {
		if take == 0 {
			continue
		}
		allowed, failure := targets[i].acquire(ctx, api, take)
		if failure != "" || !allowed {
			t.Fatalf("%s: take %d: got allowed=%t %s, want allowed", targets[i], take, allowed, failure)
		}
		granted[targets[i]] += take
	}

	// checkCounts checks that every target has exactly limit − granted
	// permits left, and that no target was granted more than its limit.
	checkCounts := func(t *testing.T, when string) {
		t.Helper()
		for _, target := range targets {
			got, err := target.available(ctx, api)
			if err != nil {
				t.Errorf("%s %s: available: %v", when, target, err)
				continue
			}
			if want := target.limit - granted[target]; got != want {
				t.Errorf("%s %s: got %d available, want %d (limit %d − %d granted)", when, target, got, want, target.limit, granted[target])
			}
			if granted[target] > target.limit {
				t.Errorf("%s %s: %d permits granted, over its limit of %d", when, target, granted[target], target.limit)
			}
		}
	}
	// checkDefinitions checks that the limiters created through the API
	// exist as they were created.
	checkDefinitions := func(t *testing.T, when string) {
		t.Helper()
		for name, want := range defs {
			resp, err := api.GetLimiterWithResponse(ctx, name)
			if err != nil {
				t.Fatalf("%s: get limiter %s: %v", when, name, err)
			}
			if resp.JSON200 == nil {
				t.Errorf("%s: limiter %s: got %d %s, want 200", when, name, resp.StatusCode(), resp.Body)
				continue
			}
			if got := *resp.JSON200; !reflect.DeepEqual(got, want) {
				t.Errorf("%s: limiter %s: got %s, want it as created", when, name, resp.Body)
			}
		}
	}
	checkCounts(t, "before any restart:")

	// restart runs change under the load until a new pod is Ready behind
	// the Service, and a few seconds more, adds the load's grants to
	// granted, and returns the load and how many permits it was granted
	// before change and after the new pod was Ready.
	restart := func(t *testing.T, what string, change func()) (l *persistLoad, before, after int64) {
		t.Helper()
		old := pod.Name
		l = newPersistLoad(t, base, targets, loadWorkers, loadRate)
		var took time.Duration
		var ready int64
		l.during(t, 3*time.Second, func() {
			before = l.total()
			start := time.Now()
			change()
			pod = c.waitReady(t, ns, selector, 1, 2*time.Minute)[0]
			c.waitEndpoints(t, ns, release+"-ratelimiter", 1)
			took = time.Since(start)
			ready = l.total()
		})
		after = l.grants - ready
		for target, n := range l.granted {
			granted[target] += n
		}
		t.Logf("%s: new pod %s Ready behind the Service %s after the change; load over %s: %d requests (%.0f/s), %d permits granted (%d before the change, %d once the new pod was Ready), %d denied, %d failed from +%s to +%s",
			what, pod.Name, took.Round(time.Millisecond), l.elapsed.Round(time.Millisecond), l.next.Load(), float64(l.next.Load())/l.elapsed.Seconds(),
			l.grants, before, after, l.denied, l.failed, l.firstFailure.Round(time.Millisecond), l.lastFailure.Round(time.Millisecond))
		for _, f := range l.failures {
			t.Logf("failed: %s", f)
		}
		for _, target := range targets {
			t.Logf("  %s: %d granted in all, %d by this load", target, granted[target], l.granted[target])
		}
		if pod.Name == old {
			t.Fatalf("%s: pod %s still runs, want a new one", what, old)
		}
		// A pod deleted by hand (or evicted) is replaced by its ReplicaSet
		// at once, without waiting for it to stop as the Recreate strategy
		// of a rollout does: the new process finds the data file still
		// locked by the old one and waits for it, not ready, rather than
		// exit and be restarted by the kubelet.
		if status := pod.Status.ContainerStatuses[0]; status.RestartCount != 0 {
			var last string
			if term := status.LastTerminationState.Terminated; term != nil {
				last = fmt.Sprintf("exit code %d, %s", term.ExitCode, term.Reason)
			}
			t.Errorf("%s: the new pod's container restarted %d times, want 0; the last run ended with %s, logging: %s",
				what, status.RestartCount, last, c.podLog(t, ns, pod.Name, true, `"level":"ERROR"`, "error"))
		}
		t.Logf("%s: the new pod logged: %s", what, c.podLog(t, ns, pod.Name, false, "data directory", "without shutting down"))
		return l, before, after
	}

	for _, tt := range []struct {
		name   string
		change func(t *testing.T)
	}{
		{"pod deleted", func(t *testing.T) {
			if err := c.kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("delete pod: %v", err)
			}
		}},
		{"helm upgrade", func(t *testing.T) {
			c.helm(t, "upgrade", release, chartDir, "--namespace", ns, "--reuse-values", "--wait", "--timeout", "3m",
				"--set", "podAnnotations.rollout=one")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, before, after := restart(t, tt.name, func() { tt.change(t) })
			if before == 0 || after == 0 {
				t.Errorf("the load was granted %d permits before the restart and %d after it, want some on both sides", before, after)
			}
			checkDefinitions(t, "after the restart")
			checkCounts(t, "after the restart:")
		})
		if t.Failed() {
			return
		}
	}

	// The data file is on the volume, the pod user's.
	info, err := os.Stat(filepath.Join(hostDir, "ratelimiter.db"))
	if err != nil {
		t.Fatalf("the data file on the volume: %v", err)
	}
	if st := info.Sys().(*syscall.Stat_t); st.Uid != podUID || info.Size() == 0 {
		t.Errorf("%s: owner %d, %d bytes, want owner %d and some bytes", info.Name(), st.Uid, info.Size(), podUID)
	}

	t.Run("pod force-deleted", func(t *testing.T) {
		// Grace period 0: the pod object goes at once, a new pod is
		// created, and the kubelet kills the old container after the
		// least grace it allows (2 s), within the service's shutdown delay
		// (10 s), before it saves its state: a crash for the data file.
		l, _, after := restart(t, "pod force-deleted", func() {
			if err := c.kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				t.Fatalf("force-delete pod: %v", err)
			}
		})
		checkDefinitions(t, "after the crash")
		if after != 0 {
			t.Errorf("after the crash the load was granted %d permits, want 0: every bucket starts exhausted", after)
		}
		for _, target := range append(targets,
			persistTarget{limiter: "per-user", key: "never-seen", limit: limiterLimit},
			persistTarget{tenant: "198.18.255.254", limit: tenantLimit}) {
			got, err := target.available(ctx, api)
			if err != nil {
				t.Errorf("after the crash %s: available: %v", target, err)
				continue
			}
			if got != 0 {
				t.Errorf("after the crash %s: got %d available, want 0 (exhausted at the restart)", target, got)
			}
			if granted[target] > target.limit {
				t.Errorf("after the crash %s: %d permits granted, over its limit of %d", target, granted[target], target.limit)
			}
		}
		if l.denied == 0 {
			t.Error("the load was never denied after the crash")
		}
	})

	// helm uninstall deletes the claim the chart made; the volume, whose
	// reclaim policy is Retain, is released with the data on it.
	c.helm(t, "uninstall", release, "--namespace", ns, "--wait", "--timeout", "2m")
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := c.kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim %s still there a minute after helm uninstall (%v)", claim, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(hostDir, "ratelimiter.db")); err != nil {
		t.Errorf("the data file after helm uninstall: %v", err)
	}
}

// podLog returns the first line of the pod's log (or of its container's
// previous run) that holds one of the strings, for the test's log.
func (c *testCluster) podLog(t *testing.T, ns, pod string, previous bool, subs ...string) string {
	t.Helper()
	logs, err := c.kube.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Previous: previous}).DoRaw(t.Context())
	if err != nil {
		return fmt.Sprintf("(logs: %v)", err)
	}
	for line := range strings.Lines(string(logs)) {
		for _, s := range subs {
			if strings.Contains(line, s) {
				return strings.TrimSpace(line)
			}
		}
	}
	return fmt.Sprintf("(no line with any of %q)", subs)
}
