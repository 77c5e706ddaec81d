package httpapi

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ratelimiter/ratelimiter/client"
)

// exchange sends request, as written, over a new connection to the test
// server, and returns the response and the bytes that followed it before
// the server closed the connection: for a HEAD, there must be none.
func (e *env) exchange(request string) (*http.Response, []byte, []byte) {
	e.t.Helper()
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		e.t.Fatalf("deadline: %v", err)
	}
	if _, err := io.WriteString(conn, request); err != nil {
		e.t.Fatalf("write: %v", err)
	}
	all, err := io.ReadAll(conn)
	if err != nil {
		e.t.Fatalf("read: %v", err)
	}
	br := bufio.NewReader(bytes.NewReader(all))
	method, _, _ := strings.Cut(request, " ")
	res, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		e.t.Fatalf("response to %.40q: %v; got %q", request, err, all)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("body: %v", err)
	}
	rest, _ := io.ReadAll(br)
	return res, body, rest
}

// getRoutes lists a path for every route the handler serves for GET, with
// its parameters filled in.
func getRoutes(t *testing.T, h http.Handler) []string {
	t.Helper()
	s, ok := h.(*server)
	if !ok {
		t.Fatalf("the handler is a %T, not the server", h)
	}
	routes := s.router
	var paths []string
	err := chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if method == http.MethodGet {
			paths = append(paths, strings.ReplaceAll(examplePath(route), "/*", "/swagger-ui.css"))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk: %v", err)
	}
	slices.Sort(paths)
	return paths
}

func TestHeadAnswersAsGetWithoutABody(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	e := newEnv(t, func(o *Options) {
		o.Ready = ready.Load
		o.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("up 1\n"))
		})
	})
	e.put("x", client.LimiterSpec{Limit: 10, Period: "1m"})
	if _, err := e.c.AcquireTenantWithResponse(ctx, "192.0.2.1", client.AcquireRequest{}); err != nil {
		t.Fatal(err)
	}

	paths := getRoutes(t, e.srv.Config.Handler)
	want := []string{
		"/docs", "/docs/swagger-ui.css", "/livez", "/metrics", "/openapi.json", "/openapi.yaml", "/readyz",
		"/v1/forward-auth", "/v1/limiters", "/v1/limiters/x", "/v1/limiters/x/available", "/v1/limiters/x/lowest",
		"/v1/tenants/192.0.2.1/available", "/v1/tenants/lowest", "/v1/tenants/policy",
	}
	if !slices.Equal(paths, want) {
		t.Fatalf("GET routes: got %v, want %v", paths, want)
	}
	// Answers other than 200: problems from handlers, from the docs, and
	// from validation, both kin-openapi's and the hand-written one.
	paths = append(paths, "/readyz#not-ready", "/docs/missing.js", "/v1/limiters/missing",
		"/v1/tenants/lowest?k=0", "/v1/limiters?page_size=0", "/v1/limiters/-x/available", "/v1/tenants/1.2.3/available")

	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			path, state, _ := strings.Cut(path, "#")
			ready.Store(state != "not-ready")
			request := func(method string) string {
				return method + " " + path + " HTTP/1.1\r\nHost: test\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
			}
			get, getBody, _ := e.exchange(request(http.MethodGet))
			head, headBody, rest := e.exchange(request(http.MethodHead))
			if head.StatusCode != get.StatusCode {
				t.Errorf("status: got %d, want %d as for GET", head.StatusCode, get.StatusCode)
			}
			if len(headBody) != 0 || len(rest) != 0 {
				t.Errorf("HEAD sent %d bytes after its header section, want none: %q", len(headBody)+len(rest), append(headBody, rest...))
			}
			if len(getBody) == 0 {
				t.Errorf("GET sent no body")
			}
			get.Header.Del("Date")
			head.Header.Del("Date")
			if _, ok := head.Header["Content-Length"]; !ok {
				get.Header.Del("Content-Length") // optional for HEAD (RFC 9110, 8.6)
			}
			if got, want := head.Header, get.Header; !headersEqual(got, want) {
				t.Errorf("headers: got %v, want %v as for GET", got, want)
			}
		})
	}
}

func headersEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func TestHeadConsumesNothing(t *testing.T) {
	e := newEnv(t, nil)
	e.put("x", client.LimiterSpec{Limit: 10, Period: "1m"})
	for _, tc := range []struct{ path, allow string }{
		{"/v1/limiters/x/acquire", "POST"},
		{"/v1/acquire", "POST"},
		{"/v1/tenants/192.0.2.1/acquire", "POST"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			res, body, rest := e.exchange("HEAD " + tc.path + " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
			if res.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("status: got %d, want 405", res.StatusCode)
			}
			if got := res.Header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow: got %q, want %q", got, tc.allow)
			}
			if got := res.Header.Get("Content-Type"); got != problemJSON {
				t.Errorf("Content-Type: got %q, want %s", got, problemJSON)
			}
			if len(body) != 0 || len(rest) != 0 {
				t.Errorf("HEAD got a body: %q", append(body, rest...))
			}
		})
	}
	if got := e.available("x"); got != 10 {
		t.Errorf("limiter x: got %d left, want 10", got)
	}
	if got := e.tenantAvailable("192.0.2.1"); got != tenantPolicy.Limit {
		t.Errorf("tenant 192.0.2.1: got %d left, want %d", got, tenantPolicy.Limit)
	}
}

func TestDocsErrorsAreProblems(t *testing.T) {
	e := newEnv(t, nil)
	for _, path := range []string{
		"/docs/missing.js",
		"/docs/../livez",
		"/docs/%2e%2e/openapi.yaml",
		"/docs/swagger-ui.css/x",
		"/docs/..%2fdocs.html",
	} {
		t.Run(path, func(t *testing.T) {
			res, body, _ := e.exchange("GET " + path + " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
			p := checkProblem(t, res, body, http.StatusNotFound)
			if p.Instance == nil || *p.Instance != path {
				t.Errorf("instance: got %v, want %q", p.Instance, path)
			}
		})
	}
}

func TestEveryRequestIsMeasured(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEnv(t, func(o *Options) {
		o.MeterProvider = mp
		o.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("up 1\n")) })
	})
	for _, r := range []struct{ method, path string }{
		{"GET", "/nope"},
		{"GET", "/nope/2"},
		{"POST", "/v1/x"},
		{"POST", "/livez"},
		{"BREW", "/coffee"},
		{"BREW", "/tea"},
		{"GET", "/docs/"},
		{"HEAD", "/docs/"},
		{"GET", "/docs/missing.js"},
		{"GET", "/metrics"},
		{"HEAD", "/livez"},
	} {
		e.exchange(r.method + " " + r.path + " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
	}

	m := collect(t, reader)
	unknown := func(method string, status int) []attribute.KeyValue {
		return []attribute.KeyValue{
			attribute.String("http.request.method", method),
			attribute.String("ratelimiter.operation", "unknown"),
			attribute.Int("http.response.status_code", status),
		}
	}
	route := func(method, route, op string, status int) []attribute.KeyValue {
		return []attribute.KeyValue{
			attribute.String("http.request.method", method),
			attribute.String("http.route", route),
			attribute.String("ratelimiter.operation", op),
			attribute.Int("http.response.status_code", status),
		}
	}
	for _, tc := range []struct {
		name  string
		attrs []attribute.KeyValue
		want  uint64
	}{
		{"GET to no route", unknown("GET", 404), 2},
		{"POST to no route", unknown("POST", 404), 1},
		{"POST to a path not served for POST", unknown("POST", 405), 1},
		{"an unknown method", unknown("_OTHER", 405), 2},
		{"the docs", route("GET", "/docs/*", "docs", 200), 1},
		{"the docs, HEAD", route("HEAD", "/docs/*", "docs", 200), 1},
		{"a file the docs lack", route("GET", "/docs/*", "docs", 404), 1},
		{"the metrics", route("GET", "/metrics", "metrics", 200), 1},
		{"liveness, HEAD", route("HEAD", "/livez", "getLiveness", 200), 1},
	} {
		if got := requests(t, m["http.server.request.duration"], tc.attrs...); got != tc.want {
			t.Errorf("%s: got %d requests, want %d", tc.name, got, tc.want)
		}
	}
	h := m["http.server.request.duration"].(metricdata.Histogram[float64])
	for _, dp := range h.DataPoints {
		for _, kv := range dp.Attributes.ToSlice() {
			if v := kv.Value.Emit(); strings.Contains(v, "nope") || strings.Contains(v, "coffee") || strings.Contains(v, "BREW") {
				t.Errorf("a label holds what the client sent: %s=%s", kv.Key, v)
			}
		}
	}
}
