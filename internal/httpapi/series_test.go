package httpapi

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ratelimiter/ratelimiter/client"
)

// labels lists the limiter labels of a counter's data points, and tells
// whether any point is OpenTelemetry's overflow series.
func labels(t *testing.T, data metricdata.Aggregation) (names []string, overflow bool) {
	t.Helper()
	s, ok := data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("got %T, want an int64 sum", data)
	}
	for _, dp := range s.DataPoints {
		if _, ok := dp.Attributes.Value("otel.metric.overflow"); ok {
			overflow = true
		}
		if v, ok := dp.Attributes.Value(keyLimiter); ok && !slices.Contains(names, v.AsString()) {
			names = append(names, v.AsString())
		}
	}
	slices.Sort(names)
	return names, overflow
}

// TestMetricsSurviveLimiterChurn creates, uses and deletes 3,000 limiters
// through the API, more than OpenTelemetry keeps series of: the deleted
// limiters leave no series, nothing overflows, and the cap of labels is
// still free for the limiters that live.
func TestMetricsSurviveLimiterChurn(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEnv(t, func(o *Options) { o.MeterProvider = mp })
	for i := range 3_000 {
		name := fmt.Sprintf("churn-%d", i)
		e.put(name, client.LimiterSpec{Limit: 9, Period: "1m"})
		if res, _ := e.raw(http.MethodPost, "/v1/limiters/"+name+"/acquire", "", ""); res.StatusCode != http.StatusOK {
			t.Fatalf("acquire %s: status %d", name, res.StatusCode)
		}
		if res, _ := e.raw(http.MethodDelete, "/v1/limiters/"+name, "", ""); res.StatusCode != http.StatusNoContent {
			t.Fatalf("delete %s: status %d", name, res.StatusCode)
		}
		if i%500 == 0 {
			collect(t, reader) // as scrapes would, meanwhile
		}
	}
	e.put("seed", client.LimiterSpec{Limit: 9, Period: "1m"})
	e.raw(http.MethodPost, "/v1/limiters/seed/acquire", "", "")

	m := collect(t, reader)
	for _, metric := range []string{"ratelimiter.decisions", "ratelimiter.permits"} {
		names, overflow := labels(t, m[metric])
		if overflow {
			t.Errorf("%s: got an otel_metric_overflow series, want none", metric)
		}
		if want := []string{"seed"}; !slices.Equal(names, want) {
			t.Errorf("%s: got %d limiter labels (%q...), want %q", metric, len(names), names[:min(len(names), 5)], want)
		}
	}
	if got := sum(t, m["ratelimiter.decisions"], attribute.String("limiter", "seed"), attribute.String("result", "allowed")); got != 1 {
		t.Errorf("decisions{limiter=seed}: got %d, want 1", got)
	}
}

// TestMetricsCapOfLimiters: past the cap, decisions are counted under
// OtherLimiter, and a deleted limiter's place goes to the next one.
func TestMetricsCapOfLimiters(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEnv(t, func(o *Options) { o.MeterProvider = mp; o.MetricsMaxLimiters = 3 })
	acquire := func(names ...string) {
		t.Helper()
		for _, name := range names {
			e.put(name, client.LimiterSpec{Limit: 9, Period: "1m"})
			if res, _ := e.raw(http.MethodPost, "/v1/limiters/"+name+"/acquire", "", ""); res.StatusCode != http.StatusOK {
				t.Fatalf("acquire %s: status %d", name, res.StatusCode)
			}
		}
	}
	acquire("a", "b", "c", "d", "e")
	e.raw(http.MethodPost, "/v1/tenants/203.0.113.7/acquire", "", "") // the tenant label is not one of the 3
	batch := `{"acquisitions":[{"limiter":"a"},{"limiter":"d"},{"limiter":"d"},{"limiter":"e"}]}`
	if res, body := e.raw(http.MethodPost, "/v1/acquire", "application/json", batch); res.StatusCode != http.StatusOK {
		t.Fatalf("batch: status %d: %s", res.StatusCode, body)
	}

	allowed := attribute.String("result", "allowed")
	m := collect(t, reader)
	names, _ := labels(t, m["ratelimiter.decisions"])
	if want := []string{OtherLimiter, TenantLimiter, "a", "b", "c"}; !slices.Equal(names, want) {
		t.Errorf("limiter labels: got %q, want %q", names, want)
	}
	for name, want := range map[string]int64{"a": 2, "b": 1, "c": 1, OtherLimiter: 5, TenantLimiter: 1} {
		if got := sum(t, m["ratelimiter.decisions"], attribute.String("limiter", name), allowed); got != want {
			t.Errorf("decisions{limiter=%s}: got %d, want %d", name, got, want)
		}
	}

	// b goes: its place is free for the next limiter to decide.
	if res, _ := e.raw(http.MethodDelete, "/v1/limiters/b", "", ""); res.StatusCode != http.StatusNoContent {
		t.Fatalf("delete b: status %d", res.StatusCode)
	}
	acquire("f")
	m = collect(t, reader)
	names, _ = labels(t, m["ratelimiter.decisions"])
	if want := []string{OtherLimiter, TenantLimiter, "a", "c", "f"}; !slices.Equal(names, want) {
		t.Errorf("limiter labels after deleting b: got %q, want %q", names, want)
	}
	if got := sum(t, m["ratelimiter.decisions"], attribute.String("limiter", OtherLimiter), allowed); got != 5 {
		t.Errorf("decisions{limiter=%s}: got %d, want 5", OtherLimiter, got)
	}
}

// TestSeriesAgeOut: a limiter without a decision for seriesIdle loses its
// series, as one deleted through another replica would, and its place.
func TestSeriesAgeOut(t *testing.T) {
	clk := newClock()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	s := newSeries(2, clk.Wall)
	if err := s.register(mp.Meter("test")); err != nil {
		t.Fatal(err)
	}
	s.of("idle").add(false, true, 1, 1)
	s.of("busy").add(false, true, 1, 1)
	for i, want := range [][]string{
		{"busy", "idle"}, // both decided since the last collection
		{"busy", "idle"}, // idle found idle: not for long yet
		{"busy", "idle"}, // idle for seriesIdle less a minute
		{"busy"},         // idle for seriesIdle
	} {
		if got, _ := labels(t, collect(t, reader)["ratelimiter.decisions"]); !slices.Equal(got, want) {
			t.Errorf("collection %d: got %q, want %q", i, got, want)
		}
		s.of("busy").add(false, true, 1, 1)
		clk.Advance([]time.Duration{time.Minute, seriesIdle - time.Minute, time.Minute, 0}[i])
	}
	if got := s.of("new"); got == s.other {
		t.Errorf("a new limiter after idle aged out: got %s, want its own series", OtherLimiter)
	}
}

// TestDecisionSeriesFit: a meter provider whose cardinality limit is
// DecisionSeries(max) reports every label's every outcome, and one with a
// lower limit does not.
func TestDecisionSeriesFit(t *testing.T) {
	const max = 3
	for _, tc := range []struct {
		name     string
		limit    int
		overflow bool
	}{
		{"enough", DecisionSeries(max), false},
		{"one short", DecisionSeries(max) - 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithCardinalityLimit(tc.limit))
			s := newSeries(max, time.Now)
			if err := s.register(mp.Meter("test")); err != nil {
				t.Fatal(err)
			}
			cs := []*counts{s.tenant}
			for _, name := range []string{"a", "b", "c", "d", "e"} {
				cs = append(cs, s.of(name))
			}
			for _, c := range cs {
				for _, degraded := range []bool{false, true} {
					for _, ok := range []bool{false, true} {
						c.add(degraded, ok, 1, 1)
					}
				}
			}
			m := collect(t, reader)
			for _, metric := range []string{"ratelimiter.decisions", "ratelimiter.permits"} {
				if _, overflow := labels(t, m[metric]); overflow != tc.overflow {
					t.Errorf("%s overflow: got %v, want %v", metric, overflow, tc.overflow)
				}
				if got, want := len(m[metric].(metricdata.Sum[int64]).DataPoints), 2*2*(max+2); !tc.overflow && got != want {
					t.Errorf("%s: got %d series, want %d", metric, got, want)
				}
			}
		})
	}
}
