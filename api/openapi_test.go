package api_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/ratelimiter/ratelimiter/api"
	"github.com/ratelimiter/ratelimiter/internal/auth"
)

func load(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.Spec)
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	return doc
}

func TestSpecIsValid(t *testing.T) {
	doc := load(t)
	// Examples, defaults and patterns are validated too (kin-openapi's
	// defaults); format checking makes sure every format is a known one.
	if err := doc.Validate(context.Background(), openapi3.EnableSchemaFormatValidation()); err != nil {
		t.Fatalf("openapi.yaml is not valid: %v", err)
	}
	if got, want := doc.OpenAPI, "3.0.3"; got != want {
		t.Errorf("openapi version: got %s, want %s", got, want)
	}
}

// operations lists every operation as "METHOD path" with the operation.
func operations(doc *openapi3.T) map[string]*openapi3.Operation {
	ops := make(map[string]*openapi3.Operation)
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			ops[method+" "+path] = op
		}
	}
	return ops
}

func TestEveryOperationIsDocumented(t *testing.T) {
	doc := load(t)
	ids := make(map[string]string)
	for where, op := range operations(doc) {
		t.Run(where, func(t *testing.T) {
			if op.OperationID == "" {
				t.Fatal("no operationId")
			}
			if other, dup := ids[op.OperationID]; dup {
				t.Errorf("operationId %q is also used by %s", op.OperationID, other)
			}
			ids[op.OperationID] = where
			if strings.TrimSpace(op.Summary) == "" {
				t.Error("no summary")
			}
			if strings.TrimSpace(op.Description) == "" {
				t.Error("no description")
			}
			if len(op.Tags) == 0 {
				t.Error("no tags")
			}
			for _, p := range doc.Paths.Find(strings.SplitN(where, " ", 2)[1]).Parameters {
				checkParameter(t, p.Value)
			}
			for _, p := range op.Parameters {
				checkParameter(t, p.Value)
			}
			if op.RequestBody != nil {
				for mime, mt := range op.RequestBody.Value.Content {
					if mime != "application/json" {
						t.Errorf("request body media type %s, want application/json only", mime)
					}
					if mt.Example == nil && len(mt.Examples) == 0 {
						t.Errorf("request body %s has no example", mime)
					}
				}
			}
			if op.Responses.Len() == 0 {
				t.Fatal("no responses")
			}
			for code, ref := range op.Responses.Map() {
				checkResponse(t, code, ref.Value, slices.Contains(bodiless[op.OperationID], code))
			}
		})
	}
}

func checkParameter(t *testing.T, p *openapi3.Parameter) {
	t.Helper()
	if strings.TrimSpace(p.Description) == "" {
		t.Errorf("parameter %s has no description", p.Name)
	}
	if p.Example == nil && len(p.Examples) == 0 {
		t.Errorf("parameter %s has no example", p.Name)
	}
}

// bodiless names the answers other than 204s that have no body, by
// operation: forward-auth's 200 (allowed, a 200 as proxies expect) and
// 403 (nginx's denial), because nginx's auth_request closes its
// connection to the service after an answer with a body.
var bodiless = map[string][]string{"forwardAuth": {"200", "403"}}

func checkResponse(t *testing.T, code string, r *openapi3.Response, empty bool) {
	t.Helper()
	status, err := strconv.Atoi(code)
	if err != nil {
		t.Errorf("response %s: want an explicit status code, not a range or default", code)
		return
	}
	if r.Description == nil || strings.TrimSpace(*r.Description) == "" {
		t.Errorf("response %d has no description", status)
	}
	if status == 204 || empty {
		if len(r.Content) != 0 {
			t.Errorf("response %d has content", status)
		}
		return
	}
	if len(r.Content) == 0 {
		t.Errorf("response %d has no content", status)
	}
	for mime, mt := range r.Content {
		if status >= 400 && mime != "application/problem+json" {
			t.Errorf("response %d has media type %s, want application/problem+json", status, mime)
		}
		if status >= 400 && (mt.Schema == nil || mt.Schema.Ref != "#/components/schemas/Problem") {
			t.Errorf("response %d: schema is not the Problem schema", status)
		}
		if mt.Example == nil && len(mt.Examples) == 0 {
			t.Errorf("response %d %s has no example", status, mime)
		}
	}
	for name, h := range r.Headers {
		if h.Value.Example == nil && len(h.Value.Examples) == 0 {
			t.Errorf("response %d header %s has no example", status, name)
		}
	}
}

// TestErrorResponsesAreProblems checks every shared response that some
// operation answers with a 4xx or 5xx status: problem+json only, with
// examples that are problems.
func TestErrorResponsesAreProblems(t *testing.T) {
	doc := load(t)
	errorRefs := map[string]bool{}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for code, ref := range op.Responses.Map() {
				if n, err := strconv.Atoi(code); err == nil && n >= 400 && ref.Ref != "" {
					errorRefs[strings.TrimPrefix(ref.Ref, "#/components/responses/")] = true
				}
			}
		}
	}
	for name, ref := range doc.Components.Responses {
		if !errorRefs[name] {
			continue
		}
		t.Run(name, func(t *testing.T) {
			r := ref.Value
			if len(r.Content) != 1 || r.Content.Get("application/problem+json") == nil {
				t.Fatalf("content types %v, want application/problem+json only", slices.Collect(maps.Keys(r.Content)))
			}
			mt := r.Content.Get("application/problem+json")
			examples := []any{mt.Example}
			if mt.Example == nil {
				examples = examples[:0]
				for _, ex := range mt.Examples {
					examples = append(examples, ex.Value.Value)
				}
			}
			if len(examples) == 0 {
				t.Fatal("no example problem")
			}
			for _, e := range examples {
				ex, ok := e.(map[string]any)
				if !ok || ex["status"] == nil || ex["title"] == nil || ex["type"] == nil {
					t.Errorf("example %v lacks type, title or status", e)
				}
			}
		})
	}
	if len(errorRefs) == 0 {
		t.Fatal("no operation answers an error with a shared response")
	}
}

// TestSchemasAreStrict checks that every object schema closes its
// properties and lists those it requires, so that SDKs and the validator
// reject what the server would not understand.
func TestSchemasAreStrict(t *testing.T) {
	doc := load(t)
	for name, ref := range doc.Components.Schemas {
		s := ref.Value
		if s.Example == nil {
			t.Errorf("schema %s has no example", name)
		}
		if strings.TrimSpace(s.Description) == "" {
			t.Errorf("schema %s has no description", name)
		}
		if !s.Type.Is("object") {
			continue
		}
		if s.AdditionalProperties.Has == nil || *s.AdditionalProperties.Has {
			t.Errorf("schema %s: want additionalProperties: false", name)
		}
		for prop, p := range s.Properties {
			if p.Value.Type.Is("integer") && p.Value.Min == nil {
				t.Errorf("schema %s: integer property %s has no minimum", name, prop)
			}
		}
	}
}

func TestSecurity(t *testing.T) {
	doc := load(t)
	scheme := doc.Components.SecuritySchemes["bearerAuth"]
	if scheme == nil || scheme.Value.Type != "http" || scheme.Value.Scheme != "bearer" {
		t.Fatalf("bearerAuth: got %+v, want an http bearer scheme", scheme)
	}
	secured := map[string]bool{}
	for _, op := range operations(doc) {
		if op.Security != nil && len(*op.Security) > 0 {
			secured[op.OperationID] = true
			if _, ok := op.Responses.Map()["401"]; !ok {
				t.Errorf("%s requires a token but documents no 401", op.OperationID)
			}
		}
	}
	// The spec declares a token where package auth's table requires a
	// scope, and only there; only the probes and the contract itself are
	// open, so that an operation added to the spec must be given a scope.
	open := map[string]bool{"getLiveness": true, "getReadiness": true, "getOpenAPI": true, "getOpenAPIJSON": true}
	for _, op := range operations(doc) {
		_, required := auth.Required(op.OperationID)
		if required == open[op.OperationID] {
			t.Errorf("%s: requires a scope %t, want %t", op.OperationID, required, !open[op.OperationID])
		}
		if secured[op.OperationID] != required {
			t.Errorf("%s: declares a token %t, requires a scope %t", op.OperationID, secured[op.OperationID], required)
		}
		if _, ok := op.Responses.Map()["403"]; required && !ok {
			t.Errorf("%s requires a scope but documents no 403", op.OperationID)
		}
	}
}
