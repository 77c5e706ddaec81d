package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads a Prometheus text exposition into "name{label="value",…}" →
// value, with labels sorted and counts and sums of histograms as their own
// series. Labels other than limiter, result and ratelimiter_operation are left out.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	series := make(map[string]float64)
	for name, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "limiter", "result", "ratelimiter_operation", "backend":
					labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
				}
			}
			sort.Strings(labels)
			key := func(n string) string {
				if len(labels) == 0 {
					return n
				}
				return n + "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				series[key(name)] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				series[key(name)] += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				series[key(name+"_count")] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return series
}

// logs collects the service's JSON log lines and hands over the addresses
// from its "listening" and "serving gRPC" records, the way an operator
// would read them.
type logs struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	records []map[string]any
	addr    chan string
	grpc    chan string
}

func newLogs() *logs { return &logs{addr: make(chan string, 1), grpc: make(chan string, 1)} }

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadBytes('\n')
		if err != nil {
			// An incomplete line: keep it for the next write.
			l.buf.Write(line)
			return len(p), nil
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			return 0, err
		}
		l.records = append(l.records, rec)
		switch rec["msg"] {
		case "listening":
			l.addr <- rec["address"].(string)
		case "serving gRPC":
			l.grpc <- rec["address"].(string)
		}
	}
}

// snapshot returns the records logged so far.
func (l *logs) snapshot() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.records)
}

// messages returns the msg of every record logged so far.
func (l *logs) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var msgs []string
	for _, rec := range l.records {
		msgs = append(msgs, rec["msg"].(string))
	}
	return msgs
}

// start runs the service in the process with args and env and returns its
// base URL once it listens, its logs, the channel run's result arrives on,
// and the cancel func that begins its shutdown.
func start(t *testing.T, args []string, env map[string]string) (base string, stderr *logs, done chan error, cancel context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	// gRPC on a free port, unless the test says otherwise: tests run side
	// by side, and the default port is one.
	env = maps.Clone(env)
	if _, ok := env["RATELIMITER_GRPC_LISTEN"]; !ok && !slices.Contains(args, "--grpc-listen") {
		if env == nil {
			env = make(map[string]string)
		}
		env["RATELIMITER_GRPC_LISTEN"] = "127.0.0.1:0"
	}
	stderr = newLogs()
	done = make(chan error, 1)
	go func() { done <- run(ctx, args, func(k string) string { return env[k] }, io.Discard, stderr) }()
	select {
	case addr := <-stderr.addr:
		return "http://" + addr, stderr, done, cancel
	case err := <-done:
		t.Fatalf("run returned before listening: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not log a listening address")
	}
	return "", nil, nil, nil
}

// waitRun waits up to 30 seconds for run, started by start and told to
// stop, to return, and fails t unless it returned nil.
func waitRun(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30s of being told to stop")
	}
}

func TestRunServesAndShutsDown(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("limiters:\n  - {name: payments-api, limit: 2, period: 1h, algorithm: sliding_log}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"RATELIMITER_CONFIG": cfg, "RATELIMITER_SHUTDOWN_DELAY": "2s"}
	args := []string{"--listen", "127.0.0.1:0", "--log-level", "debug"}

	base, stderr, done, cancel := start(t, args, env)

	get(t, base+"/livez", http.StatusOK)
	get(t, base+"/readyz", http.StatusOK)
	for i, wantAllowed := range []bool{true, true, false} {
		resp, err := http.Post(base+"/v1/limiters/payments-api/acquire", "application/json", strings.NewReader(`{"permits":1}`))
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		var d struct{ Allowed bool }
		err = json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("acquire %d: got status %d, decode error %v; want 200 and a decision", i, resp.StatusCode, err)
		}
		if d.Allowed != wantAllowed {
			t.Errorf("acquire %d from a limit of 2: got allowed %v, want %v", i, d.Allowed, wantAllowed)
		}
	}
	resp, err := http.Post(base+"/v1/tenants/203.0.113.7/acquire", "application/json", strings.NewReader(`{"permits":3}`))
	if err != nil {
		t.Fatalf("tenant acquire: %v", err)
	}
	resp.Body.Close()

	// The scrape reflects exactly what was just decided.
	m := scrape(t, base+"/metrics")
	for _, tt := range []struct {
		series string
		want   float64
	}{
		{`ratelimiter_decisions_total{limiter="payments-api",result="allowed"}`, 2},
		{`ratelimiter_decisions_total{limiter="payments-api",result="denied"}`, 1},
		{`ratelimiter_permits_total{limiter="payments-api",result="granted"}`, 2},
		{`ratelimiter_permits_total{limiter="payments-api",result="denied"}`, 1},
		{`ratelimiter_decisions_total{limiter="_tenant",result="allowed"}`, 1},
		{`ratelimiter_permits_total{limiter="_tenant",result="granted"}`, 3},
		{`ratelimiter_tenants_tracked`, 1},
		{`ratelimiter_backend_up{backend="memory"}`, 1},
	} {
		if got, ok := m[tt.series]; !ok || got != tt.want {
			t.Errorf("/metrics %s = %v (present %v), want %v", tt.series, got, ok, tt.want)
		}
	}
	if got := m[`http_server_request_duration_seconds_count{ratelimiter_operation="acquire"}`]; got != 3 {
		t.Errorf("request duration histogram counted %v acquire requests, want 3", got)
	}

	// On cancellation, readiness turns false while requests are still
	// served during the shutdown delay, then run returns cleanly.
	cancel()
	sawNotReady := false
	for !sawNotReady {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			break // the delay is over and the listener closed
		}
		resp.Body.Close()
		sawNotReady = resp.StatusCode == http.StatusServiceUnavailable
		time.Sleep(10 * time.Millisecond)
	}
	if !sawNotReady {
		t.Errorf("/readyz never answered 503 during the shutdown delay")
	}
	waitRun(t, done)

	msgs := strings.Join(stderr.messages(), "|")
	for _, want := range []string{"starting", "listening", "shutting down", "stopped"} {
		if !strings.Contains(msgs, want) {
			t.Errorf("logs lack %q: %s", want, msgs)
		}
	}
	if _, err := http.Get(base + "/livez"); err == nil {
		t.Errorf("the server still answers after run returned")
	}
}

func get(t *testing.T, url string, want int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != want {
		t.Errorf("GET %s: got status %d, want %d", url, resp.StatusCode, want)
	}
	return string(body)
}

func TestRunExits(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	brokenEnvoy := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(brokenEnvoy, []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })

	tests := []struct {
		name       string
		args       []string
		otel       string // OTEL_TRACES_EXPORTER
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "help", args: []string{"--help"}, wantCode: 0, wantStdout: "--tenant-limit"},
		{name: "version", args: []string{"--version"}, wantCode: 0, wantStdout: "ratelimiter dev"},
		{name: "bad flag value", args: []string{"--tenant-limit", "0"}, wantCode: 2, wantStderr: "--tenant-limit"},
		{name: "unknown flag", args: []string{"--colour"}, wantCode: 2, wantStderr: "--help"},
		{name: "missing config file", args: []string{"--config", "/nonexistent.yaml"}, wantCode: 2, wantStderr: "config file"},
		{name: "unknown traces exporter", otel: "jaeger", wantCode: 2, wantStderr: "OTEL_TRACES_EXPORTER"},
		{name: "address in use", args: []string{"--listen", busy.Addr().String()}, wantCode: 1, wantStderr: "listen"},
		{name: "gRPC address in use", args: []string{"--listen", "127.0.0.1:0", "--grpc-listen", busy.Addr().String()}, wantCode: 1, wantStderr: "listen for gRPC"},
		{name: "broken envoy configuration", args: []string{"--envoy-config", brokenEnvoy}, wantCode: 2, wantStderr: brokenEnvoy + ":4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.otel != "" {
				t.Setenv("OTEL_TRACES_EXPORTER", tt.otel)
			}
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tt.args, func(string) string { return "" }, &stdout, io.Discard)
			if code := exitCode(err, &stderr); code != tt.wantCode {
				t.Errorf("got exit code %d (error %v), want %d", code, err, tt.wantCode)
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) {
				t.Errorf("stdout %q lacks %q", stdout.String(), tt.wantStdout)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

// A request in flight when shutdown begins is answered in full; only then
// does run return.
func TestShutdownLetsInFlightRequestsFinish(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	env := map[string]string{}
	args := []string{"--listen", "127.0.0.1:0", "--tenant-limit", "5"}
	base, stderr, done, cancel := start(t, args, env)

	// Start a request whose body arrives in two parts, and begin the
	// shutdown between them.
	body, send := io.Pipe()
	type answer struct {
		status  int
		allowed bool
		err     error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.Post(base+"/v1/tenants/203.0.113.7/acquire", "application/json", body)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		var d struct{ Allowed bool }
		err = json.NewDecoder(resp.Body).Decode(&d)
		answered <- answer{status: resp.StatusCode, allowed: d.Allowed, err: err}
	}()
	if _, err := send.Write([]byte(`{"permits":`)); err != nil {
		t.Fatal(err)
	}
	// The write returns once the client has taken the first part; give the
	// server a moment to read the headers and block on the rest of the body,
	// so that the request is in flight, not waiting to be accepted.
	time.Sleep(100 * time.Millisecond)
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(strings.Join(stderr.messages(), "|"), "shutting down") {
		if time.Now().After(deadline) {
			t.Fatal("run did not start shutting down")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("run returned with a request in flight: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := send.Write([]byte(`3}`)); err != nil {
		t.Fatal(err)
	}
	send.Close()

	a := <-answered
	if a.err != nil || a.status != http.StatusOK || !a.allowed {
		t.Errorf("in-flight acquire: got status %d, allowed %v, error %v; want 200 and allowed", a.status, a.allowed, a.err)
	}
	waitRun(t, done)
}

// TestMetricsOfManyLimiters: with as many limiters as the decision metrics
// label, and more, each allowing and denying, no decision goes to
// OpenTelemetry's overflow series.
func TestMetricsOfManyLimiters(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	const n = 1_001 // one past the default cap
	var file strings.Builder
	file.WriteString("limiters:\n")
	for i := range n {
		fmt.Fprintf(&file, "  - {name: l%d, limit: 1, period: 1h}\n", i)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0"}, map[string]string{"RATELIMITER_CONFIG": cfg})
	for i := range n {
		for range 2 { // allowed, then denied
			resp, err := http.Post(fmt.Sprintf("%s/v1/limiters/l%d/acquire", base, i), "application/json", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	body := get(t, base+"/metrics", http.StatusOK)
	if strings.Contains(body, "otel_metric_overflow") {
		t.Errorf("/metrics has an otel_metric_overflow series")
	}
	m := scrape(t, base+"/metrics")
	for _, tt := range []struct {
		series string
		want   float64
	}{
		{`ratelimiter_decisions_total{limiter="l0",result="allowed"}`, 1},
		{`ratelimiter_decisions_total{limiter="l0",result="denied"}`, 1},
		{`ratelimiter_decisions_total{limiter="_other",result="allowed"}`, 1},
		{`ratelimiter_decisions_total{limiter="_other",result="denied"}`, 1},
	} {
		if got, ok := m[tt.series]; !ok || got != tt.want {
			t.Errorf("/metrics %s = %v (present %v), want %v", tt.series, got, ok, tt.want)
		}
	}
}

// TestShutdownDelayClosesConnections checks that answers given during the
// shutdown delay close their connection, so that a client's next request
// goes through a new one (to another replica behind a load balancer), and
// that answers before it keep the connection open.
func TestShutdownDelayClosesConnections(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	env := map[string]string{"RATELIMITER_SHUTDOWN_DELAY": "5s"}
	base, _, done, cancel := start(t, []string{"--listen", "127.0.0.1:0"}, env)
	hc := &http.Client{Transport: &http.Transport{}}
	// call GETs path and returns its status, whether the connection was
	// reused and whether the answer closed it.
	call := func(path string) (status int, reused, closed bool) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
		}))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, reused, resp.Close
	}

	call("/livez")
	if _, reused, closed := call("/livez"); !reused || closed {
		t.Errorf("before shutdown: connection reused %t, closed %t; want reused and kept", reused, closed)
	}
	cancel()
	// The first answer that says not ready closes its connection...
	for {
		status, _, closed := call("/readyz")
		if status == http.StatusServiceUnavailable {
			if !closed {
				t.Error("/readyz answered 503 and kept the connection")
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// ...and so does every later one, each on a new connection.
	for i := range 3 {
		if status, reused, closed := call("/livez"); status != http.StatusOK || reused || !closed {
			t.Errorf("answer %d during the shutdown delay: status %d, connection reused %t, closed %t; want 200 on a new connection, closed", i, status, reused, closed)
		}
	}
	waitRun(t, done)
}
