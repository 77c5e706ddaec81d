// Package kubeschema writes strict JSON schemas for the Kubernetes API kinds,
// one file per kind, from the OpenAPI v2 document (swagger.json) that the
// k8s.io/kubernetes module ships, so that kubeconform can validate manifests
// offline.
//
// The files follow kubeconform's naming, <kind><suffix>.json in lower case,
// where the suffix is -<group's first label>-<version> (-apps-v1,
// -networking-v1) or -<version> for the core group (-v1): pass
// kubeconform -schema-location '<dir>/{{ .ResourceKind }}{{ .KindSuffix }}.json'.
//
// Each file is standalone: the kind's definition at the root, and every
// definition it refers to, directly or not, under "definitions". The schemas
// are strict: every object that lists its properties rejects any other
// (additionalProperties: false), as the API server's strict field validation
// does, and null is accepted nowhere. Two types that the API reads from more
// than one JSON type are widened the way the API server reads them:
// IntOrString takes a string or an integer, Quantity a string or a number.
// Descriptions are dropped.
package kubeschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Definition names whose JSON form the API server reads more leniently than
// swagger.json says.
const (
	intOrString = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
	quantity    = "io.k8s.apimachinery.pkg.api.resource.Quantity"
	refPrefix   = "#/definitions/"
)

// DefaultVersion is the version of the k8s.io/kubernetes module whose API
// the chart is checked against.
const DefaultVersion = "v1.37.2"

// GVK is a kind of the Kubernetes API: Group is empty for the core group.
type GVK struct {
	Group, Version, Kind string
}

// FileName is the name kubeconform looks for when it validates a manifest
// of this kind with the schema location template
// {{ .ResourceKind }}{{ .KindSuffix }}.json.
func (k GVK) FileName() string {
	suffix := "-" + k.Version
	if k.Group != "" {
		suffix = "-" + strings.Split(k.Group, ".")[0] + suffix
	}
	return strings.ToLower(k.Kind + suffix + ".json")
}

// SwaggerPath returns the path of api/openapi-spec/swagger.json in the
// k8s.io/kubernetes module at version (such as "v1.37.2"), downloading the
// module into the module cache if it is not there yet. It runs
// go mod download in a temporary directory, outside any module, so that no
// go.mod or go.sum changes.
func SwaggerPath(version string) (string, error) {
	tmp, err := os.MkdirTemp("", "kubeschema-")
	if err != nil {
		return "", fmt.Errorf("kubeschema: %w", err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "mod", "download", "-json", "k8s.io/kubernetes@"+version)
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr != nil && err == nil {
		err = jerr
	}
	if info.Error != "" {
		err = errors.New(info.Error)
	}
	if err != nil {
		return "", fmt.Errorf("kubeschema: go mod download k8s.io/kubernetes@%s: %w: %s", version, err, strings.TrimSpace(stderr.String()))
	}
	path := filepath.Join(info.Dir, "api", "openapi-spec", "swagger.json")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("kubeschema: %w", err)
	}
	return path, nil
}

// Generate reads the OpenAPI v2 document swagger and writes into dir, which
// must exist, the schema file of every kind it defines for which keep returns
// true (every kind when keep is nil). It returns the kinds written, sorted by
// file name. Definitions that serve several kinds (such as DeleteOptions) are
// not API objects one writes in a manifest and are skipped.
func Generate(swagger []byte, dir string, keep func(GVK) bool) ([]GVK, error) {
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(swagger, &doc); err != nil {
		return nil, fmt.Errorf("kubeschema: read swagger: %w", err)
	}
	if len(doc.Definitions) == 0 {
		return nil, errors.New("kubeschema: read swagger: no definitions")
	}
	defs := make(map[string]map[string]any, len(doc.Definitions))
	for name, def := range doc.Definitions {
		defs[name] = strict(name, def)
	}

	var kinds []GVK
	written := make(map[string]string) // file name -> definition
	for _, name := range sortedKeys(doc.Definitions) {
		gvks, _ := doc.Definitions[name]["x-kubernetes-group-version-kind"].([]any)
		if len(gvks) != 1 {
			continue
		}
		g, _ := gvks[0].(map[string]any)
		k := GVK{Group: str(g["group"]), Version: str(g["version"]), Kind: str(g["kind"])}
		if k.Version == "" || k.Kind == "" || keep != nil && !keep(k) {
			continue
		}
		file := k.FileName()
		if other, dup := written[file]; dup {
			return nil, fmt.Errorf("kubeschema: %s and %s both map to %s", other, name, file)
		}
		written[file] = name

		root := make(map[string]any, len(defs[name])+1)
		for key, v := range defs[name] {
			root[key] = v
		}
		root["definitions"] = closure(defs, name)
		b, err := json.Marshal(root)
		if err != nil {
			return nil, fmt.Errorf("kubeschema: %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
			return nil, fmt.Errorf("kubeschema: %w", err)
		}
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i].FileName() < kinds[j].FileName() })
	return kinds, nil
}

// strict returns a copy of the schema s, the definition named name (empty
// for a nested schema), with descriptions and extensions dropped, closed
// objects, and the lenient types widened.
func strict(name string, s map[string]any) map[string]any {
	switch name {
	case intOrString:
		return map[string]any{"oneOf": []any{
			map[string]any{"type": "string"},
			map[string]any{"type": "integer"},
		}}
	case quantity:
		return map[string]any{"oneOf": []any{
			map[string]any{"type": "string"},
			map[string]any{"type": "number"},
		}}
	}
	out := make(map[string]any, len(s)+1)
	for key, v := range s {
		switch {
		case key == "description" || strings.HasPrefix(key, "x-"):
		case key == "properties":
			props := make(map[string]any)
			for p, ps := range v.(map[string]any) {
				props[p] = strictAny(ps)
			}
			out[key] = props
		case key == "items" || key == "additionalProperties" || key == "not":
			out[key] = strictAny(v)
		case key == "allOf" || key == "anyOf" || key == "oneOf":
			list := v.([]any)
			schemas := make([]any, len(list))
			for i, x := range list {
				schemas[i] = strictAny(x)
			}
			out[key] = schemas
		default:
			out[key] = v
		}
	}
	_, closed := out["properties"]
	if open, _ := s["x-kubernetes-preserve-unknown-fields"].(bool); open {
		closed = false
	}
	if _, set := out["additionalProperties"]; closed && !set {
		out["additionalProperties"] = false
	}
	return out
}

func strictAny(v any) any {
	if m, ok := v.(map[string]any); ok {
		return strict("", m)
	}
	return v
}

// closure returns the definitions that the definition root refers to,
// directly or through others, root included.
func closure(defs map[string]map[string]any, root string) map[string]any {
	out := make(map[string]any)
	var visit func(name string)
	visit = func(name string) {
		if _, seen := out[name]; seen {
			return
		}
		out[name] = defs[name]
		for _, ref := range refs(defs[name], nil) {
			visit(ref)
		}
	}
	visit(root)
	return out
}

// refs appends to dst the definition names that v refers to with $ref.
func refs(v any, dst []string) []string {
	switch v := v.(type) {
	case map[string]any:
		if r, ok := v["$ref"].(string); ok {
			dst = append(dst, strings.TrimPrefix(r, refPrefix))
		}
		for _, x := range v {
			dst = refs(x, dst)
		}
	case []any:
		for _, x := range v {
			dst = refs(x, dst)
		}
	}
	return dst
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
