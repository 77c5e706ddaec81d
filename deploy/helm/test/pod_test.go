package helmtest

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/ratelimiter/ratelimiter/api"
)

// specPath returns the path of the GET operation operationID in the
// service's OpenAPI document, the one embedded in the binary.
func specPath(t *testing.T, operationID string) string {
	t.Helper()
	var spec struct {
		Paths map[string]struct {
			Get struct {
				OperationID string `json:"operationId"`
			} `json:"get"`
		} `json:"paths"`
	}
	if err := yaml.Unmarshal(api.Spec, &spec); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	for path, item := range spec.Paths {
		if item.Get.OperationID == operationID {
			return path
		}
	}
	t.Fatalf("api/openapi.yaml has no GET operation %s", operationID)
	return ""
}

// TestProbes checks that the probes ask the service's own health endpoints,
// found by operation in its OpenAPI document, on the container's named
// port, and that the Service and the scrape annotations use that port too.
func TestProbes(t *testing.T) {
	t.Parallel()
	livez, readyz := specPath(t, "getLiveness"), specPath(t, "getReadiness")
	for _, vs := range allValueSets(t) {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, vs)
			values := vs.values(t)
			c := m.container(t)

			// TestGRPCPorts checks the grpc port that may follow.
			port := int32(lookupInt(t, values, "containerPort"))
			if len(c.Ports) == 0 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != port {
				t.Fatalf("container ports: got %+v, want the first named http on %d", c.Ports, port)
			}
			for _, p := range []struct {
				name  string
				probe *corev1.Probe
				path  string
			}{
				{"liveness", c.LivenessProbe, livez},
				{"readiness", c.ReadinessProbe, readyz},
			} {
				if p.probe == nil || p.probe.HTTPGet == nil {
					t.Errorf("%s probe: got %+v, want an HTTP GET", p.name, p.probe)
					continue
				}
				g := p.probe.HTTPGet
				if g.Path != p.path {
					t.Errorf("%s probe path: got %q, want %q", p.name, g.Path, p.path)
				}
				if g.Port != intstr.FromString("http") {
					t.Errorf("%s probe port: got %v, want the named port http", p.name, g.Port.String())
				}
				if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
					t.Errorf("%s probe scheme: got %s, want HTTP", p.name, g.Scheme)
				}
			}

			// The readiness probe must see /readyz fail, and the pod
			// leave the endpoints, before the shutdown delay ends.
			delay, err := time.ParseDuration(env(c)["RATELIMITER_SHUTDOWN_DELAY"].Value)
			if err != nil {
				t.Fatalf("RATELIMITER_SHUTDOWN_DELAY: %v", err)
			}
			r := c.ReadinessProbe
			if notReady := time.Duration(r.PeriodSeconds*r.FailureThreshold) * time.Second; delay > 0 && notReady >= delay {
				t.Errorf("readiness probe: period %ds x failure threshold %d = %s, want less than the shutdown delay %s",
					r.PeriodSeconds, r.FailureThreshold, notReady, delay)
			}

			svcPorts := m.Service.Spec.Ports
			wantSvcPort := int32(lookupInt(t, values, "service", "port"))
			if len(svcPorts) == 0 || svcPorts[0].Name != "http" || svcPorts[0].TargetPort != intstr.FromString("http") || svcPorts[0].Port != wantSvcPort {
				t.Errorf("Service ports: got %+v, want the first named http on %d to the target port http", svcPorts, wantSvcPort)
			}

			ann := m.Deployment.Spec.Template.Annotations
			if lookup(t, values, "metrics", "scrapeAnnotations") == true {
				want := map[string]string{
					"prometheus.io/scrape": "true",
					"prometheus.io/port":   strconv.Itoa(int(port)),
					"prometheus.io/path":   "/metrics",
				}
				for k, v := range want {
					if ann[k] != v {
						t.Errorf("pod annotation %s: got %q, want %q", k, ann[k], v)
					}
				}
			} else if v, ok := ann["prometheus.io/scrape"]; ok {
				t.Errorf("pod annotation prometheus.io/scrape: got %q, want none", v)
			}
		})
	}
}

// TestSecurityContext checks that the service pod and the test pod run as
// the image's non-root user, with a read-only root file system, no
// privilege escalation, no capabilities, the runtime's seccomp profile, and
// no service account token.
func TestSecurityContext(t *testing.T) {
	t.Parallel()
	for _, vs := range allValueSets(t) {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, vs)
			pods := map[string]corev1.PodSpec{
				"Deployment": m.Deployment.Spec.Template.Spec,
				"test Pod":   m.TestPod.Spec,
			}
			for name, spec := range pods {
				psc := spec.SecurityContext
				if psc == nil {
					t.Errorf("%s: got no pod securityContext", name)
					continue
				}
				checks := []struct {
					field     string
					got, want any
				}{
					{"automountServiceAccountToken", deref(spec.AutomountServiceAccountToken), false},
					{"enableServiceLinks", deref(spec.EnableServiceLinks), false},
					{"securityContext.runAsNonRoot", deref(psc.RunAsNonRoot), true},
					{"securityContext.runAsUser", deref(psc.RunAsUser), int64(65532)},
					{"securityContext.runAsGroup", deref(psc.RunAsGroup), int64(65532)},
					{"securityContext.seccompProfile", seccomp(psc.SeccompProfile), corev1.SeccompProfileTypeRuntimeDefault},
				}
				for _, c := range spec.Containers {
					sc := c.SecurityContext
					if sc == nil {
						t.Errorf("%s container %s: got no securityContext", name, c.Name)
						continue
					}
					var drop, add []corev1.Capability
					if sc.Capabilities != nil {
						drop, add = sc.Capabilities.Drop, sc.Capabilities.Add
					}
					p := "container " + c.Name + " securityContext."
					checks = append(checks, []struct {
						field     string
						got, want any
					}{
						{p + "runAsNonRoot", deref(sc.RunAsNonRoot), true},
						{p + "runAsUser", deref(sc.RunAsUser), int64(65532)},
						{p + "runAsGroup", deref(sc.RunAsGroup), int64(65532)},
						{p + "readOnlyRootFilesystem", deref(sc.ReadOnlyRootFilesystem), true},
						{p + "allowPrivilegeEscalation", deref(sc.AllowPrivilegeEscalation), false},
						{p + "privileged", deref(sc.Privileged), false},
						{p + "capabilities.drop", fmt.Sprint(drop), "[ALL]"},
						{p + "capabilities.add", len(add), 0},
						{p + "seccompProfile", seccomp(sc.SeccompProfile), corev1.SeccompProfileTypeRuntimeDefault},
					}...)
				}
				for _, c := range checks {
					if c.got != c.want {
						t.Errorf("%s %s: got %v, want %v", name, c.field, c.got, c.want)
					}
				}
			}

			sa := m.Deployment.Spec.Template.Spec.ServiceAccountName
			if m.ServiceAccount != nil {
				if m.ServiceAccount.Name != sa {
					t.Errorf("ServiceAccount name: got %q, want the pod's %q", m.ServiceAccount.Name, sa)
				}
				if got := deref(m.ServiceAccount.AutomountServiceAccountToken); got != false {
					t.Errorf("ServiceAccount automountServiceAccountToken: got %v, want false", got)
				}
			}
		})
	}
}

// TestTestPod checks the helm test hook: it runs the service's image with
// its probe subcommand against the Service's readiness URL, and the
// Deployment, Service and PodDisruptionBudget do not select it.
func TestTestPod(t *testing.T) {
	t.Parallel()
	readyz := specPath(t, "getReadiness")
	for _, vs := range allValueSets(t) {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, vs)
			pod := m.TestPod
			if got := pod.Annotations["helm.sh/hook"]; got != "test" {
				t.Errorf("helm.sh/hook annotation: got %q, want test", got)
			}
			if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("restartPolicy: got %q, want Never", pod.Spec.RestartPolicy)
			}
			if len(pod.Spec.Containers) != 1 {
				t.Fatalf("got %d containers, want 1", len(pod.Spec.Containers))
			}
			c := pod.Spec.Containers[0]
			if want := m.container(t).Image; c.Image != want {
				t.Errorf("image: got %q, want the service's %q", c.Image, want)
			}
			if len(c.Command) != 0 {
				t.Errorf("command: got %q, want the image's entrypoint", c.Command)
			}
			url := fmt.Sprintf("http://%s:%d%s", m.Service.Name, m.Service.Spec.Ports[0].Port, readyz)
			if want := []string{"probe", url}; !slices.Equal(c.Args, want) {
				t.Errorf("args: got %q, want %q", c.Args, want)
			}

			podLabels := labels.Set(pod.Labels)
			selectors := map[string]*metav1.LabelSelector{
				"Deployment": m.Deployment.Spec.Selector,
				"Service":    {MatchLabels: m.Service.Spec.Selector},
			}
			if m.PDB != nil {
				selectors["PodDisruptionBudget"] = m.PDB.Spec.Selector
			}
			for name, ls := range selectors {
				sel, err := metav1.LabelSelectorAsSelector(ls)
				if err != nil {
					t.Fatalf("%s selector: %v", name, err)
				}
				if sel.Matches(podLabels) {
					t.Errorf("%s selector %s matches the test pod's labels %v", name, sel, podLabels)
				}
				if !sel.Matches(labels.Set(m.Deployment.Spec.Template.Labels)) {
					t.Errorf("%s selector %s does not match the service pods' labels", name, sel)
				}
			}
		})
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func seccomp(p *corev1.SeccompProfile) any {
	if p == nil {
		return nil
	}
	return p.Type
}
