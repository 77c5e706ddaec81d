package helmtest

import (
	"slices"
	"testing"
)

// TestOTelEnv checks that the otel values reach the container as the
// standard OTEL_* variables, and that tracing off sets nothing but the
// exporter.
func TestOTelEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values string
		want   map[string]string // every OTEL_* variable with a value
	}{
		{
			name:   "off by default",
			values: "",
			want:   map[string]string{"OTEL_TRACES_EXPORTER": "none"},
		},
		{
			name:   "off ignores the other settings",
			values: "otel: {endpoint: 'http://c:4318', sampler: always_off, serviceName: x}\n",
			want:   map[string]string{"OTEL_TRACES_EXPORTER": "none"},
		},
		{
			name: "OTLP over gRPC, every setting",
			values: `otel:
  tracesExporter: otlp
  endpoint: http://otel-collector.observability:4317
  protocol: grpc
  sampler: parentbased_traceidratio
  samplerArg: 0.25
  serviceName: edge-limits
  resourceAttributes: {deployment.environment: prod, team: platform}
`,
			want: map[string]string{
				"OTEL_TRACES_EXPORTER":        "otlp",
				"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4317",
				"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
				"OTEL_TRACES_SAMPLER":         "parentbased_traceidratio",
				"OTEL_TRACES_SAMPLER_ARG":     "0.25",
				"OTEL_SERVICE_NAME":           "edge-limits",
				"OTEL_RESOURCE_ATTRIBUTES":    "k8s.namespace.name=$(K8S_NAMESPACE_NAME),k8s.pod.name=$(K8S_POD_NAME),deployment.environment=prod,team=platform",
			},
		},
		{
			name:   "OTLP with the SDK's default endpoint",
			values: "otel: {tracesExporter: otlp}\n",
			want: map[string]string{
				"OTEL_TRACES_EXPORTER":        "otlp",
				"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
				"OTEL_TRACES_SAMPLER":         "parentbased_always_on",
				"OTEL_RESOURCE_ATTRIBUTES":    "k8s.namespace.name=$(K8S_NAMESPACE_NAME),k8s.pod.name=$(K8S_POD_NAME)",
			},
		},
		{
			name:   "console with a ratio of zero",
			values: "otel: {tracesExporter: console, sampler: traceidratio, samplerArg: 0}\n",
			want: map[string]string{
				"OTEL_TRACES_EXPORTER":        "console",
				"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
				"OTEL_TRACES_SAMPLER":         "traceidratio",
				"OTEL_TRACES_SAMPLER_ARG":     "0",
				"OTEL_RESOURCE_ATTRIBUTES":    "k8s.namespace.name=$(K8S_NAMESPACE_NAME),k8s.pod.name=$(K8S_POD_NAME)",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := render(t, valueSet{name: tt.name, extra: tt.values}).container(t)
			vars := env(c)
			for _, name := range envNames(vars, "OTEL_") {
				want, ok := tt.want[name]
				if !ok {
					t.Errorf("%s: got %q, want it unset", name, vars[name].Value)
				} else if got := vars[name].Value; got != want {
					t.Errorf("%s: got %q, want %q", name, got, want)
				}
			}
			for name, want := range tt.want {
				if _, ok := vars[name]; !ok {
					t.Errorf("%s: got it unset, want %q", name, want)
				}
			}
			// Kubernetes expands $(VAR) only from variables defined earlier.
			if _, ok := tt.want["OTEL_RESOURCE_ATTRIBUTES"]; ok {
				names := make([]string, len(c.Env))
				for i, e := range c.Env {
					names[i] = e.Name
				}
				attrs := slices.Index(names, "OTEL_RESOURCE_ATTRIBUTES")
				for _, dep := range []string{"K8S_NAMESPACE_NAME", "K8S_POD_NAME"} {
					if i := slices.Index(names, dep); i < 0 || i > attrs {
						t.Errorf("%s: at %d, want it defined before OTEL_RESOURCE_ATTRIBUTES (at %d)", dep, i, attrs)
					} else if vars[dep].ValueFrom == nil || vars[dep].ValueFrom.FieldRef == nil {
						t.Errorf("%s: got %+v, want it from the pod's fields", dep, vars[dep])
					}
				}
			}
		})
	}
}
