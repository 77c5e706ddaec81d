package helmtest

import (
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

// renderFiles renders every template of the chart with helm's own template
// engine, as helm install would, and returns each file's text by its name
// (ratelimiter/templates/...).
func renderFiles(t *testing.T, vs valueSet) map[string]string {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	caps.KubeVersion = *kv
	opts := chartutil.ReleaseOptions{Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true}
	values, err := chartutil.ToRenderValues(ch, vs.values(t), opts, caps)
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	out, err := engine.Render(ch, values)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return out
}

// renderNotes renders templates/NOTES.txt, which helm template leaves out,
// with helm's own template engine.
func renderNotes(t *testing.T, vs valueSet) string {
	t.Helper()
	notes, ok := renderFiles(t, vs)["ratelimiter/templates/NOTES.txt"]
	if !ok {
		t.Fatal("no NOTES.txt rendered")
	}
	return notes
}

// TestNotes checks that the notes printed after an install tell how to
// reach the API and its documentation, and the rate limit service over gRPC
// and where its rules come from, where limiter state lives and what
// happens when Redis is unreachable, what persistence keeps and how the
// pod is then replaced, and warn when limiter mutations are
// open to every caller or the disruption budget blocks node drains.
func TestNotes(t *testing.T) {
	t.Parallel()
	const openWarning = "WARNING: no admin token is configured"
	tests := []struct {
		name          string
		values        string
		want, notWant []string
	}{
		{
			name:   "defaults",
			values: "",
			want: []string{
				"http://rel-ratelimiter.limits.svc:8080",
				"Envoy's rate limit service (gRPC, with gRPC health checking and\nreflection) at:\n\n  rel-ratelimiter.limits.svc:8081\n",
				"It has no rules yet (envoy.config or envoy.existingConfigMap)",
				"kubectl --namespace limits port-forward service/rel-ratelimiter 8080:8080",
				"BASE=http://localhost:8080",
				"$BASE/docs",
				"curl $BASE/readyz",
				"curl -X POST $BASE/v1/tenants/203.0.113.7/acquire",
				openWarning,
				"Backend memory: limiter state lives in the pod's memory",
				"set backend.type=redis",
				"To keep the limiters across restarts, set\npersistence.enabled=true.",
				"helm test rel --namespace limits",
			},
			notWant: []string{"Authorization: Bearer", "Backend redis", "WARNING: podDisruptionBudget", "ServiceMonitor", "PrometheusRule", "Grafana", "PersistentVolumeClaim", "Recreate"},
		},
		{
			name:   "persistence on the chart's claim",
			values: "persistence: {enabled: true}\n",
			want: []string{
				"Backend memory, with persistence: limiter state lives in the pod's memory,\nand the service's data directory, /var/lib/ratelimiter, is on\nPersistentVolumeClaim rel-ratelimiter-data: the limiters\ncreated, replaced or deleted through the API are written there before each\nanswer and read back when the pod restarts",
				"replaced\nwith the Recreate strategy: on an upgrade the old pod stops and lets go of\nthe volume before the new one starts",
				"To run more replicas, set backend.type=redis and turn persistence\noff.",
			},
			notWant: []string{"starts afresh", "set\npersistence.enabled=true", "an existing claim", "Backend redis"},
		},
		{
			name:    "persistence on an existing claim",
			values:  "persistence: {enabled: true, existingClaim: limits-data}\n",
			want:    []string{"PersistentVolumeClaim limits-data (an existing claim): the limiters", "Recreate strategy"},
			notWant: []string{"rel-ratelimiter-data"},
		},
		{
			name:   "monitoring",
			values: "metrics: {scrapeAnnotations: false, serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}, grafanaDashboard: {enabled: true, namespace: monitoring}}\n",
			want: []string{
				"ServiceMonitor rel-ratelimiter has the Prometheus Operator scrape them.",
				"PrometheusRule rel-ratelimiter holds the service's alerts.",
				"ConfigMap rel-ratelimiter-dashboard in namespace monitoring holds the Grafana dashboard,\nlabelled grafana_dashboard=\"1\"",
			},
			notWant: []string{"prometheus.io/* scrape annotations"},
		},
		{
			name:   "redis, fail-closed",
			values: "replicaCount: 2\nbackend: {type: redis, redis: {addrs: ['redis-0:6379', 'redis-1:6379'], password: n0tes-pw}}\n",
			want: []string{
				"Backend redis: limiter state lives in Redis and is shared by every replica\n(2 replicas)",
				"Redis:\n  redis-0:6379\n  redis-1:6379\n",
				`Keys start with "ratelimiter:".`,
				"Failure mode fail-closed: when Redis cannot answer within 50ms, requests\nare denied",
				"the pods report not ready",
			},
			notWant: []string{"n0tes-pw", "Backend memory", "fail-open", "over TLS"},
		},
		{
			name: "redis, autoscaled, fail-open over TLS",
			values: `autoscaling: {enabled: true, minReplicas: 3, maxReplicas: 9}
backend: {type: redis, redis: {addrs: ['redis:6380'], tls: {enabled: true}, keyPrefix: 'edge:', timeout: 20ms, failureMode: fail-open}}
`,
			want: []string{
				"(3 to 9 replicas, autoscaled)",
				"Redis, over TLS:\n  redis:6380\n",
				`Keys start with "edge:".`,
				"Failure mode fail-open: when Redis cannot answer within 20ms, requests\nare allowed",
				"the pods stay ready",
			},
			notWant: []string{"fail-closed", "report not ready"},
		},
		{
			name:    "rate limit service with rules from the values",
			values:  "service: {grpcPort: 18081}\nenvoy: {config: {web.yaml: 'domain: web'}}\n",
			want:    []string{"  rel-ratelimiter.limits.svc:18081\n", "Its rules come from ConfigMap rel-ratelimiter-envoy; the pods reload them"},
			notWant: []string{"no rules yet"},
		},
		{
			name:    "rate limit service with rules from an existing ConfigMap",
			values:  "envoy: {existingConfigMap: mesh-rules}\n",
			want:    []string{"Its rules come from ConfigMap mesh-rules;"},
			notWant: []string{"no rules yet"},
		},
		{
			name:    "gRPC off",
			values:  "grpc: {enabled: false}\nenvoy: {existingConfigMap: mesh-rules}\n",
			notWant: []string{"gRPC", ":8081", "rules"},
		},
		{
			name:    "token from the chart",
			values:  "adminToken: {value: t0ken}\n",
			want:    []string{"secret rel-ratelimiter-admin-token -o jsonpath='{.data.admin-token}'", "Authorization: Bearer $TOKEN"},
			notWant: []string{openWarning, "t0ken"},
		},
		{
			name:    "token from an existing Secret",
			values:  "adminToken: {existingSecret: limits-admin, existingSecretKey: api.token}\n",
			want:    []string{`secret limits-admin -o jsonpath='{.data.api\.token}'`, "Authorization: Bearer $TOKEN"},
			notWant: []string{openWarning},
		},
		{
			name:   "a limiter to try",
			values: "config: {limiters: [{name: github-api, limit: 10, period: 1s}]}\nservice: {port: 80}\n",
			want:   []string{"port-forward service/rel-ratelimiter 8080:80", "curl -X POST $BASE/v1/limiters/github-api/acquire"},
		},
		{
			name:    "node port",
			values:  "service: {type: NodePort}\n",
			want:    []string{"jsonpath='{.spec.ports[0].nodePort}'", "BASE=http://$NODE_IP:$NODE_PORT"},
			notWant: []string{"port-forward"},
		},
		{
			name:    "load balancer",
			values:  "service: {type: LoadBalancer, port: 80}\n",
			want:    []string{".status.loadBalancer.ingress[0]", "BASE=http://$LB:80"},
			notWant: []string{"port-forward"},
		},
		{
			name:   "disruption budget that blocks drains",
			values: "podDisruptionBudget: {minAvailable: 1, maxUnavailable: ''}\n",
			want:   []string{"WARNING: podDisruptionBudget.minAvailable is 1 and the release may run\nas few as 1 replica: node drains will wait forever"},
		},
		{
			name:   "disruption budget that blocks drains of every replica",
			values: "replicaCount: 3\npodDisruptionBudget: {minAvailable: 3, maxUnavailable: ''}\nbackend: {type: redis, redis: {addrs: ['redis:6379']}}\n",
			want:   []string{"minAvailable is 3 and the release may run\nas few as 3 replicas"},
		},
		{
			name:    "disruption budget below the replicas",
			values:  "replicaCount: 3\npodDisruptionBudget: {minAvailable: 2, maxUnavailable: ''}\nbackend: {type: redis, redis: {addrs: ['redis:6379']}}\n",
			notWant: []string{"WARNING: podDisruptionBudget"},
		},
		{
			name:    "disruption budget below the autoscaler's fewest replicas",
			values:  "autoscaling: {enabled: true, minReplicas: 2, maxReplicas: 4}\npodDisruptionBudget: {minAvailable: 1, maxUnavailable: ''}\nbackend: {type: redis, redis: {addrs: ['redis:6379']}}\n",
			notWant: []string{"WARNING: podDisruptionBudget"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			notes := renderNotes(t, valueSet{name: tt.name, extra: tt.values})
			for _, want := range tt.want {
				if !strings.Contains(notes, want) {
					t.Errorf("notes do not contain %q:\n%s", want, notes)
				}
			}
			for _, notWant := range tt.notWant {
				if strings.Contains(notes, notWant) {
					t.Errorf("notes contain %q:\n%s", notWant, notes)
				}
			}
		})
	}
}
