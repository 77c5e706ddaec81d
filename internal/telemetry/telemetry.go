// Package telemetry sets up OpenTelemetry tracing and metrics for the
// service, once, at start-up.
//
// Tracing is off unless OTEL_TRACES_EXPORTER asks for it ("otlp" or
// "console"): with it off, the global TracerProvider is a no-op, so spans cost
// nothing, yet the W3C Trace Context and Baggage propagator is installed so
// that trace context still flows through. When tracing is on, the standard
// OTEL_* variables configure it: OTEL_EXPORTER_OTLP_ENDPOINT and
// OTEL_EXPORTER_OTLP_PROTOCOL the exporter, OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG the sampler (parentbased_always_on by default),
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES the resource.
//
// Metrics are always on and pulled: the MeterProvider feeds a Prometheus
// registry private to this package (never the global default), served by
// Telemetry.Metrics in the Prometheus text format.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// scope names the instruments this package creates itself.
const scope = "github.com/ratelimiter/ratelimiter/internal/telemetry"

// LatencyBuckets are the histogram bucket bounds, in seconds, of every
// histogram whose unit is "s", whatever bounds its instrument advises. A
// decision takes microseconds, so the sub-millisecond buckets carry most of
// the information; the buckets above a second only tell how slow a stalled
// request was, up to the default write timeout of 10s. Do not modify.
var LatencyBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// Options configures Setup.
type Options struct {
	// ServiceName is the resource's service.name; OTEL_SERVICE_NAME
	// overrides it. Required.
	ServiceName string
	// Version is the resource's service.version; empty leaves it out.
	Version string
	// Logger receives the errors the OpenTelemetry SDK reports in the
	// background, such as failed span exports. Nil means slog.Default().
	Logger *slog.Logger
	// SpanExporter, when non-nil, replaces the exporter OTEL_TRACES_EXPORTER
	// selects and turns tracing on; tests use it to capture spans.
	SpanExporter sdktrace.SpanExporter
	// MaxSeries is the most series (data points) one instrument may report
	// in a collection; past it, the SDK pours the rest into one series
	// labelled otel_metric_overflow="true". Values below
	// DefaultMaxSeries, zero included, mean DefaultMaxSeries.
	MaxSeries int
}

// DefaultMaxSeries is the OpenTelemetry SDK's own cap on the series of one
// instrument.
const DefaultMaxSeries = 2000

// Telemetry holds the providers Setup installed. Its fields are safe for
// concurrent use.
type Telemetry struct {
	// TracerProvider is the global TracerProvider: a no-op one when
	// tracing is off.
	TracerProvider trace.TracerProvider
	// MeterProvider is the global MeterProvider.
	MeterProvider metric.MeterProvider
	// Metrics serves every metric in the Prometheus text format; mount it
	// at GET /metrics.
	Metrics http.Handler
	// Tracing reports whether spans are recorded and exported.
	Tracing bool

	shutdown []func(context.Context) error
}

// Setup builds the tracer and meter providers from opts and the standard
// OTEL_* environment variables, and installs them, with the W3C Trace Context
// and Baggage propagator and an error handler that logs to opts.Logger, as the
// OpenTelemetry globals. Call it once, before creating anything that traces or
// measures, and call Shutdown when done. An unknown OTEL_TRACES_EXPORTER or
// OTEL_EXPORTER_OTLP_PROTOCOL is an error.
func Setup(ctx context.Context, opts Options) (*Telemetry, error) {
	if opts.ServiceName == "" {
		return nil, errors.New("telemetry: setup: service name is required")
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	// First, so that what the SDK reports while starting is logged too.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("telemetry error", "error", err)
	}))

	attrs := []attribute.KeyValue{semconv.ServiceName(opts.ServiceName)}
	if opts.Version != "" {
		attrs = append(attrs, semconv.ServiceVersion(opts.Version))
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attrs...),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // last, so that OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	switch {
	case errors.Is(err, resource.ErrPartialResource):
		// A malformed OTEL_RESOURCE_ATTRIBUTES loses some attributes, not
		// the service.
		otel.Handle(err)
	case err != nil:
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}

	t := &Telemetry{}
	if err := t.setupTracing(ctx, opts.SpanExporter, res); err != nil {
		return nil, err
	}
	if err := t.setupMetrics(res, logger, max(opts.MaxSeries, DefaultMaxSeries)); err != nil {
		_ = t.Shutdown(ctx)
		return nil, err
	}

	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetTracerProvider(t.TracerProvider)
	otel.SetMeterProvider(t.MeterProvider)
	return t, nil
}

// setupTracing builds the TracerProvider: a no-op one unless exp is non-nil or
// OTEL_TRACES_EXPORTER names an exporter other than "none".
func (t *Telemetry) setupTracing(ctx context.Context, exp sdktrace.SpanExporter, res *resource.Resource) error {
	if exp == nil {
		var err error
		if exp, err = spanExporter(ctx); err != nil {
			return err
		}
	}
	if exp == nil {
		t.TracerProvider = noop.NewTracerProvider()
		return nil
	}
	// Without a WithSampler option the SDK reads OTEL_TRACES_SAMPLER and
	// OTEL_TRACES_SAMPLER_ARG.
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
	)
	t.TracerProvider = tp
	t.Tracing = true
	t.shutdown = append(t.shutdown, tp.Shutdown)
	return nil
}

// setupMetrics builds the MeterProvider over a private Prometheus registry
// and the handler that serves it.
func (t *Telemetry) setupMetrics(res *resource.Resource, logger *slog.Logger, maxSeries int) error {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return fmt.Errorf("telemetry: register Go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return fmt.Errorf("telemetry: register process collector: %w", err)
	}
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		// Every series comes from this service: scope labels on each of
		// them would only add noise and cardinality.
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(
		sdkmetric.WithReader(exp),
		sdkmetric.WithResource(res),
		sdkmetric.WithCardinalityLimit(maxSeries),
		sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram, Unit: "s"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: LatencyBuckets}},
		)),
	)
	t.MeterProvider = mp
	t.shutdown = append(t.shutdown, mp.Shutdown)
	t.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		// Serve what could be gathered rather than nothing.
		ErrorHandling: promhttp.ContinueOnError,
		// Counts failed scrapes in promhttp_metric_handler_errors_total.
		Registry: reg,
	})
	return nil
}

// ObserveTenants registers the observable gauges ratelimiter.tenants.tracked
// and ratelimiter.tenants.index_entries, read from stats at each collection
// (each scrape of Metrics). stats must be safe to call from any goroutine and
// should be cheap. The gauges live until Shutdown.
func (t *Telemetry) ObserveTenants(stats func() (tenants, indexEntries int64)) error {
	m := t.MeterProvider.Meter(scope)
	tracked, err := m.Int64ObservableGauge("ratelimiter.tenants.tracked",
		metric.WithUnit("{tenant}"),
		metric.WithDescription("Requester tenants (IP addresses or IPv6 prefixes) whose state is held in memory."))
	if err != nil {
		return fmt.Errorf("telemetry: tenants gauge: %w", err)
	}
	entries, err := m.Int64ObservableGauge("ratelimiter.tenants.index_entries",
		metric.WithUnit("{entry}"),
		metric.WithDescription("Entries of the index that finds the tenants with the fewest permits left."))
	if err != nil {
		return fmt.Errorf("telemetry: index entries gauge: %w", err)
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		n, e := stats()
		o.ObserveInt64(tracked, n)
		o.ObserveInt64(entries, e)
		return nil
	}, tracked, entries)
	if err != nil {
		return fmt.Errorf("telemetry: tenants callback: %w", err)
	}
	return nil
}

// ObserveBackend registers the observable gauge ratelimiter.backend.up,
// labelled backend=name: 1 when up reports true at a collection (each
// scrape of Metrics), 0 when it reports false. up must be safe to call from
// any goroutine and should be cheap. The gauge lives until Shutdown.
func (t *Telemetry) ObserveBackend(name string, up func() bool) error {
	m := t.MeterProvider.Meter(scope)
	// No unit: "1" would make the Prometheus name end in _ratio.
	gauge, err := m.Int64ObservableGauge("ratelimiter.backend.up",
		metric.WithDescription("Whether the backend answers: 1 when it does, 0 when it does not (for Redis, after two health checks a second apart went unanswered)."))
	if err != nil {
		return fmt.Errorf("telemetry: backend gauge: %w", err)
	}
	attrs := metric.WithAttributeSet(attribute.NewSet(attribute.String("backend", name)))
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		v := int64(0)
		if up() {
			v = 1
		}
		o.ObserveInt64(gauge, v, attrs)
		return nil
	}, gauge)
	if err != nil {
		return fmt.Errorf("telemetry: backend callback: %w", err)
	}
	return nil
}

// Shutdown flushes pending spans and stops the providers, within ctx's
// deadline. It returns every error met, joined. The global providers stay
// installed but record nothing afterwards. Call it once, after the last
// request has been served.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		if err := f(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	t.shutdown = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: shutdown: %w", err)
	}
	return nil
}
