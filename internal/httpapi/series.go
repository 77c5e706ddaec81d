package httpapi

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The decision counters are labelled by limiter name, and names come and go
// through the API. OpenTelemetry's synchronous counters keep every label
// they ever saw, up to 2,000 a counter, and then pour everything into one
// otel_metric_overflow series. So the service counts decisions itself, in
// series, and reports the counts through observable counters, which export
// only what their callback observes: a limiter's series go when it is
// deleted, when it has seen no decision for seriesIdle, and the names past
// the cap share the one label OtherLimiter.

// DefaultMetricsMaxLimiters is the cap on limiter labels of the decision
// metrics when Options.MetricsMaxLimiters is 0.
const DefaultMetricsMaxLimiters = 1000

// DecisionSeries is the cardinality limit a meter provider needs so that
// each decision counter can report all its series when maxLimiters
// limiters get a label: allowed and denied, degraded or not, for each of
// them, TenantLimiter and OtherLimiter, plus the place the SDK keeps
// for its overflow series (telemetry.Options.MaxSeries). A maxLimiters of
// 0 counts as DefaultMetricsMaxLimiters, as in Options.
func DecisionSeries(maxLimiters int) int {
	if maxLimiters == 0 {
		maxLimiters = DefaultMetricsMaxLimiters
	}
	return 2*outcomes*(maxLimiters+2) + 1
}

// OtherLimiter is the limiter label of the decisions of every limiter past
// the cap of labels. No limiter name starts with an underscore.
const OtherLimiter = "_other"

// TenantLimiter is the limiter label of the per-IP decisions. It starts
// with an underscore, as no limiter name does, so that a limiter named
// tenant has series of its own.
const TenantLimiter = "_tenant"

// seriesIdle is how long a limiter's series stay without a decision before
// they are dropped, so that names deleted through another replica (or a
// decision racing a delete) give their place back. They come back, counted
// from zero, at the limiter's next decision.
const seriesIdle = time.Hour

// Decision outcomes, as indices of counts.
const (
	allowed = iota
	denied
	outcomes
)

// counts are the decisions and permits of one label, by degraded and
// outcome. Safe for concurrent use.
type counts struct {
	decisions, permits [2][outcomes]atomic.Int64
	// used is set by each decision and cleared by each collection; idle
	// is when a collection first found it clear. Only collections read
	// idle, under series.mu.
	used atomic.Bool
	idle time.Time

	// The attribute sets of the label, by degraded and outcome.
	decisionOpts, permitOpts [2][outcomes][]metric.ObserveOption
}

func newCounts(name string) *counts {
	c := new(counts)
	for d, degraded := range [2][]attribute.KeyValue{nil, {keyDegraded.Bool(true)}} {
		for o, results := range [outcomes][2]string{allowed: {"allowed", "granted"}, denied: {"denied", "denied"}} {
			set := func(result string) []metric.ObserveOption {
				attrs := append([]attribute.KeyValue{keyLimiter.String(name), keyResult.String(result)}, degraded...)
				return []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
			}
			c.decisionOpts[d][o], c.permitOpts[d][o] = set(results[0]), set(results[1])
		}
	}
	return c
}

// add counts n decisions on permits permits.
func (c *counts) add(degraded, ok bool, n, permits int64) {
	d, o := 0, denied
	if degraded {
		d = 1
	}
	if ok {
		o = allowed
	}
	c.decisions[d][o].Add(n)
	c.permits[d][o].Add(permits)
	if !c.used.Load() { // most decisions only read it
		c.used.Store(true)
	}
}

// series holds the counts of each limiter label, at most max of them
// besides TenantLimiter and OtherLimiter. Safe for concurrent use.
type series struct {
	max    int
	byName sync.Map // limiter name -> *counts
	n      atomic.Int64
	mu     sync.Mutex // serializes adding, releasing and collecting
	other  *counts
	tenant *counts // per-IP decisions: never released
	now    func() time.Time
}

func newSeries(max int, now func() time.Time) *series {
	return &series{max: max, other: newCounts(OtherLimiter), tenant: newCounts(TenantLimiter), now: now}
}

// of returns the counts of the limiter name, taking a label for it while
// fewer than max are taken.
func (s *series) of(name string) *counts {
	if v, ok := s.byName.Load(name); ok {
		return v.(*counts)
	}
	if s.n.Load() >= int64(s.max) {
		return s.other
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.byName.Load(name); ok {
		return v.(*counts)
	}
	if s.n.Load() >= int64(s.max) {
		return s.other
	}
	c := newCounts(name)
	s.byName.Store(name, c)
	s.n.Add(1)
	return c
}

// release drops the series of the limiter name, which is gone.
func (s *series) release(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byName.LoadAndDelete(name); ok {
		s.n.Add(-1)
	}
}

// observe reports every label's counts to decisions and permits, and
// drops the labels idle for longer than seriesIdle.
func (s *series) observe(o metric.Observer, decisions, permits metric.Int64Observable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.byName.Range(func(k, v any) bool {
		c := v.(*counts)
		switch {
		case c.used.Swap(false):
			c.idle = time.Time{}
		case c.idle.IsZero():
			c.idle = now
		case now.Sub(c.idle) >= seriesIdle:
			s.byName.Delete(k)
			s.n.Add(-1)
			return true
		}
		c.observe(o, decisions, permits)
		return true
	})
	s.tenant.observe(o, decisions, permits)
	s.other.observe(o, decisions, permits)
}

// observe reports c's counts that are not zero.
func (c *counts) observe(o metric.Observer, decisions, permits metric.Int64Observable) {
	for d := range 2 {
		for k := range outcomes {
			if n := c.decisions[d][k].Load(); n > 0 {
				o.ObserveInt64(decisions, n, c.decisionOpts[d][k]...)
				o.ObserveInt64(permits, c.permits[d][k].Load(), c.permitOpts[d][k]...)
			}
		}
	}
}

// register creates the observable counters that report s.
func (s *series) register(m metric.Meter) error {
	decisions, err := m.Int64ObservableCounter("ratelimiter.decisions",
		metric.WithUnit("{decision}"),
		metric.WithDescription("Acquisitions decided, by limiter (the limiter's name, "+TenantLimiter+" for per-IP limits, or "+OtherLimiter+" for the limiters past the cap of labels) and result (allowed or denied)."))
	if err != nil {
		return err
	}
	permits, err := m.Int64ObservableCounter("ratelimiter.permits",
		metric.WithUnit("{permit}"),
		metric.WithDescription("Permits asked for, by limiter and result (granted or denied)."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s.observe(o, decisions, permits)
		return nil
	}, decisions, permits)
	return err
}

// decided counts one decision of the limiter labelled name.
func (t *telemetry) decided(name string, d limiter.Decision) {
	t.series.of(name).add(d.Degraded, d.Allowed, 1, d.Permits)
}

// decidedTenant counts one per-IP decision.
func (t *telemetry) decidedTenant(d limiter.Decision) {
	t.series.tenant.add(d.Degraded, d.Allowed, 1, d.Permits)
}

// decidedBatch counts the decisions of a batch: one addition per run of
// decisions on the same limiter with the same outcome, rather than one per
// decision, since a batch often asks one limiter many times.
func (t *telemetry) decidedBatch(reqs []limiter.Request, out []limiter.Result) {
	var run struct {
		name              string
		degraded, allowed bool
		n, permits        int64
	}
	flush := func() {
		if run.n > 0 {
			t.series.of(run.name).add(run.degraded, run.allowed, run.n, run.permits)
		}
	}
	for i, r := range out {
		if r.Err != nil {
			continue // not a decision, as for a single acquisition
		}
		d := r.Decision
		if run.n > 0 && (reqs[i].Name != run.name || d.Degraded != run.degraded || d.Allowed != run.allowed) {
			flush()
			run.n, run.permits = 0, 0
		}
		run.name, run.degraded, run.allowed = reqs[i].Name, d.Degraded, d.Allowed
		run.n++
		run.permits += d.Permits
	}
	flush()
}
