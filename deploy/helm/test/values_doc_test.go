package helmtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	yaml3 "go.yaml.in/yaml/v3"
)

// undocumentedKeys returns the path of every key of the values document
// whose value is a setting (a scalar, a list or an empty map) and that has
// no "# --" comment of its own, the helm-docs convention. A map of further
// keys needs none: its keys are documented one by one.
func undocumentedKeys(t *testing.T, doc []byte) []string {
	t.Helper()
	var root yaml3.Node
	if err := yaml3.Unmarshal(doc, &root); err != nil {
		t.Fatalf("parse values: %v", err)
	}
	if root.Kind != yaml3.DocumentNode || len(root.Content) != 1 || root.Content[0].Kind != yaml3.MappingNode {
		t.Fatalf("values: want one document holding a map")
	}
	var missing []string
	var walk func(path string, m *yaml3.Node)
	walk = func(path string, m *yaml3.Node) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			key, value := m.Content[i], m.Content[i+1]
			p := strings.TrimPrefix(path+"."+key.Value, ".")
			if value.Kind == yaml3.MappingNode && len(value.Content) > 0 {
				walk(p, value)
				continue
			}
			if !strings.Contains(key.HeadComment, "# --") {
				missing = append(missing, p)
			}
		}
	}
	walk("", root.Content[0])
	return missing
}

// TestEveryValueIsDocumented checks that every setting in values.yaml has
// its own "# --" comment: resources, podSecurityContext and securityContext
// included, key by key.
func TestEveryValueIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if missing := undocumentedKeys(t, doc); len(missing) > 0 {
		t.Errorf("values.yaml: no \"# --\" comment above %s", strings.Join(missing, ", "))
	}
}

// TestUndocumentedKeysAreFound makes sure the check above can fail.
func TestUndocumentedKeysAreFound(t *testing.T) {
	t.Parallel()
	const doc = `# -- Documented.
a: 1
b:
  # -- Documented.
  c: x
  d: [1]
  # A plain comment.
  e: {}
f:
  g:
    h: true
`
	got := strings.Join(undocumentedKeys(t, []byte(doc)), " ")
	if want := "b.d b.e f.g.h"; got != want {
		t.Errorf("got undocumented %q, want %q", got, want)
	}
}
