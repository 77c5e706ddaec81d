package helmtest

import (
	"fmt"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestNetworkPolicy checks what the NetworkPolicy lets in and out: the http
// port, and the grpc port when gRPC is on, both from the peers set (and the
// test pod), and, when egress is restricted, DNS, the ports of the Redis
// addresses with the redis backend, and the OTLP collector's port.
func TestNetworkPolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values string
		// wantIngress is the ports of the ingress rule, as
		// "port/protocol"; nil means the http and grpc ports.
		wantIngress []string
		// wantEgress is nil when egress is not restricted; otherwise the
		// ports of each egress rule, in order, as "port/protocol".
		wantEgress [][]string
		wantFrom   int // peers in the ingress rule, the test pod's included; 0 means any source
		// wantTo is the number of peers of each egress rule, 0 meaning
		// any destination; nil skips the check.
		wantTo []int
	}{
		{name: "ingress only", values: "networkPolicy: {enabled: true}\n"},
		{
			name:     "ingress from chosen peers",
			values:   "networkPolicy: {enabled: true, ingress: {from: [{namespaceSelector: {matchLabels: {team: a}}}]}}\n",
			wantFrom: 2,
		},
		{
			name:        "ingress with gRPC off",
			values:      "networkPolicy: {enabled: true}\ngrpc: {enabled: false}\n",
			wantIngress: []string{"http/TCP"},
		},
		{
			name:     "ingress to gRPC on a port of its own from chosen peers",
			values:   "networkPolicy: {enabled: true, ingress: {from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: istio-system}}}]}}\ngrpc: {containerPort: 9091}\n",
			wantFrom: 2,
		},
		{
			name:       "egress restricted without tracing",
			values:     "networkPolicy: {enabled: true, egress: {enabled: true}}\n",
			wantEgress: [][]string{{"53/UDP", "53/TCP"}},
		},
		{
			name:       "egress to an OTLP collector on its port",
			values:     "networkPolicy: {enabled: true, egress: {enabled: true}}\notel: {tracesExporter: otlp, endpoint: 'http://collector.obs:4317', protocol: grpc}\n",
			wantEgress: [][]string{{"53/UDP", "53/TCP"}, {"4317/TCP"}},
		},
		{
			name:       "egress to an HTTPS collector without a port",
			values:     "networkPolicy: {enabled: true, egress: {enabled: true}}\notel: {tracesExporter: otlp, endpoint: 'https://otel.example.com/v1'}\n",
			wantEgress: [][]string{{"53/UDP", "53/TCP"}, {"443/TCP"}},
		},
		{
			name:       "egress to an HTTP collector without a port",
			values:     "networkPolicy: {enabled: true, egress: {enabled: true}}\notel: {tracesExporter: otlp, endpoint: 'http://otel'}\n",
			wantEgress: [][]string{{"53/UDP", "53/TCP"}, {"80/TCP"}},
		},
		{
			name:       "console tracing needs no egress",
			values:     "networkPolicy: {enabled: true, egress: {enabled: true}}\notel: {tracesExporter: console, endpoint: 'http://collector:4318'}\n",
			wantEgress: [][]string{{"53/UDP", "53/TCP"}},
		},
		{
			name:       "egress to Redis on the port of its address",
			values:     "networkPolicy: {enabled: true, egress: {enabled: true}}\nbackend: {type: redis, redis: {addrs: ['redis.cache:6379']}}\n",
			wantEgress: [][]string{{"53/UDP", "53/TCP"}, {"6379/TCP"}},
			wantTo:     []int{0, 0},
		},
		{
			name: "egress to Redis Cluster seeds on each of their ports, once",
			values: `networkPolicy: {enabled: true, egress: {enabled: true, redis: {to: [{ipBlock: {cidr: 10.20.0.0/16}}]}}}
backend: {type: redis, redis: {addrs: ['10.20.0.1:7000', '10.20.0.2:7001', '10.20.0.3:7000', '[fd00::4]:7002']}}
`,
			wantEgress: [][]string{{"53/UDP", "53/TCP"}, {"7000/TCP", "7001/TCP", "7002/TCP"}},
			wantTo:     []int{0, 1},
		},
		{
			name: "egress to Redis and an OTLP collector",
			values: `networkPolicy: {enabled: true, egress: {enabled: true, dns: {to: [{namespaceSelector: {}}]}}}
backend: {type: redis, redis: {addrs: ['redis:6380']}}
otel: {tracesExporter: otlp, endpoint: 'http://collector.obs:4318'}
`,
			wantEgress: [][]string{{"53/UDP", "53/TCP"}, {"6380/TCP"}, {"4318/TCP"}},
			wantTo:     []int{1, 0, 0},
		},
		{
			name:       "Redis settings ignored on the memory backend",
			values:     "networkPolicy: {enabled: true, egress: {enabled: true}}\nbackend: {redis: {addrs: ['redis:6379']}}\n",
			wantEgress: [][]string{{"53/UDP", "53/TCP"}},
		},
		{
			name:   "Redis needs no rule while egress is open",
			values: "networkPolicy: {enabled: true}\nbackend: {type: redis, redis: {addrs: ['redis:6379']}}\n",
		},
		{
			name:       "extra egress rules",
			values:     "networkPolicy: {enabled: true, egress: {enabled: true, extraRules: [{ports: [{port: 6379}]}]}}\n",
			wantEgress: [][]string{{"53/UDP", "53/TCP"}, {"6379/"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, valueSet{name: tt.name, extra: tt.values})
			np := m.NetworkPolicy
			if np == nil {
				t.Fatal("got no NetworkPolicy")
			}
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil {
				t.Fatal(err)
			}
			if !sel.Matches(labels.Set(m.Deployment.Spec.Template.Labels)) {
				t.Errorf("podSelector %s does not select the service pods", sel)
			}

			wantTypes := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
			if tt.wantEgress != nil {
				wantTypes = append(wantTypes, networkingv1.PolicyTypeEgress)
			}
			if !slices.Equal(np.Spec.PolicyTypes, wantTypes) {
				t.Errorf("policyTypes: got %v, want %v (egress unrestricted unless asked)", np.Spec.PolicyTypes, wantTypes)
			}

			if len(np.Spec.Ingress) != 1 {
				t.Fatalf("got %d ingress rules, want 1", len(np.Spec.Ingress))
			}
			// One rule: the peers that reach the http port reach the grpc
			// port too.
			in := np.Spec.Ingress[0]
			wantIngress := tt.wantIngress
			if wantIngress == nil {
				wantIngress = []string{"http/TCP", "grpc/TCP"}
			}
			if got := ports(in.Ports); !slices.Equal(got, wantIngress) {
				t.Errorf("ingress ports: got %v, want %v", got, wantIngress)
			}
			// Each named port is one the container declares.
			var containerPorts []string
			for _, p := range m.container(t).Ports {
				containerPorts = append(containerPorts, p.Name+"/"+string(p.Protocol))
			}
			for _, p := range ports(in.Ports) {
				if !slices.Contains(containerPorts, p) {
					t.Errorf("ingress port %s: the container declares only %v", p, containerPorts)
				}
			}
			if len(in.From) != tt.wantFrom {
				t.Errorf("ingress peers: got %d, want %d", len(in.From), tt.wantFrom)
			}
			if len(in.From) > 0 && !anyPeerSelects(t, in.From, m.TestPod.Labels) {
				t.Errorf("no ingress peer selects the helm test pod (labels %v)", m.TestPod.Labels)
			}

			var gotEgress [][]string
			for _, r := range np.Spec.Egress {
				gotEgress = append(gotEgress, ports(r.Ports))
			}
			if fmt.Sprint(gotEgress) != fmt.Sprint(tt.wantEgress) {
				t.Errorf("egress rule ports: got %v, want %v", gotEgress, tt.wantEgress)
			}
			if tt.wantTo != nil {
				var gotTo []int
				for _, r := range np.Spec.Egress {
					gotTo = append(gotTo, len(r.To))
				}
				if !slices.Equal(gotTo, tt.wantTo) {
					t.Errorf("egress rule peers: got %v, want %v", gotTo, tt.wantTo)
				}
			}
		})
	}
}

func ports(ps []networkingv1.NetworkPolicyPort) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		port, proto := "", ""
		if p.Port != nil {
			port = p.Port.String()
		}
		if p.Protocol != nil {
			proto = string(*p.Protocol)
		}
		out[i] = port + "/" + proto
	}
	return out
}

// anyPeerSelects reports whether a peer selects pods with the labels in the
// policy's own namespace.
func anyPeerSelects(t *testing.T, peers []networkingv1.NetworkPolicyPeer, podLabels map[string]string) bool {
	t.Helper()
	for _, p := range peers {
		if p.PodSelector == nil || p.NamespaceSelector != nil || p.IPBlock != nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(p.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if sel.Matches(labels.Set(podLabels)) {
			return true
		}
	}
	return false
}
