package helmtest

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	yaml3 "go.yaml.in/yaml/v3"
)

const (
	// envoyConfigMapSuffix ends the name of the chart's ConfigMap of
	// Envoy rules: <fullname>-envoy.
	envoyConfigMapSuffix = "-envoy"
	// envoyConfigDir is where the pods find the Envoy rules.
	envoyConfigDir = "/etc/ratelimiter/envoy"
)

// domains returns the domains an envoyproxy/ratelimit configuration file
// declares, one per YAML document.
func domains(t *testing.T, text string) []string {
	t.Helper()
	var out []string
	dec := yaml3.NewDecoder(strings.NewReader(text))
	for {
		var doc struct {
			Domain string `yaml:"domain"`
		}
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("Envoy configuration file: %v\n%s", err, text)
		}
		out = append(out, doc.Domain)
	}
}

// TestGRPCPorts checks that, with grpc.enabled, the container declares a
// port named grpc and the Service exposes it as gRPC (appProtocol grpc,
// for Istio), after the http port; that the service, loading the pod's
// settings with its own loader, serves gRPC there; and that with gRPC off
// no such port exists and the service serves none.
func TestGRPCPorts(t *testing.T) {
	t.Parallel()
	sets := append(allValueSets(t),
		valueSet{name: "gRPC off", extra: "grpc: {enabled: false}\n"},
		valueSet{name: "gRPC off, its ports those of HTTP", extra: "grpc: {enabled: false, containerPort: 8080}\nservice: {grpcPort: 8080}\n"},
		valueSet{name: "gRPC on ports of its own", extra: "grpc: {containerPort: 9091}\nservice: {type: NodePort, port: 80, grpcPort: 443}\n"},
	)
	for _, vs := range sets {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, vs)
			values := vs.values(t)
			c := m.container(t)
			enabled := lookup(t, values, "grpc", "enabled") == true
			port := int32(lookupInt(t, values, "grpc", "containerPort"))
			svcPort := int32(lookupInt(t, values, "service", "grpcPort"))

			var names []string
			for _, p := range c.Ports {
				names = append(names, p.Name)
			}
			svc := m.Service.Spec.Ports
			var svcNames []string
			for _, p := range svc {
				svcNames = append(svcNames, p.Name)
			}
			// http stays first: the notes read the NodePort of ports[0],
			// and the helm test pod its port.
			wantNames := []string{"http"}
			if enabled {
				wantNames = append(wantNames, "grpc")
			}
			if !slices.Equal(names, wantNames) {
				t.Fatalf("container ports: got %v, want %v", names, wantNames)
			}
			if !slices.Equal(svcNames, wantNames) {
				t.Fatalf("Service ports: got %v, want %v", svcNames, wantNames)
			}

			vars := env(c)
			cfg, _ := serviceConfig(t, m)
			if !enabled {
				if e := vars["RATELIMITER_GRPC_LISTEN"]; e.Name == "" || e.Value != "" {
					t.Errorf("RATELIMITER_GRPC_LISTEN: got %+v, want it set and empty", e)
				}
				if want := []string{"--grpc-listen="}; !slices.Equal(grpcArgs(c.Args), want) {
					t.Errorf("args: got %q, want %q", c.Args, want)
				}
				if cfg.GRPCListen != "" {
					t.Errorf("the service serves gRPC on %q, want no gRPC", cfg.GRPCListen)
				}
				return
			}

			cp := c.Ports[1]
			if cp.ContainerPort != port || cp.Protocol != corev1.ProtocolTCP {
				t.Errorf("container port grpc: got %d/%s, want %d/TCP", cp.ContainerPort, cp.Protocol, port)
			}
			sp := svc[1]
			if sp.Port != svcPort || sp.TargetPort != intstr.FromString("grpc") || sp.Protocol != corev1.ProtocolTCP {
				t.Errorf("Service port grpc: got %d/%s to %s, want %d/TCP to the target port grpc", sp.Port, sp.Protocol, sp.TargetPort.String(), svcPort)
			}
			if got := deref(sp.AppProtocol); got != "grpc" {
				t.Errorf("Service port grpc appProtocol: got %v, want grpc", got)
			}
			want := fmt.Sprintf(":%d", port)
			if got := vars["RATELIMITER_GRPC_LISTEN"].Value; got != want {
				t.Errorf("RATELIMITER_GRPC_LISTEN: got %q, want %q", got, want)
			}
			if got := grpcArgs(c.Args); len(got) != 0 {
				t.Errorf("args: got %q, want no --grpc-listen", c.Args)
			}
			if cfg.GRPCListen != want {
				t.Errorf("the service serves gRPC on %q, want %q", cfg.GRPCListen, want)
			}
		})
	}
}

// TestEnvoyConfig checks where the rules of the rate limit service come
// from: envoy.config, written to the chart's own ConfigMap, or
// envoy.existingConfigMap; that the ConfigMap is mounted whole, as a
// directory the service reloads, and RATELIMITER_ENVOY_CONFIG names that
// directory; that the service loads the rules; and that envoy.headers
// reaches RATELIMITER_ENVOY_HEADERS. The values of examples/envoy are
// among the cases, as shipped.
func TestEnvoyConfig(t *testing.T) {
	t.Parallel()
	example, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "envoy", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var exampleValues struct {
		Envoy struct {
			Config map[string]string `yaml:"config"`
		} `yaml:"envoy"`
	}
	if err := yaml3.Unmarshal(example, &exampleValues); err != nil || len(exampleValues.Envoy.Config) == 0 {
		t.Fatalf("examples/envoy/values.yaml: %v, envoy.config %v", err, exampleValues.Envoy.Config)
	}
	const web = "domain: web\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"
	const two = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n---\ndomain: b\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unlimited: true}\n"
	tests := []struct {
		name   string
		values string
		// wantConfigMap is the ConfigMap mounted, empty for none.
		wantConfigMap string
		// wantFiles is the data of the chart's own ConfigMap, nil when it
		// renders none.
		wantFiles   map[string]string
		wantDomains []string
		wantHeaders string
	}{
		{name: "no rules", values: "", wantHeaders: "false"},
		{
			name:          "rules in the values",
			values:        "envoy:\n  config:\n    web.yaml: |\n" + indent(web, 6),
			wantConfigMap: "rel-ratelimiter-envoy",
			wantFiles:     map[string]string{"web.yaml": web},
			wantDomains:   []string{"web"},
			wantHeaders:   "false",
		},
		{
			name:          "rules in two files, with headers",
			values:        "envoy:\n  headers: true\n  config:\n    web.yaml: |\n" + indent(web, 6) + "    more.rules.yaml: |\n" + indent(two, 6),
			wantConfigMap: "rel-ratelimiter-envoy",
			wantFiles:     map[string]string{"web.yaml": web, "more.rules.yaml": two},
			wantDomains:   []string{"a", "b", "web"},
			wantHeaders:   "true",
		},
		{
			name:          "rules under a full name override",
			values:        "fullnameOverride: edge-limits\nenvoy:\n  config:\n    web.yaml: |\n" + indent(web, 6),
			wantConfigMap: "edge-limits-envoy",
			wantFiles:     map[string]string{"web.yaml": web},
			wantDomains:   []string{"web"},
			wantHeaders:   "false",
		},
		{
			name:          "rules in an existing ConfigMap",
			values:        "envoy: {existingConfigMap: mesh-rules}\n",
			wantConfigMap: "mesh-rules",
			wantDomains:   []string{"mesh-rules"},
			wantHeaders:   "false",
		},
		{
			name:          "rules with gRPC off",
			values:        "grpc: {enabled: false}\nenvoy: {existingConfigMap: mesh-rules, headers: true}\n",
			wantConfigMap: "mesh-rules",
			wantDomains:   []string{"mesh-rules"},
			wantHeaders:   "true",
		},
		{name: "headers without rules", values: "envoy: {headers: true}\n", wantHeaders: "true"},
		{
			name:          "examples/envoy/values.yaml",
			values:        string(example),
			wantConfigMap: "rel-ratelimiter-envoy",
			wantFiles:     exampleValues.Envoy.Config,
			wantDomains:   []string{"web"},
			wantHeaders:   "false",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, valueSet{name: tt.name, extra: tt.values})
			c := m.container(t)
			vars := env(c)

			if got := vars["RATELIMITER_ENVOY_HEADERS"].Value; got != tt.wantHeaders {
				t.Errorf("RATELIMITER_ENVOY_HEADERS: got %q, want %q", got, tt.wantHeaders)
			}
			cfg, _ := serviceConfig(t, m)
			if got := cfg.Envoy.Domains(); !slices.Equal(got, tt.wantDomains) {
				t.Errorf("domains the service loads: got %q, want %q", got, tt.wantDomains)
			}
			for k := range m.Deployment.Spec.Template.Annotations {
				if strings.Contains(k, "envoy") {
					t.Errorf("pod annotation %s: want none for the Envoy rules, which reload without a restart", k)
				}
			}

			cm := m.EnvoyConfigMap
			switch {
			case tt.wantFiles == nil && cm != nil:
				t.Errorf("got ConfigMap %s, want none", cm.Name)
			case tt.wantFiles != nil && cm == nil:
				t.Errorf("got no ConfigMap of Envoy rules, want one")
			case cm != nil:
				if cm.Name != tt.wantConfigMap || cm.Namespace != namespace {
					t.Errorf("ConfigMap: got %s/%s, want %s/%s", cm.Namespace, cm.Name, namespace, tt.wantConfigMap)
				}
				if !maps.Equal(cm.Data, tt.wantFiles) {
					t.Errorf("ConfigMap data: got %q, want %q", cm.Data, tt.wantFiles)
				}
				if !maps.Equal(cm.Labels, m.ConfigMap.Labels) {
					t.Errorf("ConfigMap labels: got %v, want the release's %v", cm.Labels, m.ConfigMap.Labels)
				}
			}

			if tt.wantConfigMap == "" {
				if e, ok := vars["RATELIMITER_ENVOY_CONFIG"]; ok {
					t.Errorf("RATELIMITER_ENVOY_CONFIG: got %q, want it unset", e.Value)
				}
				for _, v := range m.Deployment.Spec.Template.Spec.Volumes {
					if v.Name == "envoy-config" {
						t.Errorf("got volume %+v, want none", v)
					}
				}
				return
			}
			dir := vars["RATELIMITER_ENVOY_CONFIG"].Value
			if dir != envoyConfigDir {
				t.Errorf("RATELIMITER_ENVOY_CONFIG: got %q, want the directory %s", dir, envoyConfigDir)
			}
			if got := mountedConfigMap(t, m.Deployment.Spec.Template.Spec, c, dir); got.Name != tt.wantConfigMap {
				t.Errorf("ConfigMap mounted at %s: got %s, want %s", dir, got.Name, tt.wantConfigMap)
			}
		})
	}
}

// indent prefixes every line of text with n spaces.
func indent(text string, n int) string {
	var b strings.Builder
	for line := range strings.Lines(text) {
		b.WriteString(strings.Repeat(" ", n) + line)
	}
	return b.String()
}

// grpcArgs returns the --grpc-listen arguments of args; the others (the
// tokens file, TLS) are other tests' business.
func grpcArgs(args []string) []string {
	var out []string
	for _, a := range args {
		if strings.HasPrefix(a, "--grpc-listen") {
			out = append(out, a)
		}
	}
	return out
}
