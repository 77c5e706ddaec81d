package helmtest

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// dataDir is where the chart mounts the persistence volume, and what it
// sets RATELIMITER_DATA_DIR to.
const dataDir = "/var/lib/ratelimiter"

// dataVolume returns the container's mount at dataDir and the pod's volume
// it mounts; ok is false when nothing is mounted there.
func dataVolume(t *testing.T, m *manifests) (mount corev1.VolumeMount, vol corev1.Volume, ok bool) {
	t.Helper()
	var mounts []corev1.VolumeMount
	for _, vm := range m.container(t).VolumeMounts {
		if path.Clean(vm.MountPath) == dataDir {
			mounts = append(mounts, vm)
		}
	}
	switch len(mounts) {
	case 0:
		return corev1.VolumeMount{}, corev1.Volume{}, false
	case 1:
	default:
		t.Fatalf("got %d volume mounts at %s, want at most 1: %+v", len(mounts), dataDir, mounts)
	}
	for _, v := range m.Deployment.Spec.Template.Spec.Volumes {
		if v.Name == mounts[0].Name {
			return mounts[0], v, true
		}
	}
	t.Fatalf("volume mount %s names no volume", mounts[0].Name)
	return corev1.VolumeMount{}, corev1.Volume{}, false
}

// TestPersistenceClaim checks the PersistentVolumeClaim the chart creates
// from the persistence values (size, StorageClass, access modes,
// annotations), or its absence with an existing claim, and that the pod's
// data volume is that claim.
func TestPersistenceClaim(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values string
		// wantClaim is the claim the pod mounts; wantPVC whether the chart
		// creates it, with the size, class (nil: the field left out),
		// access modes and annotations that follow.
		wantClaim       string
		wantPVC         bool
		wantSize        string
		wantClass       *string
		wantModes       []corev1.PersistentVolumeAccessMode
		wantAnnotations map[string]string
	}{
		{
			name:      "the chart's claim with the defaults",
			values:    "persistence: {enabled: true}\n",
			wantClaim: "rel-ratelimiter-data", wantPVC: true,
			wantSize: "1Gi", wantModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		},
		{
			name: "size, class, access modes and annotations",
			values: `persistence:
  enabled: true
  size: 20Gi
  storageClassName: fast-ssd
  accessModes: [ReadWriteOncePod]
  annotations: {helm.sh/resource-policy: keep, example.com/team: limits}
`,
			wantClaim: "rel-ratelimiter-data", wantPVC: true,
			wantSize: "20Gi", wantClass: new("fast-ssd"),
			wantModes:       []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod},
			wantAnnotations: map[string]string{"helm.sh/resource-policy": "keep", "example.com/team": "limits"},
		},
		{
			name:      `"-" for no class`,
			values:    "persistence: {enabled: true, storageClassName: '-', size: 500Mi}\n",
			wantClaim: "rel-ratelimiter-data", wantPVC: true,
			wantSize: "500Mi", wantClass: new(""), wantModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		},
		{
			name:      "named after fullnameOverride",
			values:    "fullnameOverride: edge-limits\npersistence: {enabled: true}\n",
			wantClaim: "edge-limits-data", wantPVC: true,
			wantSize: "1Gi", wantModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		},
		{
			name:      "an existing claim, the claim's own values unused",
			values:    "persistence: {enabled: true, existingClaim: limits-data, size: 5Gi, storageClassName: fast-ssd, annotations: {a: b}}\n",
			wantClaim: "limits-data",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, valueSet{name: tt.name, extra: tt.values})

			mount, vol, ok := dataVolume(t, m)
			if !ok {
				t.Fatalf("nothing is mounted at %s", dataDir)
			}
			if vol.PersistentVolumeClaim == nil {
				t.Fatalf("volume %s: got %+v, want a PersistentVolumeClaim", vol.Name, vol.VolumeSource)
			}
			if got := vol.PersistentVolumeClaim.ClaimName; got != tt.wantClaim {
				t.Errorf("volume %s: got claim %q, want %q", vol.Name, got, tt.wantClaim)
			}
			if vol.PersistentVolumeClaim.ReadOnly || mount.ReadOnly {
				t.Errorf("volume %s: got read-only (claim %v, mount %v), want read-write", vol.Name, vol.PersistentVolumeClaim.ReadOnly, mount.ReadOnly)
			}

			pvc := m.PVC
			if !tt.wantPVC {
				if pvc != nil {
					t.Fatalf("got PersistentVolumeClaim %s, want none with an existing claim", pvc.Name)
				}
				return
			}
			if pvc == nil {
				t.Fatal("got no PersistentVolumeClaim")
			}
			if pvc.Name != tt.wantClaim || pvc.Namespace != namespace {
				t.Errorf("claim: got %s/%s, want %s/%s", pvc.Namespace, pvc.Name, namespace, tt.wantClaim)
			}
			for k, v := range m.Deployment.Labels {
				if pvc.Labels[k] != v {
					t.Errorf("claim label %s: got %q, want the release's %q", k, pvc.Labels[k], v)
				}
			}
			if !maps.Equal(pvc.Annotations, tt.wantAnnotations) {
				t.Errorf("claim annotations: got %v, want %v", pvc.Annotations, tt.wantAnnotations)
			}
			got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
			if want := apiresource.MustParse(tt.wantSize); got.Cmp(want) != 0 {
				t.Errorf("claim storage request: got %s, want %s", got.String(), want.String())
			}
			if len(pvc.Spec.Resources.Requests) != 1 || len(pvc.Spec.Resources.Limits) != 0 {
				t.Errorf("claim resources: got %+v, want a storage request only", pvc.Spec.Resources)
			}
			if g, w := deref(pvc.Spec.StorageClassName), deref(tt.wantClass); g != w {
				t.Errorf("claim storageClassName: got %v, want %v (nil: left out, for the cluster's default)", g, w)
			}
			if !slices.Equal(pvc.Spec.AccessModes, tt.wantModes) {
				t.Errorf("claim access modes: got %v, want %v", pvc.Spec.AccessModes, tt.wantModes)
			}
			if pvc.Spec.VolumeName != "" || pvc.Spec.Selector != nil || pvc.Spec.VolumeMode != nil {
				t.Errorf("claim: got volumeName %q, selector %v, volumeMode %v; want none", pvc.Spec.VolumeName, pvc.Spec.Selector, pvc.Spec.VolumeMode)
			}
		})
	}
}

// TestPersistenceMount checks what the pod gets with persistence: the data
// volume mounted read-write at the data directory, with no subPath, as the
// only place it may write (the root file system stays read-only, every
// other mount too); RATELIMITER_DATA_DIR naming it, which the service's own
// loader reads as its data directory; and an fsGroup, through which the
// non-root user writes to the volume.
func TestPersistenceMount(t *testing.T) {
	t.Parallel()
	sets := []valueSet{
		{name: "the chart's claim", extra: "persistence: {enabled: true}\n"},
		{name: "an existing claim", extra: "persistence: {enabled: true, existingClaim: limits-data}\nadminToken: {value: t0ken}\n"},
	}
	for _, vs := range ciValueSets(t) {
		if lookup(t, vs.values(t), "persistence", "enabled") == true {
			sets = append(sets, vs)
		}
	}
	if len(sets) < 3 {
		t.Fatalf("got %d value sets with persistence, want a ci/*-values.yaml file with it too", len(sets))
	}
	for _, vs := range sets {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, vs)
			c := m.container(t)

			mount, _, ok := dataVolume(t, m)
			if !ok {
				t.Fatalf("nothing is mounted at %s", dataDir)
			}
			if mount.ReadOnly || mount.SubPath != "" || mount.SubPathExpr != "" {
				t.Errorf("data mount: got %+v, want read-write, the volume's root", mount)
			}
			for _, vm := range c.VolumeMounts {
				if vm.Name != mount.Name && !vm.ReadOnly {
					t.Errorf("volume mount %s at %s: got read-write, want only the data directory writable", vm.Name, vm.MountPath)
				}
			}

			e, ok := env(c)["RATELIMITER_DATA_DIR"]
			if !ok || e.Value != dataDir || e.ValueFrom != nil {
				t.Errorf("RATELIMITER_DATA_DIR: got %+v (set: %v), want the value %s", e, ok, dataDir)
			}
			if cfg, _ := serviceConfig(t, m); cfg.DataDir != dataDir {
				t.Errorf("the service's data directory: got %q, want %s", cfg.DataDir, dataDir)
			}

			if sc := c.SecurityContext; sc == nil || deref(sc.ReadOnlyRootFilesystem) != true {
				t.Error("container securityContext: want readOnlyRootFilesystem true with persistence too")
			}
			psc := m.Deployment.Spec.Template.Spec.SecurityContext
			if psc == nil || psc.FSGroup == nil {
				t.Fatal("pod securityContext: got no fsGroup, want one for the volume to be writable")
			}
			if *psc.FSGroup != 65532 {
				t.Errorf("pod securityContext.fsGroup: got %d, want 65532", *psc.FSGroup)
			}
		})
	}
}

// TestPersistenceStrategy checks that the Deployment replaces its pod with
// Recreate whenever persistence is on, whatever strategy.type says, and
// follows strategy.type otherwise.
func TestPersistenceStrategy(t *testing.T) {
	t.Parallel()
	rolling := &appsv1.RollingUpdateDeployment{MaxSurge: new(intstr.FromInt32(1)), MaxUnavailable: new(intstr.FromInt32(0))}
	tests := []struct {
		name        string
		values      string
		want        appsv1.DeploymentStrategyType
		wantRolling *appsv1.RollingUpdateDeployment
	}{
		{name: "defaults", values: "", want: appsv1.RollingUpdateDeploymentStrategyType, wantRolling: rolling},
		{name: "Recreate chosen", values: "strategy: {type: Recreate}\n", want: appsv1.RecreateDeploymentStrategyType},
		{name: "redis", values: "replicaCount: 3\nbackend: {type: redis, redis: {addrs: ['redis:6379']}}\n", want: appsv1.RollingUpdateDeploymentStrategyType, wantRolling: rolling},
		{name: "persistence", values: "persistence: {enabled: true}\n", want: appsv1.RecreateDeploymentStrategyType},
		{name: "persistence over RollingUpdate", values: "persistence: {enabled: true}\nstrategy: {type: RollingUpdate}\n", want: appsv1.RecreateDeploymentStrategyType},
		{name: "persistence on an existing claim", values: "persistence: {enabled: true, existingClaim: limits-data}\n", want: appsv1.RecreateDeploymentStrategyType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := render(t, valueSet{name: tt.name, extra: tt.values}).Deployment.Spec.Strategy
			if s.Type != tt.want {
				t.Errorf("strategy: got %s, want %s", s.Type, tt.want)
			}
			switch {
			case tt.wantRolling == nil && s.RollingUpdate != nil:
				t.Errorf("rollingUpdate: got %+v, want none with %s", *s.RollingUpdate, s.Type)
			case tt.wantRolling != nil && (s.RollingUpdate == nil ||
				deref(s.RollingUpdate.MaxSurge) != *tt.wantRolling.MaxSurge ||
				deref(s.RollingUpdate.MaxUnavailable) != *tt.wantRolling.MaxUnavailable):
				t.Errorf("rollingUpdate: got %+v, want maxSurge 1, maxUnavailable 0", s.RollingUpdate)
			}
		})
	}
}

// TestPersistenceOffChangesNothing checks that with persistence off the
// render has no claim, no data volume and no RATELIMITER_DATA_DIR, and that
// the other persistence values then change nothing at all: the manifests
// are the same, byte for byte, with them set or not. It covers the
// defaults and every ci file without persistence.
func TestPersistenceOffChangesNothing(t *testing.T) {
	t.Parallel()
	const off = `persistence:
  enabled: false
  existingClaim: limits-data
  size: 50Gi
  storageClassName: '-'
  accessModes: [ReadWriteMany]
  annotations: {helm.sh/resource-policy: keep}
`
	for _, vs := range allValueSets(t) {
		if lookup(t, vs.values(t), "persistence", "enabled") == true {
			continue
		}
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			plain, err := template(t, vs)
			if err != nil {
				t.Fatal(err)
			}
			m := decode(t, plain)
			if m.PVC != nil {
				t.Errorf("got PersistentVolumeClaim %s, want none", m.PVC.Name)
			}
			if _, vol, ok := dataVolume(t, m); ok {
				t.Errorf("got volume %s mounted at %s, want none", vol.Name, dataDir)
			}
			for _, v := range m.Deployment.Spec.Template.Spec.Volumes {
				if v.PersistentVolumeClaim != nil {
					t.Errorf("got volume %s of claim %s, want none", v.Name, v.PersistentVolumeClaim.ClaimName)
				}
			}
			if e, ok := env(m.container(t))["RATELIMITER_DATA_DIR"]; ok {
				t.Errorf("got RATELIMITER_DATA_DIR=%q, want it unset", e.Value)
			}

			withOff := vs
			withOff.name += " with persistence off"
			withOff.extra = off
			got, err := template(t, withOff)
			if err != nil {
				t.Fatal(err)
			}
			if got != plain {
				t.Errorf("the persistence values changed the render with persistence off:\n%s", lineDiff(plain, got))
			}
		})
	}
}

// lineDiff returns the lines of a and b that differ, position by position,
// enough to see what changed in a failing comparison.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out strings.Builder
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			fmt.Fprintf(&out, "line %d:\n- %s\n+ %s\n", i+1, x, y)
		}
	}
	return out.String()
}

// TestPersistenceRefusals checks that the chart refuses persistence where
// it cannot work, each time with a message that says why and what to set:
// with the redis backend, with more than one replica or an autoscaler,
// without an fsGroup, and a data directory set through extraEnv; and that
// values.schema.json refuses malformed persistence values, naming the key.
// The rows without a wanted error render.
func TestPersistenceRefusals(t *testing.T) {
	t.Parallel()
	const (
		on          = "persistence: {enabled: true}\n"
		schemaError = "values don't meet the specifications of the schema"
	)
	tests := []struct {
		name   string
		values string
		want   []string // in helm's error; empty: the render succeeds
	}{
		{"one replica", on + "replicaCount: 1\n", nil},
		{"scaled to zero", on + "replicaCount: 0\n", nil},
		{"fsGroup of its own", on + "podSecurityContext: {fsGroup: 1000}\n", nil},
		{"on redis", on + "backend: {type: redis, redis: {addrs: ['redis:6379']}}\n", []string{
			"persistence.enabled with backend.type=redis",
			"the service refuses a data directory with the redis backend, whose state Redis keeps",
			"Set persistence.enabled=false, or backend.type=memory.",
		}},
		{"on redis with one replica and an existing claim", "persistence: {enabled: true, existingClaim: limits-data}\nbackend: {type: redis, redis: {addrs: ['redis:6379']}}\n", []string{
			"persistence.enabled with backend.type=redis",
		}},
		{"two replicas", on + "replicaCount: 2\n", []string{
			"replicaCount=2 with persistence.enabled",
			"one volume that one pod at a time may use",
			"Set replicaCount to 1, or turn persistence off",
		}},
		{"autoscaler held at one replica", on + "autoscaling: {enabled: true, minReplicas: 1, maxReplicas: 1}\n", []string{
			"persistence.enabled with autoscaling.enabled",
			"one volume that one pod at a time may use",
			"Turn the autoscaler off and set replicaCount to 1, or turn persistence off.",
		}},
		{"autoscaler up to three replicas", on + "autoscaling: {enabled: true, maxReplicas: 3}\n", []string{
			"persistence.enabled with autoscaling.enabled",
		}},
		{"without fsGroup", on + "podSecurityContext: {fsGroup: null}\n", []string{
			"persistence.enabled without podSecurityContext.fsGroup",
			"the kubelet makes it writable for the pod's non-root user only through the pod's fsGroup",
		}},
		{"data directory through extraEnv", "extraEnv:\n  - {name: RATELIMITER_DATA_DIR, value: /tmp/data}\n", []string{
			"extraEnv sets RATELIMITER_DATA_DIR",
			"set persistence.enabled",
		}},
		{"data directory through extraEnv with persistence", on + "extraEnv:\n  - {name: RATELIMITER_DATA_DIR, value: /tmp/data}\n", []string{
			"extraEnv sets RATELIMITER_DATA_DIR, which the chart sets",
		}},
		{"switch as a string", "persistence: {enabled: 'yes'}\n", []string{schemaError, "at '/persistence/enabled'", "got string, want boolean"}},
		{"unknown key", "persistence: {mountPath: /data}\n", []string{schemaError, "at '/persistence'", "additional properties 'mountPath' not allowed"}},
		{"read-only access mode", "persistence: {accessModes: [ReadOnlyMany]}\n", []string{schemaError, "at '/persistence/accessModes/0'", "value must be one of"}},
		{"no access mode", "persistence: {accessModes: []}\n", []string{schemaError, "at '/persistence/accessModes'", "minItems"}},
		{"access mode twice", "persistence: {accessModes: [ReadWriteOnce, ReadWriteOnce]}\n", []string{schemaError, "at '/persistence/accessModes'", "items at 0 and 1 are equal"}},
		{"size not a quantity", "persistence: {size: 1 GB}\n", []string{schemaError, "at '/persistence/size'", "does not match pattern"}},
		{"size as a number", "persistence: {size: 1}\n", []string{schemaError, "at '/persistence/size'", "got number, want string"}},
		{"empty size", "persistence: {size: ''}\n", []string{schemaError, "at '/persistence/size'"}},
		{"bad StorageClass name", "persistence: {storageClassName: Fast_SSD}\n", []string{schemaError, "at '/persistence/storageClassName'"}},
		{"bad claim name", "persistence: {existingClaim: My_Claim}\n", []string{schemaError, "at '/persistence/existingClaim'"}},
		{"annotation value as a number", "persistence: {annotations: {replicas: 1}}\n", []string{schemaError, "at '/persistence/annotations/replicas'", "got number, want string"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vs := valueSet{name: tt.name, extra: tt.values}
			if tt.want == nil {
				render(t, vs)
				return
			}
			msg := mustFail(t, vs)
			for _, want := range tt.want {
				if !strings.Contains(msg, want) {
					t.Errorf("got error:\n%s\nwant it to contain %q", msg, want)
				}
			}
		})
	}
}
