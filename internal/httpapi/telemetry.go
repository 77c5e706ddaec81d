package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	telemetrypkg "github.com/ratelimiter/ratelimiter/internal/telemetry"
)

const scope = "github.com/ratelimiter/ratelimiter/internal/httpapi"

// Attribute keys: OpenTelemetry's HTTP semantic conventions, and the
// labels of the decision counters.
const (
	keyMethod    = attribute.Key("http.request.method")
	keyRoute     = attribute.Key("http.route")
	keyStatus    = attribute.Key("http.response.status_code")
	keyOperation = attribute.Key("ratelimiter.operation")
	keyLimiter   = attribute.Key("limiter")
	keyResult    = attribute.Key("result")
	keyDegraded  = attribute.Key("degraded")
)

// tenantLimiter is the name of the per-IP limit in its RateLimit and
// RateLimit-Policy headers. Its decisions are counted under TenantLimiter.
const tenantLimiter = "tenant"

// commonStatuses get their duration attributes computed once per operation.
var commonStatuses = []int{200, 201, 204, 400, 401, 404, 405, 413, 415, 500, 503}

// telemetry holds the instruments of the API. Attribute sets are computed
// ahead of time so that recording allocates nothing.
type telemetry struct {
	tracer   trace.Tracer
	duration metric.Float64Histogram
	series   *series // the decision counters' counts

	// tracing is false under a no-op TracerProvider: requests then get
	// no span at all and their trace context is not even read, since no
	// span could ever carry it.
	tracing bool
}

// newTelemetry creates the instruments of the API; the decision counters
// label at most maxLimiters limiters by name.
func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider, maxLimiters int) (*telemetry, error) {
	m := mp.Meter(scope)
	_, off := tp.(noop.TracerProvider)
	t := &telemetry{tracer: tp.Tracer(scope), tracing: !off, series: newSeries(maxLimiters, time.Now)}
	var err error
	t.duration, err = m.Float64Histogram("http.server.request.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of HTTP server requests."),
		// Decisions take tens of microseconds: the default buckets, which
		// start at 5 ms, would put them all in the first one. Advised here
		// too, for meter providers other than the service's own.
		metric.WithExplicitBucketBoundaries(telemetrypkg.LatencyBuckets...))
	if err != nil {
		return nil, fmt.Errorf("httpapi: create http.server.request.duration: %w", err)
	}
	if err := t.series.register(m); err != nil {
		return nil, fmt.Errorf("httpapi: create the decision counters: %w", err)
	}
	return t, nil
}

// prepare computes the span options and duration attributes of op.
func (t *telemetry) prepare(op *operation) {
	op.attrs = []attribute.KeyValue{keyMethod.String(op.method), keyOperation.String(op.id)}
	if op.route != "" { // no route matched: see unknownOperation
		op.attrs = append(op.attrs, keyRoute.String(op.route))
	}
	op.startOpts = []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(keyMethod.String(op.method), keyRoute.String(op.route)),
	}
	op.durations = make(map[int][]metric.RecordOption, len(commonStatuses))
	for _, status := range commonStatuses {
		op.durations[status] = op.durationOpts(status)
	}
}

func (op *operation) durationOpts(status int) []metric.RecordOption {
	attrs := append(append([]attribute.KeyValue(nil), op.attrs...), keyStatus.Int(status))
	return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
}

// recorder sees what a request's handlers write, for observe.
type recorder struct {
	http.ResponseWriter
	status int
	op     *operation // set by admit once chi has routed the request
	span   trace.Span // set by startSpan
}

var recorders = sync.Pool{New: func() any { return new(recorder) }}

func (rec *recorder) WriteHeader(status int) {
	if rec.status == 0 {
		rec.status = status
	}
	rec.ResponseWriter.WriteHeader(status)
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return rec.ResponseWriter.Write(p)
}

// Unwrap gives http.ResponseController the underlying writer.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

// observe measures, traces and logs every request, and answers a panic
// with a 500 problem.
func (s *server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := recorders.Get().(*recorder)
		*rec = recorder{ResponseWriter: w}
		start := time.Now()
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.ErrorContext(r.Context(), "panic serving request", "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
				if rec.status == 0 {
					s.writeProblem(rec, r, &problem{status: http.StatusInternalServerError, detail: "internal error"})
				}
			}
			s.finish(rec, r, time.Since(start))
			*rec = recorder{}
			recorders.Put(rec)
		}()
		next.ServeHTTP(rec, r)
	})
}

// finish records what observe saw of a request.
func (s *server) finish(rec *recorder, r *http.Request, elapsed time.Duration) {
	status := rec.status
	if status == 0 {
		status = http.StatusOK // net/http's answer when nothing was written
	}
	ctx := r.Context()
	if span := rec.span; span != nil {
		if span.IsRecording() {
			span.SetAttributes(keyStatus.Int(status))
			if status >= 500 {
				span.SetStatus(codes.Error, http.StatusText(status))
			}
		}
		span.End()
	}
	op := rec.op
	if op == nil {
		op = s.unrouted(r)
	}
	opts, ok := op.durations[status]
	if !ok {
		opts = op.durationOpts(status)
	}
	s.tel.duration.Record(ctx, elapsed.Seconds(), opts...)
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.LogAttrs(ctx, slog.LevelDebug, "request",
			slog.String("operation", op.id), slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", status), slog.Duration("duration", elapsed))
	}
}

// startSpan is the strict middleware that starts the server span of an
// operation, named by its operationId, as a child of the W3C trace context
// the request carries. The handler gets the span's context, so the
// domain's spans nest under it; observe ends it once the answer is written.
func (s *server) startSpan(f gen.StrictHandlerFunc, operationID string) gen.StrictHandlerFunc {
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
		rec, _ := w.(*recorder)
		var op *operation
		if rec != nil {
			op = rec.op
		}
		if op == nil {
			op = s.byID[operationID]
		}
		ctx, span := s.serverSpan(ctx, r.Header, op)
		if span != nil {
			if rec == nil {
				defer span.End()
			} else {
				rec.span = span
			}
		}
		return f(ctx, w, r, request)
	}
}

// serverSpan starts the server span of operation op, a child of the W3C
// trace context in h, or returns ctx and nil when op gets none.
func (s *server) serverSpan(ctx context.Context, h http.Header, op *operation) (context.Context, trace.Span) {
	if op == nil || !op.traced || !s.tel.tracing {
		return ctx, nil
	}
	ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.HeaderCarrier(h))
	return s.tel.tracer.Start(ctx, op.id, op.startOpts...)
}
