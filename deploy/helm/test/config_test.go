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
	"k8s.io/apimachinery/pkg/api/equality"

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

// existingSecretValue is what the tests take key of a Secret the chart does
// not create to hold: a value naming both, so that a test can tell which
// Secret and key a mounted file came from.
func existingSecretValue(secret, key string) string {
	return "from-" + secret + "." + key
}

// secretFile returns the Secret and key the pod shows at file, an absolute
// path in container c, and what the pod reads there: the value in the
// chart's own Secret, or existingSecretValue for another Secret.
func secretFile(t *testing.T, m *manifests, c corev1.Container, file string) (secret, key, content string) {
	t.Helper()
	vol, key := mountedFile(t, m.Deployment.Spec.Template.Spec, c, file)
	if vol.Secret == nil {
		t.Fatalf("%s: got volume %+v, want a Secret", file, vol)
	}
	name := vol.Secret.SecretName
	s, ok := m.Secrets[name]
	if !ok {
		return name, key, existingSecretValue(name, key)
	}
	b, ok := s.Data[key]
	if !ok {
		t.Fatalf("Secret %s has no key %s", name, key)
	}
	return name, key, string(b)
}

// serviceConfig runs the service's own configuration loader on what the
// rendered Deployment gives the container: its arguments, its environment
// and the files mounted from the ConfigMaps (the configuration file, the
// Envoy rules) and from Secrets (admin token, Redis password, Redis CA
// certificates), written to a temporary directory. It also returns the
// container's environment.
func serviceConfig(t *testing.T, m *manifests) (config.Config, map[string]corev1.EnvVar) {
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

	for _, name := range []string{"RATELIMITER_ADMIN_TOKEN_FILE", "RATELIMITER_REDIS_PASSWORD_FILE", "RATELIMITER_REDIS_TLS_CA_FILE"} {
		if p := vars[name].Value; p != "" {
			_, _, content := secretFile(t, m, c, p)
			values[name] = writeFile(t, dir, name, content)
		}
	}

	if p := vars["RATELIMITER_ENVOY_CONFIG"].Value; p != "" {
		envoyDir := filepath.Join(dir, "envoy")
		if err := os.Mkdir(envoyDir, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, content := range envoyFiles(t, m, c, p) {
			writeFile(t, envoyDir, name, content)
		}
		values["RATELIMITER_ENVOY_CONFIG"] = envoyDir
	}

	cfg, err := config.Load(c.Args, func(name string) string { return values[name] })
	if err != nil {
		t.Fatalf("the service refuses the chart's configuration: %v\nconfig file:\n%s", err, file)
	}
	return cfg, vars
}

// mountedConfigMap returns the ConfigMap volume that container c mounts,
// whole, at dir: read-only, without subPath or items, so that the kubelet
// updates its files in place when the ConfigMap changes.
func mountedConfigMap(t *testing.T, spec corev1.PodSpec, c corev1.Container, dir string) *corev1.ConfigMapVolumeSource {
	t.Helper()
	var mounts []corev1.VolumeMount
	for _, vm := range c.VolumeMounts {
		if path.Clean(vm.MountPath) == path.Clean(dir) {
			mounts = append(mounts, vm)
		}
	}
	if len(mounts) != 1 {
		t.Fatalf("got %d volume mounts at %s, want 1: %+v", len(mounts), dir, c.VolumeMounts)
	}
	vm := mounts[0]
	if vm.SubPath != "" || vm.SubPathExpr != "" {
		t.Errorf("volume mount %s: got subPath %q, want the whole directory (a subPath is never updated)", vm.Name, vm.SubPath+vm.SubPathExpr)
	}
	if !vm.ReadOnly {
		t.Errorf("volume mount %s: got read-write, want read-only", vm.Name)
	}
	for _, v := range spec.Volumes {
		if v.Name != vm.Name {
			continue
		}
		if v.ConfigMap == nil {
			t.Fatalf("volume %s: got %+v, want a ConfigMap", v.Name, v.VolumeSource)
		}
		if len(v.ConfigMap.Items) != 0 {
			t.Errorf("volume %s: got items %+v, want every key of the ConfigMap", v.Name, v.ConfigMap.Items)
		}
		return v.ConfigMap
	}
	t.Fatalf("volume mount %s names no volume", vm.Name)
	return nil
}

// existingConfigMapFiles is what the tests take a ConfigMap of Envoy rules
// the chart does not create to hold: one file declaring a domain named
// after the ConfigMap, so that a test can tell where the rules came from.
func existingConfigMapFiles(name string) map[string]string {
	return map[string]string{"rules.yaml": "domain: " + name + "\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}
}

// envoyFiles returns the files the pod shows in dir, the directory of the
// Envoy rules in container c: the chart's ConfigMap's data, or
// existingConfigMapFiles for another ConfigMap.
func envoyFiles(t *testing.T, m *manifests, c corev1.Container, dir string) map[string]string {
	t.Helper()
	cm := mountedConfigMap(t, m.Deployment.Spec.Template.Spec, c, dir)
	if m.EnvoyConfigMap == nil || cm.Name != m.EnvoyConfigMap.Name {
		return existingConfigMapFiles(cm.Name)
	}
	return m.EnvoyConfigMap.Data
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

// wantDefinition is the normalized definition that a limiter of the values
// describes.
func wantDefinition(t *testing.T, l map[string]any) limiter.Definition {
	t.Helper()
	def := limiter.Definition{Name: lookupString(t, l, "name"), Policy: wantPolicy(t, l)}
	if g, ok := l["group"].(string); ok {
		def.Group = g
	}
	if k, ok := l["keyed"].(bool); ok {
		def.Keyed = k
	}
	if n, ok := l["max_keys"].(float64); ok {
		def.MaxKeys = int(n)
	}
	return def.Normalize()
}

// TestConfigWiring checks, for each values set, that the service loads the
// configuration the chart gives it (ConfigMap file, Secret file and
// environment) with its own config.Load, and that the result is what the
// values say.
func TestConfigWiring(t *testing.T) {
	t.Parallel()
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
	}, valueSet{
		name: "limiters in groups, keyed ones included, with names YAML would read as other types",
		extra: `config:
  limiters:
    - {name: a, limit: 1, period: 1s, group: "true", keyed: true, max_keys: 990000}
    - {name: b, limit: 2, period: 2s, group: "true"}
    - {name: c, limit: 3, period: 3s, group: "123", keyed: true}
    - {name: d, limit: 4, period: 4s, group: "1e3", keyed: false}
backend: {type: redis, redis: {addrs: ['redis:6379']}}
`,
	}, valueSet{
		name:  "every bound at its largest",
		extra: "server: {maxLimiters: 100000000}\nmetrics: {maxLimiters: 100000}\nconfig:\n  tenants: {max_tenants: 1000000000, max_bytes: 1125899906842624}\n",
	}, valueSet{
		name:  "redis with its defaults",
		extra: "backend: {type: redis, redis: {addrs: ['redis:6379']}}\n",
	}, valueSet{
		name: "redis cluster seeds over TLS with the system's authorities",
		extra: `backend:
  type: redis
  redis:
    addrs: ['10.0.0.5:7000', '[fd00::6]:7001', 'redis-2.cache.svc.cluster.local:7002']
    username: limits
    password: "pass word"
    tls: {enabled: true}
    keyPrefix: 'a:b|c~!"\\#%'
    timeout: 1.5s
    dialTimeout: 1m30s
    connsPerNode: 256
    denyCache: 0
`,
	})
	for _, vs := range sets {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, vs)
			values := vs.values(t)
			cfg, vars := serviceConfig(t, m)
			c := m.container(t)

			var wantLimiters []limiter.Definition
			for _, l := range lookup(t, values, "config", "limiters").([]any) {
				wantLimiters = append(wantLimiters, wantDefinition(t, l.(map[string]any)))
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
				wantKey := lookupString(t, values, "adminToken", "existingSecretKey")
				wantToken = existingSecretValue(s, wantKey)
				secret, key, _ := secretFile(t, m, c, vars["RATELIMITER_ADMIN_TOKEN_FILE"].Value)
				if secret != s || key != wantKey {
					t.Errorf("admin token volume: got Secret %s key %s, want %s key %s", secret, key, s, wantKey)
				}
				if _, ok := m.Secrets[m.Deployment.Name+"-admin-token"]; ok {
					t.Error("got the chart's admin token Secret, want none with an existing Secret")
				}
			}
			if cfg.AdminToken != wantToken {
				t.Errorf("admin token: got %q, want %q", cfg.AdminToken, wantToken)
			}
			if _, ok := vars["RATELIMITER_ADMIN_TOKEN"]; ok {
				t.Error("RATELIMITER_ADMIN_TOKEN is set: the token belongs in a file, never in the pod spec")
			}

			checkRedisConfig(t, m, values, cfg)

			var wantDomains []string
			if name := lookupString(t, values, "envoy", "existingConfigMap"); name != "" {
				wantDomains = []string{name}
			}
			for _, text := range lookup(t, values, "envoy", "config").(map[string]any) {
				wantDomains = append(wantDomains, domains(t, text.(string))...)
			}
			slices.Sort(wantDomains)
			if got := cfg.Envoy.Domains(); !slices.Equal(got, wantDomains) {
				t.Errorf("Envoy domains: got %q, want %q", got, wantDomains)
			}
			wantDataDir := ""
			if lookup(t, values, "persistence", "enabled") == true {
				wantDataDir = dataDir
			}
			wantGRPC := ""
			if lookup(t, values, "grpc", "enabled") == true {
				wantGRPC = fmt.Sprintf(":%d", lookupInt(t, values, "grpc", "containerPort"))
			}

			checks := []struct {
				name      string
				got, want any
			}{
				{"listen", cfg.Listen, fmt.Sprintf(":%d", lookupInt(t, values, "containerPort"))},
				{"gRPC listen", cfg.GRPCListen, wantGRPC},
				{"Envoy headers", cfg.EnvoyHeaders, lookup(t, values, "envoy", "headers")},
				{"backend", cfg.Backend, lookupString(t, values, "backend", "type")},
				{"data directory", cfg.DataDir, wantDataDir},
				{"IPv6 prefix", int64(cfg.Tenants.IPv6Prefix), lookupInt(t, values, "config", "tenants", "ipv6_prefix")},
				{"max tenants", int64(cfg.Tenants.MaxTenants), lookupInt(t, values, "config", "tenants", "max_tenants")},
				{"tenant max bytes", cfg.Tenants.MaxBytes, lookupInt(t, values, "config", "tenants", "max_bytes")},
				{"max limiters", int64(cfg.MaxLimiters), lookupInt(t, values, "server", "maxLimiters")},
				{"metrics max limiters", int64(cfg.MetricsMaxLimiters), lookupInt(t, values, "metrics", "maxLimiters")},
				{"GC min heap", cfg.GCMinHeap, lookupInt(t, values, "server", "gcMinHeapBytes")},
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

// TestLimiterGroupsAndKeys checks that the limiters of the values carry
// their group, keyed and max_keys into the service's configuration file,
// as the service reads it, and that a key left out stays out.
func TestLimiterGroupsAndKeys(t *testing.T) {
	t.Parallel()
	m := render(t, valueSet{name: "grouped keyed limiters", extra: `config:
  limiters:
    - {name: per-user, limit: 100, period: 1m, group: search, keyed: true, max_keys: 50000}
    - {name: per-route, limit: 30, period: 1m, algorithm: sliding_log, keyed: true}
    - {name: total, limit: 20, period: 1s, group: search, keyed: false}
    - {name: plain, limit: 5, period: 1h}
`})
	file := m.ConfigMap.Data["config.yaml"]
	for _, want := range []string{
		"  - name: per-user\n    limit: 100\n    period: 1m\n    group: search\n    keyed: true\n    max_keys: 50000\n",
		"  - name: per-route\n    limit: 30\n    period: 1m\n    algorithm: sliding_log\n    keyed: true\n",
		"  - name: total\n    limit: 20\n    period: 1s\n    group: search\n",
		"  - name: plain\n    limit: 5\n    period: 1h\n",
	} {
		if !strings.Contains(file, want) {
			t.Errorf("config file lacks\n%s\ngot:\n%s", want, file)
		}
	}
	if n := strings.Count(file, "keyed:"); n != 2 {
		t.Errorf("config file: got %d keyed keys, want 2 (none for a limiter not keyed):\n%s", n, file)
	}
	cfg, _ := serviceConfig(t, m)
	want := []limiter.Definition{
		{Name: "per-user", Policy: limiter.Policy{Limit: 100, Period: time.Minute, Algorithm: limiter.GCRA, Burst: 100}, Group: "search", Keyed: true, MaxKeys: 50000},
		{Name: "per-route", Policy: limiter.Policy{Limit: 30, Period: time.Minute, Algorithm: limiter.SlidingLog}, Keyed: true, MaxKeys: limiter.DefaultMaxKeys},
		{Name: "total", Policy: limiter.Policy{Limit: 20, Period: time.Second, Algorithm: limiter.GCRA, Burst: 20}, Group: "search"},
		{Name: "plain", Policy: limiter.Policy{Limit: 5, Period: time.Hour, Algorithm: limiter.GCRA, Burst: 5}},
	}
	if !slices.Equal(cfg.Limiters, want) {
		t.Errorf("limiters the service reads:\ngot  %+v\nwant %+v", cfg.Limiters, want)
	}
}

// checkRedisConfig checks that the service loaded the Redis settings the
// values give, and that with the memory backend the pod carries none.
func checkRedisConfig(t *testing.T, m *manifests, values map[string]any, cfg config.Config) {
	t.Helper()
	c := m.container(t)
	vars := env(c)
	if _, ok := vars["RATELIMITER_REDIS_PASSWORD"]; ok {
		t.Error("RATELIMITER_REDIS_PASSWORD is set: the password belongs in a file, never in the pod spec")
	}
	chartSecret := m.Deployment.Name + "-redis"
	redisVolumes := 0
	for _, v := range m.Deployment.Spec.Template.Spec.Volumes {
		if strings.HasPrefix(v.Name, "redis-") {
			redisVolumes++
		}
	}

	if lookupString(t, values, "backend", "type") != config.BackendRedis {
		if names := envNames(vars, "RATELIMITER_REDIS_"); len(names) > 0 {
			t.Errorf("memory backend: got %v set, want no Redis settings", names)
		}
		if _, ok := m.Secrets[chartSecret]; ok {
			t.Errorf("memory backend: got Secret %s, want none", chartSecret)
		}
		if redisVolumes != 0 {
			t.Errorf("memory backend: got %d Redis volumes, want none", redisVolumes)
		}
		return
	}

	r := lookup(t, values, "backend", "redis").(map[string]any)
	var addrs []string
	for _, a := range lookup(t, r, "addrs").([]any) {
		addrs = append(addrs, a.(string))
	}
	if !slices.Equal(cfg.Redis.Addrs, addrs) {
		t.Errorf("Redis addresses: got %q, want %q", cfg.Redis.Addrs, addrs)
	}

	wantVolumes := 0
	wantPassword := lookupString(t, r, "password")
	passwordSet := wantPassword != "" || lookupString(t, r, "existingSecret") != ""
	if got := vars["RATELIMITER_REDIS_PASSWORD_FILE"].Value; (got != "") != passwordSet {
		t.Fatalf("RATELIMITER_REDIS_PASSWORD_FILE: got %q, want it set exactly when a password is", got)
	}
	if s := lookupString(t, r, "existingSecret"); s != "" {
		wantKey := lookupString(t, r, "existingSecretKey")
		wantPassword = existingSecretValue(s, wantKey)
		if secret, key, _ := secretFile(t, m, c, vars["RATELIMITER_REDIS_PASSWORD_FILE"].Value); secret != s || key != wantKey {
			t.Errorf("Redis password volume: got Secret %s key %s, want %s key %s", secret, key, s, wantKey)
		}
		if _, ok := m.Secrets[chartSecret]; ok {
			t.Errorf("got Secret %s, want none with an existing Secret", chartSecret)
		}
	} else if wantPassword != "" {
		if secret, _, _ := secretFile(t, m, c, vars["RATELIMITER_REDIS_PASSWORD_FILE"].Value); secret != chartSecret {
			t.Errorf("Redis password volume: got Secret %s, want the chart's %s", secret, chartSecret)
		}
	}
	if wantPassword != "" {
		wantVolumes++
	}
	if cfg.Redis.Password != wantPassword {
		t.Errorf("Redis password: got %q, want %q", cfg.Redis.Password, wantPassword)
	}

	tls := lookup(t, r, "tls").(map[string]any)
	caSecret := lookupString(t, tls, "caSecret")
	if got := vars["RATELIMITER_REDIS_TLS_CA_FILE"].Value; (got != "") != (caSecret != "") {
		t.Fatalf("RATELIMITER_REDIS_TLS_CA_FILE: got %q, want it set exactly when tls.caSecret is", got)
	}
	if s := caSecret; s != "" {
		wantVolumes++
		wantKey := lookupString(t, tls, "caKey")
		if secret, key, _ := secretFile(t, m, c, vars["RATELIMITER_REDIS_TLS_CA_FILE"].Value); secret != s || key != wantKey {
			t.Errorf("Redis CA volume: got Secret %s key %s, want %s key %s", secret, key, s, wantKey)
		}
		// The loader takes the path from the environment; the file there
		// must be the one mounted from the CA Secret.
		b, err := os.ReadFile(cfg.Redis.TLSCAFile)
		if err != nil {
			t.Fatalf("Redis CA file: %v", err)
		}
		if got, want := string(b), existingSecretValue(s, wantKey); got != want {
			t.Errorf("Redis CA file holds %q, want %q", got, want)
		}
	} else if cfg.Redis.TLSCAFile != "" {
		t.Errorf("Redis CA file: got %q, want none", cfg.Redis.TLSCAFile)
	}
	if redisVolumes != wantVolumes {
		t.Errorf("Redis volumes: got %d, want %d", redisVolumes, wantVolumes)
	}

	checks := []struct {
		name      string
		got, want any
	}{
		{"backend", cfg.Backend, config.BackendRedis},
		{"Redis username", cfg.Redis.Username, lookupString(t, r, "username")},
		{"Redis TLS", cfg.Redis.TLS, lookup(t, tls, "enabled")},
		{"Redis key prefix", cfg.Redis.KeyPrefix, lookupString(t, r, "keyPrefix")},
		{"Redis timeout", cfg.Redis.Timeout, mustDuration(t, lookupString(t, r, "timeout"))},
		{"Redis dial timeout", cfg.Redis.DialTimeout, mustDuration(t, lookupString(t, r, "dialTimeout"))},
		{"Redis connections per node", int64(cfg.Redis.ConnsPerNode), lookupInt(t, r, "connsPerNode")},
		{"Redis deny cache", int64(cfg.Redis.DenyCache), lookupInt(t, r, "denyCache")},
		{"Redis failure mode", cfg.Redis.FailureMode, lookupString(t, r, "failureMode")},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
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

// TestChecksumAnnotations checks that each checksum annotation of the pod
// template changes exactly when what it covers changes (the configuration
// file, the chart's admin token Secret, the chart's Redis password Secret),
// that any change to the Redis settings changes the pod template, so that
// the pods roll, and that a change to the Envoy rules does not: the service
// reloads them, and a roll would lose the memory backend's state.
func TestChecksumAnnotations(t *testing.T) {
	t.Parallel()
	const base = `backend:
  type: redis
  redis:
    addrs: ['redis:6379']
    password: first-password
adminToken:
  value: first-token
envoy:
  config:
    web.yaml: |
      domain: web
      descriptors:
        - {key: remote_address, rate_limit: {unit: minute, requests_per_unit: 100}}
config:
  limiters:
    - {name: upstream, limit: 10, period: 1m}
`
	// redis returns base with one more backend.redis setting.
	redis := func(setting string) string {
		return strings.Replace(base, "    password: first-password\n", "    password: first-password\n    "+setting+"\n", 1)
	}
	tests := []struct {
		name                                             string
		extra                                            string
		configChanges, secretChanges, redisSecretChanges bool
		templateChanges                                  bool
	}{
		{name: "same values", extra: base},
		{name: "limiter added", extra: base + "    - {name: other, limit: 1, period: 1s}\n", configChanges: true, templateChanges: true},
		{name: "limit changed", extra: strings.Replace(base, "limit: 10", "limit: 11", 1), configChanges: true, templateChanges: true},
		{name: "per-IP policy changed", extra: base + "  tenants: {limit: 7}\n", configChanges: true, templateChanges: true},
		{name: "per-IP memory bound changed", extra: base + "  tenants: {max_bytes: 1048576}\n", configChanges: true, templateChanges: true},
		{name: "max limiters changed", extra: base + "server: {maxLimiters: 10}\n", templateChanges: true},
		{name: "metrics max limiters changed", extra: base + "metrics: {maxLimiters: 10}\n", templateChanges: true},
		{name: "admin token changed", extra: strings.Replace(base, "first-token", "second-token", 1), secretChanges: true, templateChanges: true},
		{name: "Redis password changed", extra: strings.Replace(base, "first-password", "second-password", 1), redisSecretChanges: true, templateChanges: true},
		{
			name:  "Redis password moved to an existing Secret",
			extra: strings.Replace(base, "password: first-password", "existingSecret: redis-auth", 1), redisSecretChanges: true, templateChanges: true,
		},
		{name: "Redis address changed", extra: strings.Replace(base, "redis:6379", "redis-2:6379", 1), templateChanges: true},
		{name: "Redis address added", extra: strings.Replace(base, "'redis:6379'", "'redis:6379', 'redis-2:6379'", 1), templateChanges: true},
		{name: "Redis user set", extra: redis("username: limits"), templateChanges: true},
		{name: "Redis TLS on", extra: redis("tls: {enabled: true}"), templateChanges: true},
		{name: "Redis CA set", extra: redis("tls: {enabled: true, caSecret: redis-ca}"), templateChanges: true},
		{name: "Redis key prefix changed", extra: redis("keyPrefix: 'other:'"), templateChanges: true},
		{name: "Redis timeout changed", extra: redis("timeout: 75ms"), templateChanges: true},
		{name: "Redis dial timeout changed", extra: redis("dialTimeout: 3s"), templateChanges: true},
		{name: "Redis connections per node changed", extra: redis("connsPerNode: 4"), templateChanges: true},
		{name: "Redis deny cache changed", extra: redis("denyCache: 0"), templateChanges: true},
		{name: "Redis failure mode changed", extra: redis("failureMode: fail-open"), templateChanges: true},
		{name: "unrelated value changed", extra: base + "log: {level: debug}\n", templateChanges: true},
		{name: "value outside the pod changed", extra: base + "service: {port: 80}\n"},
		{name: "Envoy rule changed", extra: strings.Replace(base, "requests_per_unit: 100", "requests_per_unit: 50", 1)},
		{name: "Envoy rules file added", extra: strings.Replace(base, "envoy:\n  config:\n", "envoy:\n  config:\n    api.yaml: 'domain: api'\n", 1)},
		{name: "Envoy headers on", extra: strings.Replace(base, "envoy:\n", "envoy:\n  headers: true\n", 1), templateChanges: true},
	}
	baseline := render(t, valueSet{name: "base", extra: base}).Deployment.Spec.Template
	before := baseline.Annotations
	for _, key := range []string{"checksum/config", "checksum/secret", "checksum/redis-secret"} {
		if len(before[key]) != 64 {
			t.Fatalf("annotation %s: got %q, want a SHA-256 in hex", key, before[key])
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			template := render(t, valueSet{name: tt.name, extra: tt.extra}).Deployment.Spec.Template
			after := template.Annotations
			for key, wantChange := range map[string]bool{
				"checksum/config":       tt.configChanges,
				"checksum/secret":       tt.secretChanges,
				"checksum/redis-secret": tt.redisSecretChanges,
			} {
				if changed := after[key] != before[key]; changed != wantChange {
					t.Errorf("%s changed: got %v, want %v (before %s, after %s)", key, changed, wantChange, before[key], after[key])
				}
			}
			if changed := !equality.Semantic.DeepEqual(template, baseline); changed != tt.templateChanges {
				t.Errorf("pod template changed: got %v, want %v", changed, tt.templateChanges)
			}
		})
	}
}
