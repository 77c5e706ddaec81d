package helmtest

import (
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestReplicas checks the replica count the Deployment and the autoscaler
// get, and the PodDisruptionBudget that goes with it: one pod at a time may
// be taken down, and pods that are not ready (as every pod is during a
// Redis outage with fail-closed) may always be evicted, on the Kubernetes
// versions that know the field.
func TestReplicas(t *testing.T) {
	t.Parallel()
	const redis = "backend: {type: redis, redis: {addrs: ['redis:6379']}}\n"
	tests := []struct {
		name        string
		values      string
		kubeVersion string // empty means the tests' default
		// wantReplicas is the Deployment's replicas, 0 when it leaves them
		// to the autoscaler; wantMin and wantMax the autoscaler's, 0 when
		// there is none.
		wantReplicas, wantMin, wantMax int32
		wantPolicy                     policyv1.UnhealthyPodEvictionPolicyType
	}{
		{name: "memory", values: "", wantReplicas: 1, wantPolicy: policyv1.AlwaysAllow},
		{name: "memory autoscaled", values: "autoscaling: {enabled: true}\n", wantMin: 1, wantMax: 1, wantPolicy: policyv1.AlwaysAllow},
		{name: "redis with three replicas", values: "replicaCount: 3\n" + redis, wantReplicas: 3, wantPolicy: policyv1.AlwaysAllow},
		{
			name:    "redis autoscaled",
			values:  "replicaCount: 3\nautoscaling: {enabled: true, minReplicas: 2, maxReplicas: 12}\n" + redis,
			wantMin: 2, wantMax: 12, wantPolicy: policyv1.AlwaysAllow,
		},
		{
			name:         "redis, budget policy left to the cluster",
			values:       "replicaCount: 2\npodDisruptionBudget: {unhealthyPodEvictionPolicy: ''}\n" + redis,
			wantReplicas: 2,
		},
		{
			name:         "redis, budget policy chosen",
			values:       "replicaCount: 2\npodDisruptionBudget: {unhealthyPodEvictionPolicy: IfHealthyBudget}\n" + redis,
			wantReplicas: 2, wantPolicy: policyv1.IfHealthyBudget,
		},
		{
			name:         "Kubernetes before the budget policy",
			values:       "replicaCount: 2\n" + redis,
			kubeVersion:  "v1.26.0",
			wantReplicas: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vs := valueSet{name: tt.name, extra: tt.values}
			var m *manifests
			if tt.kubeVersion == "" {
				m = render(t, vs)
			} else {
				args := []string{"template", releaseName, chartDir, "--namespace", namespace, "--kube-version", tt.kubeVersion}
				out, err := runHelm(t, append(args, vs.args(t)...)...)
				if err != nil {
					t.Fatal(err)
				}
				m = decode(t, out)
			}

			var gotReplicas int32
			if r := m.Deployment.Spec.Replicas; r != nil {
				gotReplicas = *r
			}
			if gotReplicas != tt.wantReplicas {
				t.Errorf("Deployment replicas: got %d, want %d", gotReplicas, tt.wantReplicas)
			}
			var gotMin, gotMax int32
			if m.HPA != nil {
				gotMin, gotMax = deref(m.HPA.Spec.MinReplicas).(int32), m.HPA.Spec.MaxReplicas
			}
			if gotMin != tt.wantMin || gotMax != tt.wantMax {
				t.Errorf("autoscaler replicas: got %d to %d, want %d to %d", gotMin, gotMax, tt.wantMin, tt.wantMax)
			}

			pdb := m.PDB
			if pdb == nil {
				t.Fatal("got no PodDisruptionBudget")
			}
			if got, want := pdb.Spec.MaxUnavailable, intstr.FromInt32(1); pdb.Spec.MinAvailable != nil || got == nil || *got != want {
				t.Errorf("PodDisruptionBudget: got minAvailable %v, maxUnavailable %v; want maxUnavailable 1 only", pdb.Spec.MinAvailable, got)
			}
			var gotPolicy policyv1.UnhealthyPodEvictionPolicyType
			if p := pdb.Spec.UnhealthyPodEvictionPolicy; p != nil {
				gotPolicy = *p
			}
			if gotPolicy != tt.wantPolicy {
				t.Errorf("unhealthyPodEvictionPolicy: got %q, want %q", gotPolicy, tt.wantPolicy)
			}
		})
	}
}
