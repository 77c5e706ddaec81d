package kubeschema

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// swagger is a miniature of Kubernetes' swagger.json: a kind that refers,
// through another definition, to IntOrString and Quantity, a definition
// shared by several kinds, and one nobody refers to.
const swagger = `{"definitions": {
  "io.k8s.api.apps.v1.Widget": {
    "description": "A widget.",
    "properties": {
      "apiVersion": {"type": "string"},
      "kind": {"type": "string"},
      "spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.WidgetSpec", "description": "Its spec."}
    },
    "type": "object",
    "x-kubernetes-group-version-kind": [{"group": "apps", "version": "v1", "kind": "Widget"}]
  },
  "io.k8s.api.apps.v1.WidgetSpec": {
    "properties": {
      "port": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"},
      "size": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"},
      "labels": {"additionalProperties": {"type": "string"}, "type": "object"},
      "items": {"items": {"properties": {"name": {"type": "string"}}, "type": "object"}, "type": "array"},
      "raw": {"properties": {"a": {"type": "string"}}, "type": "object", "x-kubernetes-preserve-unknown-fields": true}
    },
    "required": ["port"],
    "type": "object"
  },
  "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"format": "int-or-string", "type": "string"},
  "io.k8s.apimachinery.pkg.api.resource.Quantity": {"description": "A quantity.", "type": "string"},
  "io.k8s.api.core.v1.Gadget": {
    "properties": {"kind": {"type": "string"}},
    "type": "object",
    "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Gadget"}]
  },
  "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions": {
    "type": "object",
    "x-kubernetes-group-version-kind": [
      {"group": "", "version": "v1", "kind": "DeleteOptions"},
      {"group": "apps", "version": "v1", "kind": "DeleteOptions"}
    ]
  }
}}`

func TestGenerate(t *testing.T) {
	dir := t.TempDir()
	kinds, err := Generate([]byte(swagger), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []GVK{{Group: "apps", Version: "v1", Kind: "Widget"}, {Version: "v1", Kind: "Gadget"}}
	if !reflect.DeepEqual(kinds, []GVK{want[1], want[0]}) {
		t.Fatalf("kinds: got %+v, want %+v", kinds, []GVK{want[1], want[0]})
	}
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Errorf("got files %v, want gadget-v1.json and widget-apps-v1.json only", files)
	}

	b, err := os.ReadFile(filepath.Join(dir, "widget-apps-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	wantJSON := `{
  "additionalProperties": false,
  "properties": {
    "apiVersion": {"type": "string"},
    "kind": {"type": "string"},
    "spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.WidgetSpec"}
  },
  "type": "object",
  "definitions": {
    "io.k8s.api.apps.v1.Widget": {
      "additionalProperties": false,
      "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.WidgetSpec"}
      },
      "type": "object"
    },
    "io.k8s.api.apps.v1.WidgetSpec": {
      "additionalProperties": false,
      "properties": {
        "port": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"},
        "size": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"},
        "labels": {"additionalProperties": {"type": "string"}, "type": "object"},
        "items": {"items": {"additionalProperties": false, "properties": {"name": {"type": "string"}}, "type": "object"}, "type": "array"},
        "raw": {"properties": {"a": {"type": "string"}}, "type": "object"}
      },
      "required": ["port"],
      "type": "object"
    },
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"oneOf": [{"type": "string"}, {"type": "number"}]}
  }
}`
	var wantSchema map[string]any
	if err := json.Unmarshal([]byte(wantJSON), &wantSchema); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, wantSchema) {
		g, _ := json.MarshalIndent(got, "", "  ")
		t.Errorf("widget-apps-v1.json: got\n%s\nwant\n%s", g, wantJSON)
	}
}

func TestGenerateKeep(t *testing.T) {
	dir := t.TempDir()
	kinds, err := Generate([]byte(swagger), dir, func(k GVK) bool { return k.Kind == "Gadget" })
	if err != nil {
		t.Fatal(err)
	}
	if want := []GVK{{Version: "v1", Kind: "Gadget"}}; !reflect.DeepEqual(kinds, want) {
		t.Errorf("kinds: got %+v, want %+v", kinds, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "widget-apps-v1.json")); !os.IsNotExist(err) {
		t.Errorf("widget-apps-v1.json: got %v, want it not written", err)
	}
}

func TestFileName(t *testing.T) {
	tests := []struct {
		gvk  GVK
		want string
	}{
		{GVK{Version: "v1", Kind: "ConfigMap"}, "configmap-v1.json"},
		{GVK{Group: "apps", Version: "v1", Kind: "Deployment"}, "deployment-apps-v1.json"},
		{GVK{Group: "networking.k8s.io", Version: "v1", Kind: "NetworkPolicy"}, "networkpolicy-networking-v1.json"},
		{GVK{Group: "autoscaling", Version: "v2", Kind: "HorizontalPodAutoscaler"}, "horizontalpodautoscaler-autoscaling-v2.json"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.gvk.FileName(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestGenerateRejectsBadInput(t *testing.T) {
	tests := []struct {
		name, swagger string
	}{
		{"not JSON", "{"},
		{"no definitions", `{"definitions": {}}`},
		{"two kinds in one file", `{"definitions": {
			"a.X": {"type": "object", "x-kubernetes-group-version-kind": [{"group": "apps", "version": "v1", "kind": "X"}]},
			"b.X": {"type": "object", "x-kubernetes-group-version-kind": [{"group": "apps.example.com", "version": "v1", "kind": "X"}]}
		}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Generate([]byte(tt.swagger), t.TempDir(), nil); err == nil {
				t.Error("got no error, want one")
			}
		})
	}
}
