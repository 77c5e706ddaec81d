package helmtest

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ratelimiter/ratelimiter/internal/config"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// mountedFile finds the volume and the key within it that the pod shows at
// file, an absolute path in container c.
func mountedFile(t *testing.T, spec corev1.PodSpec, c corev1.Container, file string) (corev1.Volume, string) {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		if path.Dir(file) != path.Clean(vm.MountPath) || vm.SubPath != "" {
			continue
		}
		if !vm.ReadOnly {
			t.Errorf("volume mount %s: got read-write, want read-only", vm.Name)
		}
		for _, v := range spec.Volumes {
			if v.Name != vm.Name {
				continue
			}
			var items []corev1.KeyToPath
			switch {
			case v.ConfigMap != nil:
				items = v.ConfigMap.Items
			case v.Secret != nil:
				items = v.Secret.Items
			default:
				t.Fatalf("volume %s: got neither a ConfigMap nor a Secret", v.Name)
			}
			for _, it := range items {
				if it.Path == path.Base(file) {
					return v, it.Key
				}
			}
			t.Fatalf("volume %s has no item at %s: %+v", v.Name, path.Base(file), items)
		}
		t.Fatalf("volume mount %s names no volume", vm.Name)
	}
	t.Fatalf("no volume is mounted at %s", path.Dir(file))
	return corev1.Volume{}, ""
}

// serviceConfig runs the service's own configuration loader on what the
// rendered Deployment gives the container: its environment and the files
// mounted from the ConfigMap and the admin token Secret, written to a
// temporary directory. A token from a Secret the chart does not create is
// read as existingToken. It also returns the container's environment.
func serviceConfig(t *testing.T, m *manifests, existingToken string) (config.Config, map[string]corev1.EnvVar) {
	t.Helper()
	spec := m.Deployment.Spec.Template.Spec
	c := m.container(t)
	vars := env(c)
	dir := t.TempDir()
	values := make(map[string]string)
	for name, e := range vars {
		if e.ValueFrom == nil {
			values[name] = e.Value
		}
	}

	cfgPath := vars["RATELIMITER_CONFIG"].Value
	if cfgPath == "" {
		t.Fatal("RATELIMITER_CONFIG is not set")
	}
	vol, key := mountedFile(t, spec, c, cfgPath)
	if vol.ConfigMap == nil || vol.ConfigMap.Name != m.ConfigMap.Name {
		t.Fatalf("RATELIMITER_CONFIG=%s: got volume %+v, want the ConfigMap %s", cfgPath, vol, m.ConfigMap.Name)
	}
	file, ok := m.ConfigMap.Data[key]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", m.ConfigMap.Name, key)
	}
	values["RATELIMITER_CONFIG"] = writeFile(t, dir, "config.yaml", file)

	if tokenPath := vars["RATELIMITER_ADMIN_TOKEN_FILE"].Value; tokenPath != "" {
		vol, key := mountedFile(t, spec, c, tokenPath)
		if vol.Secret == nil {
			t.Fatalf("RATELIMITER_ADMIN_TOKEN_FILE=%s: got volume %+v, want a Secret", tokenPath, vol)
		}
		token := existingToken
		if m.Secret != nil && m.Secret.Name == vol.Secret.SecretName {
			b, ok := m.Secret.Data[key]
			if !ok {
				t.Fatalf("Secret %s has no key %s", m.Secret.Name, key)
			}
			token = string(b)
		}
		values["RATELIMITER_ADMIN_TOKEN_FILE"] = writeFile(t, dir, "token", token)
	}

	cfg, err := config.Load(nil, func(name string) string { return values[name] })
	if err != nil {
		t.Fatalf("the service refuses the chart's configuration: %v\nconfig file:\n%s", err, file)
	}
	return cfg, vars
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantPolicy is the normalized policy that a limiter or tenants section of
// the values describes.
func wantPolicy(t *testing.T, v map[string]any) limiter.Policy {
	t.Helper()
	period, err := time.ParseDuration(lookupString(t, v, "period"))
	if err != nil {
		t.Fatal(err)
	}
	p := limiter.Policy{Limit: lookupInt(t, v, "limit"), Period: period}
	if a, ok := v["algorithm"].(string); ok {
		p.Algorithm = limiter.Algorithm(a)
	}
	if b, ok := v["burst"].(float64); ok {
		p.Burst = int64(b)
	}
	return p.Normalize()
}

// TestConfigWiring checks, for each values set, that the service loads the
// configuration the chart gives it (ConfigMap file, Secret file and
// environment) with its own config.Load, and that the result is what the
// values say.
func TestConfigWiring(t *testing.T) {
	t.Parallel()
	const existingToken = "token-from-an-existing-secret"
	sets := append(allValueSets(t), valueSet{
		name: "limiter names YAML would read as other types",
		extra: `config:
  limiters:
    - {name: "true", limit: 1, period: 1s}
    - {name: "null", limit: 2, period: 2s}
    - {name: "123", limit: 3, period: 3s}
    - {name: "1e3", limit: 4, period: 4s}
    - {name: "on", limit: 5, period: 5s}
    - {name: "0x1F", limit: 6, period: 1.5h}
`,
	})
	for _, vs := range sets {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, vs)
			values := vs.values(t)
			cfg, vars := serviceConfig(t, m, existingToken)

			var wantLimiters []limiter.Definition
			for _, l := range lookup(t, values, "config", "limiters").([]any) {
				l := l.(map[string]any)
				wantLimiters = append(wantLimiters, limiter.Definition{Name: lookupString(t, l, "name"), Policy: wantPolicy(t, l)})
			}
			if !slices.Equal(cfg.Limiters, wantLimiters) {
				t.Errorf("limiters: got %+v, want %+v", cfg.Limiters, wantLimiters)
			}
			tenants := lookup(t, values, "config", "tenants").(map[string]any)
			if got, want := cfg.Tenants.Policy, wantPolicy(t, tenants); got != want {
				t.Errorf("per-IP policy: got %+v, want %+v", got, want)
			}

			wantToken := lookupString(t, values, "adminToken", "value")
			if s := lookupString(t, values, "adminToken", "existingSecret"); s != "" {
				wantToken = existingToken
				vol, key := mountedFile(t, m.Deployment.Spec.Template.Spec, m.container(t), vars["RATELIMITER_ADMIN_TOKEN_FILE"].Value)
				wantKey := lookupString(t, values, "adminToken", "existingSecretKey")
				if vol.Secret.SecretName != s || key != wantKey {
					t.Errorf("admin token volume: got Secret %s key %s, want %s key %s", vol.Secret.SecretName, key, s, wantKey)
				}
				if m.Secret != nil {
					t.Errorf("got Secret %s, want none with an existing Secret", m.Secret.Name)
				}
			}
			if cfg.AdminToken != wantToken {
				t.Errorf("admin token: got %q, want %q", cfg.AdminToken, wantToken)
			}
			if _, ok := vars["RATELIMITER_ADMIN_TOKEN"]; ok {
				t.Error("RATELIMITER_ADMIN_TOKEN is set: the token belongs in a file, never in the pod spec")
			}

			checks := []struct {
				name      string
				got, want any
			}{
				{"listen", cfg.Listen, fmt.Sprintf(":%d", lookupInt(t, values, "containerPort"))},
				{"backend", cfg.Backend, lookupString(t, values, "backend", "type")},
				{"IPv6 prefix", int64(cfg.Tenants.IPv6Prefix), lookupInt(t, values, "config", "tenants", "ipv6_prefix")},
				{"max tenants", int64(cfg.Tenants.MaxTenants), lookupInt(t, values, "config", "tenants", "max_tenants")},
				{"shutdown delay", cfg.ShutdownDelay, time.Duration(lookupInt(t, values, "shutdown", "delaySeconds")) * time.Second},
				{"shutdown timeout", cfg.ShutdownTimeout, time.Duration(lookupInt(t, values, "shutdown", "timeoutSeconds")) * time.Second},
				{"max body bytes", cfg.MaxBodyBytes, lookupInt(t, values, "server", "maxBodyBytes")},
				{"max header bytes", int64(cfg.MaxHeaderBytes), lookupInt(t, values, "server", "maxHeaderBytes")},
				{"read timeout", cfg.ReadTimeout.String(), mustDuration(t, lookupString(t, values, "server", "readTimeout")).String()},
				{"log format", cfg.LogFormat, lookupString(t, values, "log", "format")},
				{"log level", strings.ToLower(cfg.LogLevel.String()), lookupString(t, values, "log", "level")},
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
				}
			}
		})
	}
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestChecksumAnnotations checks that the pod template changes, so that the
// pods roll, exactly when the configuration file or the chart's admin token
// Secret changes.
func TestChecksumAnnotations(t *testing.T) {
	t.Parallel()
	const base = `adminToken:
  value: first-token
config:
  limiters:
    - {name: upstream, limit: 10, period: 1m}
`
	tests := []struct {
		name                         string
		extra                        string
		configChanges, secretChanges bool
	}{
		{name: "same values", extra: base},
		{name: "limiter added", extra: base + "    - {name: other, limit: 1, period: 1s}\n", configChanges: true},
		{name: "limit changed", extra: strings.Replace(base, "limit: 10", "limit: 11", 1), configChanges: true},
		{name: "per-IP policy changed", extra: base + "  tenants: {limit: 7}\n", configChanges: true},
		{name: "admin token changed", extra: strings.Replace(base, "first-token", "second-token", 1), secretChanges: true},
		{name: "unrelated value changed", extra: base + "log: {level: debug}\n"},
	}
	before := render(t, valueSet{name: "base", extra: base}).Deployment.Spec.Template.Annotations
	for _, key := range []string{"checksum/config", "checksum/secret"} {
		if len(before[key]) != 64 {
			t.Fatalf("annotation %s: got %q, want a SHA-256 in hex", key, before[key])
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			after := render(t, valueSet{name: tt.name, extra: tt.extra}).Deployment.Spec.Template.Annotations
			for key, wantChange := range map[string]bool{"checksum/config": tt.configChanges, "checksum/secret": tt.secretChanges} {
				if changed := after[key] != before[key]; changed != wantChange {
					t.Errorf("%s changed: got %v, want %v (before %s, after %s)", key, changed, wantChange, before[key], after[key])
				}
			}
		})
	}
}
