package rls

import (
	"os"
	"slices"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/goccy/go-yaml"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// validated is what protoc-gen-validate generates for Envoy's types.
type validated interface{ ValidateAll() error }

// decode reads YAML into an Envoy configuration message, strictly, and
// validates it by Envoy's own rules, and every typed_config inside it that
// Envoy would read.
func decode(t *testing.T, what string, data []byte, m proto.Message) {
	t.Helper()
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := protojson.Unmarshal(js, m); err != nil {
		t.Fatalf("%s: not Envoy's configuration: %v", what, err)
	}
	if err := m.(validated).ValidateAll(); err != nil {
		t.Fatalf("%s: refused by Envoy's validation: %v", what, err)
	}
}

// typed unpacks and validates a typed_config.
func typed(t *testing.T, what string, a *anypb.Any) proto.Message {
	t.Helper()
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := m.(validated).ValidateAll(); err != nil {
		t.Fatalf("%s: refused by Envoy's validation: %v", what, err)
	}
	return m
}

// descriptorKeys are the keys of the descriptors the rate limit actions
// send, as Envoy makes them.
func descriptorKeys(t *testing.T, rls []*routev3.RateLimit) []string {
	t.Helper()
	var keys []string
	for _, rl := range rls {
		for _, a := range rl.Actions {
			switch {
			case a.GetRemoteAddress() != nil:
				keys = append(keys, "remote_address")
			case a.GetRequestHeaders() != nil:
				keys = append(keys, a.GetRequestHeaders().GetDescriptorKey())
			default:
				t.Fatalf("an action this test does not know: %v", a)
			}
		}
	}
	return keys
}

// TestEnvoyExamples holds the examples of examples/envoy to Envoy's own
// configuration types and validation (Envoy itself cannot run here), and
// to the rules they are meant for: every descriptor they send has a rule.
func TestEnvoyExamples(t *testing.T) {
	cfg, err := Load("../../examples/envoy/ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, filter *ratelimitfilterv3.RateLimit, keys []string) {
		t.Helper()
		if !slices.Contains(cfg.Domains(), filter.Domain) {
			t.Errorf("%s: domain %q, which ratelimit.yaml does not declare", what, filter.Domain)
		}
		if !filter.FailureModeDeny || filter.GetRateLimitService().GetTransportApiVersion().String() != "V3" {
			t.Errorf("%s: the filter must deny on failure and speak v3: %v", what, filter)
		}
		if len(keys) != 2 {
			t.Errorf("%s: descriptors %v, want a client address and an API key", what, keys)
		}
		for _, k := range keys {
			if r, _ := cfg.Match(filter.Domain, []Entry{{Key: k, Value: "x"}}); r == nil {
				t.Errorf("%s: descriptor %s has no rule in ratelimit.yaml", what, k)
			}
		}
	}

	data, err := os.ReadFile("../../examples/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var boot bootstrapv3.Bootstrap
	decode(t, "envoy.yaml", data, &boot)
	hcm := typed(t, "envoy.yaml: the connection manager", boot.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig()).(*hcmv3.HttpConnectionManager)
	var filter *ratelimitfilterv3.RateLimit
	for _, f := range hcm.HttpFilters {
		if m, ok := typed(t, "envoy.yaml: "+f.Name, f.GetTypedConfig()).(*ratelimitfilterv3.RateLimit); ok {
			filter = m
		}
	}
	if filter == nil {
		t.Fatal("envoy.yaml: no rate limit filter")
	}
	if got := filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); !slices.ContainsFunc(boot.StaticResources.Clusters, func(c *clusterv3.Cluster) bool { return c.GetName() == got }) {
		t.Errorf("envoy.yaml: the filter asks cluster %q, which is not declared", got)
	}
	check("envoy.yaml", filter, descriptorKeys(t, hcm.GetRouteConfig().VirtualHosts[0].Routes[0].GetRoute().RateLimits))

	data, err = os.ReadFile("../../examples/envoy/istio-envoyfilter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ef struct {
		Spec struct {
			ConfigPatches []struct {
				ApplyTo string `yaml:"applyTo"`
				Patch   struct {
					Value map[string]any `yaml:"value"`
				} `yaml:"patch"`
			} `yaml:"configPatches"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(data, &ef); err != nil {
		t.Fatal(err)
	}
	var keys []string
	filter = nil
	for _, p := range ef.Spec.ConfigPatches {
		value, err := yaml.Marshal(p.Patch.Value)
		if err != nil {
			t.Fatal(err)
		}
		switch p.ApplyTo {
		case "HTTP_FILTER":
			var f hcmv3.HttpFilter
			decode(t, "istio-envoyfilter.yaml: the filter", value, &f)
			filter, _ = typed(t, "istio-envoyfilter.yaml: "+f.Name, f.GetTypedConfig()).(*ratelimitfilterv3.RateLimit)
		case "VIRTUAL_HOST":
			var vh struct {
				RateLimits []map[string]any `yaml:"rate_limits"`
			}
			if err := yaml.Unmarshal(value, &vh); err != nil {
				t.Fatal(err)
			}
			var rls []*routev3.RateLimit
			for _, r := range vh.RateLimits {
				one, err := yaml.Marshal(r)
				if err != nil {
					t.Fatal(err)
				}
				var rl routev3.RateLimit
				decode(t, "istio-envoyfilter.yaml: rate_limits", one, &rl)
				rls = append(rls, &rl)
			}
			keys = descriptorKeys(t, rls)
		default:
			t.Errorf("istio-envoyfilter.yaml: a patch of %s, which this test does not check", p.ApplyTo)
		}
	}
	if filter == nil {
		t.Fatal("istio-envoyfilter.yaml: no rate limit filter")
	}
	check("istio-envoyfilter.yaml", filter, keys)

	// The chart values carry the same rules.
	data, err = os.ReadFile("../../examples/envoy/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Envoy struct {
			Config map[string]string `yaml:"config"`
		} `yaml:"envoy"`
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	chart, err := Parse("values.yaml: envoy.config", []byte(values.Envoy.Config["web.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if len(chart.Rules) != len(cfg.Rules) {
		t.Fatalf("values.yaml: %d rules, ratelimit.yaml %d", len(chart.Rules), len(cfg.Rules))
	}
	for i, r := range chart.Rules {
		want := cfg.Rules[i]
		if r.Path != want.Path || r.Limiter.Name != want.Limiter.Name || r.Limiter.Policy != want.Limiter.Policy || r.Unlimited != want.Unlimited {
			t.Errorf("values.yaml: rule %s %+v, ratelimit.yaml %+v", r.Path, r.Limiter, want.Limiter)
		}
	}
}
