package helmtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// repoRoot is the service's module, relative to this package.
const repoRoot = "../../.."

// scrapeLabels are the labels Prometheus gives every series of a target
// when it scrapes it (instance and job), and those a ServiceMonitor adds
// (namespace and pod): the service does not export them, yet the alerts
// and the dashboard select by them.
var scrapeLabels = []string{"instance", "job", "namespace", "pod"}

// exported is what a scrape of the service's /metrics holds: for each
// series name (a histogram's as its _bucket, _count and _sum series), the
// values each label takes.
type exported map[string]map[string]map[string]bool

func (e exported) add(name string, lbls map[string]string) {
	if e[name] == nil {
		e[name] = map[string]map[string]bool{}
	}
	for k, v := range lbls {
		if e[name][k] == nil {
			e[name][k] = map[string]bool{}
		}
		e[name][k][v] = true
	}
}

// addScrape adds the series of a Prometheus text exposition.
func (e exported) addScrape(t *testing.T, r io.Reader) {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			lbls := map[string]string{}
			for _, l := range m.GetLabel() {
				lbls[l.GetName()] = l.GetValue()
			}
			if f.GetType() != dto.MetricType_HISTOGRAM {
				e.add(name, lbls)
				continue
			}
			e.add(name+"_count", lbls)
			e.add(name+"_sum", lbls)
			for _, b := range m.GetHistogram().GetBucket() {
				withLE := maps.Clone(lbls)
				withLE["le"] = model.FloatString(b.GetUpperBound()).String()
				e.add(name+"_bucket", withLE)
			}
		}
	}
}

// serviceMetrics builds the service from this repository, runs it, makes
// decisions of every kind and returns its /metrics, twice: once on
// the memory backend (allowed and denied decisions of a named limiter and
// of the per-IP limit, tenants tracked), once on a Redis backend that
// never answers, with fail-open (degraded decisions, the backend down).
var serviceMetrics = sync.OnceValues(func() ([]string, error) {
	dir, err := os.MkdirTemp("", "ratelimiter-metrics-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "ratelimiter")
	build := exec.Command("go", "build", "-o", bin, "./cmd/service")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/service: %w\n%s", err, out)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("limiters:\n  - {name: probe, limit: 1, period: 1h}\n"), 0o600); err != nil {
		return nil, err
	}
	// A loopback port nothing listens on: connections are refused at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	closed := l.Addr().String()
	l.Close()

	var bodies []string
	for _, env := range [][]string{
		{"RATELIMITER_BACKEND=memory"},
		{"RATELIMITER_BACKEND=redis", "RATELIMITER_REDIS_ADDRS=" + closed, "RATELIMITER_REDIS_FAILURE_MODE=fail-open",
			"RATELIMITER_REDIS_TIMEOUT=100ms", "RATELIMITER_REDIS_DIAL_TIMEOUT=100ms"},
	} {
		body, err := scrapeAfterDecisions(bin, append(env, "RATELIMITER_CONFIG="+cfg))
		if err != nil {
			return nil, fmt.Errorf("%v: %w", env, err)
		}
		bodies = append(bodies, body)
	}
	return bodies, nil
})

// scrapeAfterDecisions runs the service binary with env, takes two permits
// of a limit of one from limiter probe (one allowed, one denied) and one
// per-IP permit, and returns its /metrics.
func scrapeAfterDecisions(bin string, env []string) (string, error) {
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"RATELIMITER_LISTEN=127.0.0.1:0", "RATELIMITER_GRPC_LISTEN=127.0.0.1:0", "RATELIMITER_LOG_FORMAT=json", "OTEL_TRACES_EXPORTER=none"}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var rec struct{ Msg, Address string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" {
				addr <- rec.Address
			}
		}
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case <-time.After(30 * time.Second):
		return "", fmt.Errorf("the service logged no listening address within 30s")
	}
	for _, path := range []string{"/v1/limiters/probe/acquire", "/v1/limiters/probe/acquire", "/v1/tenants/203.0.113.7/acquire"} {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(`{"permits": 1}`))
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("POST %s: %s", path, resp.Status)
		}
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	return string(body), nil
}

// grafanaVariables are the dashboard's variables and Grafana's own, with a
// value that parses where they stand in a query.
var grafanaVariables = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"${namespace}", "x", "$namespace", "x", "${job}", "x", "$job", "x")

// nameUse is a metric, label or label value that a query depends on.
type nameUse struct {
	metric string // a series name; empty for a label of several metrics
	label  string // empty for the metric alone
	value  string // a value the label must take, for = and != matchers
	among  []string
	where  string
}

// namesUsed lists the series names, label names and label values the
// PromQL expression expr selects or groups by; where says where expr comes
// from. A label that by, without, on or ignoring names must be on one of
// the series the expression under it selects.
func namesUsed(where, expr string) ([]nameUse, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVariables.Replace(expr))
	if err != nil {
		return nil, fmt.Errorf("%s: %q does not parse as PromQL: %w", where, expr, err)
	}
	// selected returns the series names n selects.
	selected := func(n parser.Node) []string {
		var names []string
		parser.Inspect(n, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				names = append(names, vs.Name)
			}
			return nil
		})
		return names
	}
	var uses []nameUse
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			if n.Name == "" {
				err = fmt.Errorf("%s: %q selects series without naming them", where, expr)
				return nil
			}
			uses = append(uses, nameUse{metric: n.Name, where: where})
			for _, m := range n.LabelMatchers {
				if m.Name == labels.MetricName {
					continue
				}
				u := nameUse{metric: n.Name, label: m.Name, where: where}
				// "x" stands for a dashboard variable's value.
				if (m.Type == labels.MatchEqual || m.Type == labels.MatchNotEqual) && m.Value != "" && m.Value != "x" {
					u.value = m.Value
				}
				uses = append(uses, u)
			}
		case *parser.AggregateExpr:
			for _, l := range n.Grouping {
				uses = append(uses, nameUse{label: l, among: selected(n.Expr), where: where})
			}
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				among := append(selected(n.LHS), selected(n.RHS)...)
				for _, l := range append(slices.Clone(n.VectorMatching.MatchingLabels), n.VectorMatching.Include...) {
					uses = append(uses, nameUse{label: l, among: among, where: where})
				}
			}
		}
		return nil
	})
	return uses, err
}

// labelValuesQuery matches Grafana's label_values(selector, label).
var labelValuesQuery = regexp.MustCompile(`^label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`)

// queryNamesUsed is namesUsed for a dashboard query, which may also be a
// variable's label_values(selector, label).
func queryNamesUsed(where, query string) ([]nameUse, error) {
	m := labelValuesQuery.FindStringSubmatch(strings.TrimSpace(query))
	if m == nil {
		return namesUsed(where, query)
	}
	uses, err := namesUsed(where, m[1])
	var among []string
	for _, u := range uses {
		if u.label == "" {
			among = append(among, u.metric)
		}
	}
	return append(uses, nameUse{label: m[2], among: among, where: where}), err
}

// check returns what is wrong with each use against what the service
// exports.
func (e exported) check(uses []nameUse) []string {
	var errs []string
	for _, u := range uses {
		switch {
		case u.label == "":
			if e[u.metric] == nil {
				errs = append(errs, fmt.Sprintf("%s: the service exports no series %s", u.where, u.metric))
			}
		case slices.Contains(scrapeLabels, u.label):
		case u.metric != "":
			values, ok := e[u.metric][u.label]
			switch {
			case e[u.metric] == nil:
				// Reported once, for the metric alone.
			case !ok:
				errs = append(errs, fmt.Sprintf("%s: no series %s has a label %s (it has %v)", u.where, u.metric, u.label, slices.Sorted(maps.Keys(e[u.metric]))))
			case u.value != "" && !values[u.value]:
				errs = append(errs, fmt.Sprintf("%s: label %s of %s never takes the value %q (it takes %v)", u.where, u.label, u.metric, u.value, slices.Sorted(maps.Keys(values))))
			}
		default:
			found := false
			for _, m := range u.among {
				_, ok := e[m][u.label]
				found = found || ok
			}
			if !found {
				errs = append(errs, fmt.Sprintf("%s: grouping by %s, which none of %v has", u.where, u.label, u.among))
			}
		}
	}
	return errs
}

// serviceExports returns what the real service exports, failing the test
// when it cannot be built or run.
func serviceExports(t *testing.T) exported {
	t.Helper()
	bodies, err := serviceMetrics()
	if err != nil {
		t.Fatalf("scrape the service: %v", err)
	}
	e := exported{}
	for _, body := range bodies {
		e.addScrape(t, strings.NewReader(body))
	}
	return e
}

// TestDashboardAndAlertsUseExportedNames checks every series name, label
// name and label value that the Grafana dashboard's queries and the alert
// rules use against the /metrics of the service itself, built from this
// repository and run after decisions of every kind: a name that drifts on
// either side fails here, where the dashboard would show nothing and the
// alerts would never fire.
func TestDashboardAndAlertsUseExportedNames(t *testing.T) {
	t.Parallel()
	e := serviceExports(t)

	var uses []nameUse
	add := func(u []nameUse, err error) {
		t.Helper()
		if err != nil {
			t.Error(err)
		}
		uses = append(uses, u...)
	}
	d := readDashboard(t)
	for _, p := range d.Panels {
		for i, q := range p.Targets {
			add(queryNamesUsed(fmt.Sprintf("dashboard panel %q query %d", p.Title, i), q.Expr))
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			add(queryNamesUsed("dashboard variable "+v.Name, variableQuery(t, v.Query)))
		}
	}
	for _, vs := range []valueSet{{name: "monitoring on", extra: monitoringOn}, {name: "ci/all-features-values.yaml", files: []string{filepath.Join(chartDir, "ci", "all-features-values.yaml")}}} {
		for name, r := range alertRules(t, render(t, vs)) {
			add(namesUsed(fmt.Sprintf("%s: alert %s", vs.name, name), r.Expr.String()))
		}
	}
	for _, err := range e.check(uses) {
		t.Error(err)
	}
	metrics := map[string]bool{}
	for _, u := range uses {
		if u.label == "" {
			metrics[u.metric] = true
		}
	}
	t.Logf("checked %d uses of %d series names against the service's /metrics: %v", len(uses), len(metrics), slices.Sorted(maps.Keys(metrics)))
	for _, want := range []string{"ratelimiter_decisions_total", "ratelimiter_permits_total", "ratelimiter_backend_up",
		"ratelimiter_tenants_tracked", "http_server_request_duration_seconds_bucket"} {
		if !metrics[want] {
			t.Errorf("neither the dashboard nor the alerts use %s", want)
		}
	}
}

// TestDriftedNamesAreFound makes sure the check above can fail: each query
// below misnames one thing the service exports.
func TestDriftedNamesAreFound(t *testing.T) {
	t.Parallel()
	e := serviceExports(t)
	tests := []struct {
		query, want string
	}{
		{`sum(rate(ratelimiter_decisions_total{job="$job"}[$__rate_interval]))`, ""},
		{`rate(ratelimiter_decision_total[5m])`, "no series ratelimiter_decision_total"},
		{`rate(ratelimiter_decisions_total{outcome="denied"}[5m])`, "has a label outcome"},
		{`rate(ratelimiter_decisions_total{result="deny"}[5m])`, `never takes the value "deny"`},
		{`rate(ratelimiter_decisions_total{degraded!="yes"}[5m])`, `never takes the value "yes"`},
		{`ratelimiter_backend_up{backend="etcd"}`, `never takes the value "etcd"`},
		{`sum by (limitter) (rate(ratelimiter_decisions_total[5m]))`, "grouping by limitter"},
		{`histogram_quantile(0.9, sum by (le, operation) (rate(http_server_request_duration_seconds_bucket[5m])))`, "grouping by operation"},
		{`rate(http_server_request_duration_seconds[5m])`, "no series http_server_request_duration_seconds"},
		{`a / on (limiter) ratelimiter_backend_up`, "no series a"},
		{`ratelimiter_permits_total / on (backend) ratelimiter_decisions_total`, "grouping by backend"},
		{`label_values(ratelimiter_backend_up, namespaces)`, "grouping by namespaces"},
		{`sum(rate(ratelimiter_decisions_total[5m])`, "does not parse"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			t.Parallel()
			uses, err := queryNamesUsed("query", tt.query)
			errs := e.check(uses)
			if err != nil {
				errs = append(errs, err.Error())
			}
			got := strings.Join(errs, "\n")
			if tt.want == "" {
				if got != "" {
					t.Errorf("got errors %s, want none", got)
				}
				return
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("got errors %q, want one containing %q", got, tt.want)
			}
		})
	}
}
