package helmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// promtool returns the path of Prometheus's promtool (Debian's prometheus
// package installs it). Without it the test fails under CI=true, where
// nothing may be skipped, and is skipped loudly otherwise.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err == nil {
		return path
	}
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("FAIL: CI=%s and promtool is not on PATH (%v): install Debian's prometheus package (apt-get install --no-install-recommends prometheus)", os.Getenv("CI"), err)
	}
	banner := strings.Repeat("!", 78)
	t.Skipf("\n%s\nSKIPPED: promtool is not on PATH (%v).\nInstall Debian's prometheus package (apt-get install --no-install-recommends prometheus) to run this test; with CI=true this is a failure.\n%s",
		banner, err, banner)
	return ""
}

// rulesFile renders the chart's PrometheusRule with vs through helm's
// template engine and writes its groups to dir/rules.yaml, as a Prometheus
// rules file, the way the Prometheus Operator hands them to Prometheus.
func rulesFile(t *testing.T, vs valueSet, dir string) string {
	t.Helper()
	text, ok := renderFiles(t, vs)["ratelimiter/templates/prometheusrule.yaml"]
	if !ok || strings.TrimSpace(text) == "" {
		t.Fatalf("%s: no PrometheusRule rendered", vs.name)
	}
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(text), &rule); err != nil {
		t.Fatalf("%s: parse the PrometheusRule: %v\n%s", vs.name, err, text)
	}
	if rule.Kind != "PrometheusRule" || len(rule.Spec.Groups) == 0 {
		t.Fatalf("%s: got kind %q with %d groups, want a PrometheusRule with groups:\n%s", vs.name, rule.Kind, len(rule.Spec.Groups), text)
	}
	out, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runPromtool runs promtool with args in dir and returns its output,
// failing the test when it exits non-zero.
func runPromtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRulesCheck runs promtool check rules on the rules the chart
// renders with its defaults, with every ci values file that turns them on,
// and with every setting changed: each must load in Prometheus.
func TestAlertRulesCheck(t *testing.T) {
	t.Parallel()
	sets := []valueSet{
		{name: "defaults", extra: monitoringOn},
		{name: "every setting", extra: `metrics:
  prometheusRule:
    enabled: true
    selector: 'job="edge",env=~"prod|staging"'
    alertLabels: {team: platform}
    highDenialRatio: {threshold: 0, minRate: 0, window: 30s, for: 0s, severity: info}
    degradedDecisions: {threshold: 0.999, window: 1h, for: 1h, severity: page}
    backendDown: {for: 0s, severity: warning}
`},
		// Helm writes such numbers as 1e-06 and 1e+06.
		{name: "extreme numbers", extra: "metrics: {prometheusRule: {enabled: true, highDenialRatio: {threshold: 0.000001, minRate: 1000000}, degradedDecisions: {threshold: 0.0000001}}}\n"},
	}
	for _, vs := range ciValueSets(t) {
		if enabled, _ := lookup(t, vs.values(t), "metrics", "prometheusRule", "enabled").(bool); enabled {
			sets = append(sets, vs)
		}
	}
	if len(sets) < 4 {
		t.Fatalf("no ci values file turns the PrometheusRule on")
	}
	for _, vs := range sets {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			rules := rulesFile(t, vs, dir)
			out := runPromtool(t, dir, "check", "rules", rules)
			if want := "SUCCESS: 3 rules found"; !strings.Contains(out, want) {
				t.Errorf("promtool check rules:\n%s\nwant %q", out, want)
			}
		})
	}
}

// TestAlertRulesFire runs promtool test rules: testdata/alerts.test.yaml
// feeds the rules series and says which alerts must fire, when, with which
// labels and annotations, and which must not.
func TestAlertRulesFire(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rulesFile(t, valueSet{name: "defaults", extra: monitoringOn}, dir)
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.test.yaml"), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	out := runPromtool(t, dir, "test", "rules", "alerts.test.yaml")
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules:\n%s\nwant SUCCESS", out)
	}
	t.Logf("promtool test rules:\n%s", out)
}
