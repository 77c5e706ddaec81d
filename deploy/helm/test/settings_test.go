package helmtest

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/ratelimiter/ratelimiter/internal/config"
)

// serviceSetting is one setting the service's --help lists: its
// environment variable, and its key in the config file if it has one.
type serviceSetting struct {
	env, file string
}

// serviceSettings returns every setting the service's --help lists, from
// the text itself, so that a setting added to the service is seen here
// without a change to this test.
func serviceSettings(t *testing.T) []serviceSetting {
	t.Helper()
	var b strings.Builder
	config.Usage(&b, "ratelimiter")
	// The help text wraps at 80 columns, so any space may be a line break.
	re := regexp.MustCompile(`env\s+(RATELIMITER_[A-Z0-9_]+)(?:,\s+file\s+([a-z0-9_.]+))?`)
	var settings []serviceSetting
	for _, m := range re.FindAllStringSubmatch(b.String(), -1) {
		settings = append(settings, serviceSetting{env: m[1], file: m[2]})
	}
	if len(settings) < 30 {
		t.Fatalf("got %d settings from the service's help text, want at least 30:\n%s", len(settings), b.String())
	}
	return settings
}

// TestEverySettingReachesThePod checks that the chart gives the pod every
// setting the service has: a setting with a config file key through the
// ConfigMap's file, any other through the container's environment, except
// the few that must never be set that way. A setting the service gains
// fails this test until the chart maps it (or says here why it must not).
func TestEverySettingReachesThePod(t *testing.T) {
	t.Parallel()
	// Set neither by the chart nor through extraEnv, with the reason.
	unset := map[string]string{
		"RATELIMITER_ADMIN_TOKEN":    "a secret: the chart mounts it as a file (RATELIMITER_ADMIN_TOKEN_FILE)",
		"RATELIMITER_REDIS_PASSWORD": "a secret: the chart mounts it as a file (RATELIMITER_REDIS_PASSWORD_FILE)",
		// Flags rather than variables, so that an image that does not
		// know them refuses to start instead of serving with every scope
		// open, or in plain text (see ratelimiter.args).
		"RATELIMITER_TOKENS_FILE":        "passed as the flag --tokens-file with tokens.existingSecret",
		"RATELIMITER_TLS_CERT_FILE":      "passed as the flag --tls-cert-file with tls.existingSecret",
		"RATELIMITER_TLS_KEY_FILE":       "passed as the flag --tls-key-file with tls.existingSecret",
		"RATELIMITER_TLS_CLIENT_CA_FILE": "passed as the flag --tls-client-ca-file with tls.clientAuth",
	}
	// Between them, these renders set every optional variable: the
	// defaults, the Redis backend with every Secret the chart mounts and
	// the Envoy rules, and the memory backend with its data directory on a
	// volume (RATELIMITER_DATA_DIR, which the service refuses with Redis).
	sets := []valueSet{{name: "defaults"}, {name: "redis with every Secret and the Envoy rules", extra: `adminToken: {value: token}
envoy: {existingConfigMap: mesh-rules}
backend:
  type: redis
  redis:
    addrs: ['redis:6379']
    username: limits
    password: pw
    tls: {enabled: true, caSecret: redis-ca}
`}, {name: "memory with persistence", extra: "persistence: {enabled: true}\n"}}
	envSet := make(map[string]bool)
	var file map[string]any
	for _, vs := range sets {
		m := render(t, vs)
		for name := range env(m.container(t)) {
			envSet[name] = true
		}
		if err := yaml.Unmarshal([]byte(m.ConfigMap.Data["config.yaml"]), &file); err != nil {
			t.Fatalf("%s: config file: %v", vs.name, err)
		}
	}

	for _, s := range serviceSettings(t) {
		switch reason, ok := unset[s.env]; {
		case ok:
			if envSet[s.env] {
				t.Errorf("%s is set, want it unset: %s", s.env, reason)
			}
		case s.file != "":
			if _, ok := fileValue(file, s.file); !ok {
				t.Errorf("%s: the chart's config file has no %s, want every file setting written", s.env, s.file)
			}
			if envSet[s.env] {
				t.Errorf("%s is set, want the setting in the config file only (%s), where config: puts it", s.env, s.file)
			}
		default:
			if !envSet[s.env] {
				t.Errorf("%s is not set by the chart, want a value mapped to it (or a reason here why not)", s.env)
			}
		}
	}

	// Every variable the chart sets is the service's, or OpenTelemetry's.
	var known []string
	for _, s := range serviceSettings(t) {
		known = append(known, s.env)
	}
	for name := range envSet {
		if strings.HasPrefix(name, "RATELIMITER_") && !slices.Contains(known, name) {
			t.Errorf("the chart sets %s, which the service does not read", name)
		}
	}
}

// fileValue returns the value at a dotted key of the config file, such as
// tenants.max_bytes.
func fileValue(file map[string]any, key string) (any, bool) {
	var v any = file
	for _, k := range strings.Split(key, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[k]; !ok {
			return nil, false
		}
	}
	return v, true
}
