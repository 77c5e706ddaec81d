package helmtest

import (
	"strings"
	"testing"
)

// TestLint runs helm lint --strict, in which a warning fails, with the
// chart's defaults and with each ci values file.
func TestLint(t *testing.T) {
	t.Parallel()
	for _, vs := range allValueSets(t) {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"lint", "--strict", chartDir, "--namespace", namespace, "--kube-version", kubeVersion}
			out, err := runHelm(t, append(args, vs.args(t)...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if want := "1 chart(s) linted, 0 chart(s) failed"; !strings.Contains(out, want) {
				t.Errorf("helm lint output:\n%s\nwant it to contain %q", out, want)
			}
		})
	}
}

// TestLintFailsOnBrokenValues checks that the lint above can fail: values
// that break the schema make it fail.
func TestLintFailsOnBrokenValues(t *testing.T) {
	t.Parallel()
	vs := valueSet{name: "broken", extra: "replicaCount: -1\n"}
	args := []string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}
	out, err := runHelm(t, append(args, vs.args(t)...)...)
	if err == nil {
		t.Fatalf("helm lint succeeded with replicaCount: -1, want a failure; output:\n%s", out)
	}
	if want := "replicaCount"; !strings.Contains(out+err.Error(), want) {
		t.Errorf("helm lint output:\n%s\n%v\nwant it to name %q", out, err, want)
	}
}
