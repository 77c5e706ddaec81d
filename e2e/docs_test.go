package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestSpec fetches the OpenAPI document in YAML and JSON.
func TestSpec(t *testing.T) {
	t.Parallel()
	api := sharedService(t).api
	ctx := t.Context()

	yamlRes, err := api.GetOpenAPIWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	jsonRes, err := api.GetOpenAPIJSONWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	docs := []struct {
		name        string
		res         answer
		contentType string
	}{
		{"openapi.yaml", yamlRes, "application/yaml"},
		{"openapi.json", jsonRes, "application/json"},
	}
	for _, d := range docs {
		t.Run(d.name, func(t *testing.T) {
			if d.res.StatusCode() != http.StatusOK {
				t.Fatalf("status: got %d, want 200", d.res.StatusCode())
			}
			if mt, _, err := mime.ParseMediaType(d.res.ContentType()); err != nil || mt != d.contentType {
				t.Errorf("Content-Type: got %q, want %s", d.res.ContentType(), d.contentType)
			}
			doc, err := openapi3.NewLoader().LoadFromData(d.res.GetBody())
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if err := doc.Validate(ctx); err != nil {
				t.Errorf("not a valid OpenAPI document: %v", err)
			}
			if doc.OpenAPI != "3.0.3" || doc.Info == nil || doc.Info.Title != "ratelimiter" {
				t.Errorf("openapi %q, info %+v: want 3.0.3 and title ratelimiter", doc.OpenAPI, doc.Info)
			}
			for _, path := range []string{
				"/v1/limiters", "/v1/limiters/{name}", "/v1/limiters/{name}/acquire", "/v1/limiters/{name}/available",
				"/v1/tenants/{ip}/acquire", "/v1/tenants/{ip}/available", "/v1/tenants/lowest", "/v1/tenants/policy",
				"/livez", "/readyz", "/openapi.yaml", "/openapi.json",
			} {
				if doc.Paths.Find(path) == nil {
					t.Errorf("paths: want %s", path)
				}
			}
		})
	}

	t.Run("as in the repository", func(t *testing.T) {
		want, err := os.ReadFile("../api/openapi.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(yamlRes.Body, want) {
			t.Errorf("served YAML (%d bytes) differs from api/openapi.yaml (%d bytes)", len(yamlRes.Body), len(want))
		}
	})

	t.Run("JSON says what YAML says", func(t *testing.T) {
		// Compared as OpenAPI documents: the JSON may leave out what is a
		// default, such as required: false.
		var docs []any
		for _, body := range [][]byte{yamlRes.Body, jsonRes.Body} {
			doc, err := openapi3.NewLoader().LoadFromData(body)
			if err != nil {
				t.Fatal(err)
			}
			b, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatal(err)
			}
			docs = append(docs, v)
		}
		if !reflect.DeepEqual(docs[0], docs[1]) {
			t.Errorf("/openapi.json is not the document /openapi.yaml is")
		}
	})
}

// TestDocs browses the Swagger UI page at /docs, which is outside the API
// document, so it is fetched as a browser would.
func TestDocs(t *testing.T) {
	t.Parallel()
	svc := sharedService(t)
	page := getPage(t, svc, "/docs")
	if mt, _, err := mime.ParseMediaType(page.header.Get("Content-Type")); err != nil || mt != "text/html" {
		t.Errorf("Content-Type: got %q, want text/html", page.header.Get("Content-Type"))
	}
	html := string(page.body)
	for _, want := range []string{`<div id="swagger-ui">`, `SwaggerUIBundle(`, `"/openapi.yaml"`} {
		if !strings.Contains(html, want) {
			t.Errorf("/docs: want %s in the page:\n%s", want, html)
		}
	}
	// Every asset the page loads is served by the service itself.
	assets := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(html, -1)
	var paths []string
	for _, m := range assets {
		paths = append(paths, m[1])
	}
	for _, want := range []string{"/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css"} {
		if !slices.Contains(paths, want) {
			t.Errorf("/docs loads %q, want %s among them", paths, want)
		}
	}
	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			if !strings.HasPrefix(path, "/docs/") {
				t.Fatalf("asset %q: want a path under /docs/ on this server (no other host)", path)
			}
			if asset := getPage(t, svc, path); len(asset.body) == 0 {
				t.Errorf("asset %s: got an empty body", path)
			}
		})
	}
}

// TestMetrics reads the Prometheus metrics at /metrics, which is outside
// the API document, as a Prometheus server would.
func TestMetrics(t *testing.T) {
	t.Parallel()
	svc := sharedService(t)
	const name = "metrics-probe"
	put(t, svc.api, name, client.LimiterSpec{Limit: 5, Period: "1h"})
	take(t, svc.api, name, 3, true)
	take(t, svc.api, name, 3, false)
	take(t, svc.api, name, 6, false)

	page := getPage(t, svc, "/metrics")
	if mt, _, err := mime.ParseMediaType(page.header.Get("Content-Type")); err != nil || mt != "text/plain" {
		t.Errorf("Content-Type: got %q, want text/plain (the Prometheus text format)", page.header.Get("Content-Type"))
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(page.body))
	if err != nil {
		t.Fatalf("parse the Prometheus text: %v", err)
	}

	counters := []struct {
		family string
		labels map[string]string
		want   float64
	}{
		{"ratelimiter_decisions_total", map[string]string{"limiter": name, "result": "allowed"}, 1},
		{"ratelimiter_decisions_total", map[string]string{"limiter": name, "result": "denied"}, 2},
		{"ratelimiter_permits_total", map[string]string{"limiter": name, "result": "granted"}, 3},
		{"ratelimiter_permits_total", map[string]string{"limiter": name, "result": "denied"}, 9},
	}
	for _, c := range counters {
		f := families[c.family]
		if f == nil || f.GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s: got %v, want a counter", c.family, f.GetType())
			continue
		}
		m := findSeries(f, c.labels)
		if m == nil {
			t.Errorf("%s%v: no such series", c.family, c.labels)
			continue
		}
		if got := m.GetCounter().GetValue(); got != c.want {
			t.Errorf("%s%v: got %v, want %v", c.family, c.labels, got, c.want)
		}
	}

	present := []struct {
		family string
		kind   dto.MetricType
		labels map[string]string // one of its series has these, when not nil
	}{
		{"http_server_request_duration_seconds", dto.MetricType_HISTOGRAM, map[string]string{"http_response_status_code": "200"}},
		{"ratelimiter_tenants_tracked", dto.MetricType_GAUGE, nil},
		{"ratelimiter_tenants_index_entries", dto.MetricType_GAUGE, nil},
		{"ratelimiter_backend_up", dto.MetricType_GAUGE, map[string]string{"backend": "memory"}},
		{"go_goroutines", dto.MetricType_GAUGE, nil},
		{"process_resident_memory_bytes", dto.MetricType_GAUGE, nil},
	}
	for _, p := range present {
		f := families[p.family]
		if f == nil || f.GetType() != p.kind {
			t.Errorf("%s: got type %v, want a %v", p.family, f.GetType(), p.kind)
			continue
		}
		if p.labels != nil && findSeries(f, p.labels) == nil {
			t.Errorf("%s: no series with %v among %d", p.family, p.labels, len(f.GetMetric()))
		}
	}
	if f := families["http_server_request_duration_seconds"]; f != nil && !hasLabelValue(f, "acquire") {
		t.Errorf("http_server_request_duration_seconds: no series for the acquire operation")
	}
}

// findSeries returns the series of f that has labels, or nil.
func findSeries(f *dto.MetricFamily, labels map[string]string) *dto.Metric {
	for _, m := range f.GetMetric() {
		n := 0
		for _, l := range m.GetLabel() {
			if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
				n++
			}
		}
		if n == len(labels) {
			return m
		}
	}
	return nil
}

// hasLabelValue reports whether a series of f has a label of value v.
func hasLabelValue(f *dto.MetricFamily, v string) bool {
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetValue() == v {
				return true
			}
		}
	}
	return false
}

// page is an answer to a plain GET.
type page struct {
	header http.Header
	body   []byte
}

// getPage fetches a page outside the API document with a plain GET, failing
// t unless it answers 200.
func getPage(t *testing.T, svc *service, path string) page {
	t.Helper()
	res, body := send(t, svc, http.MethodGet, path)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: got %d, want 200", path, res.StatusCode)
	}
	return page{header: res.Header, body: body}
}

// send makes a request with no body outside the generated client and
// returns the answer with its whole body read.
func send(t *testing.T, svc *service, method, path string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, svc.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := svc.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return res, body
}
