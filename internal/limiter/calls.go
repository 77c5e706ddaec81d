package limiter

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// What every call of a service over a backend shares, whichever backend it
// is: limiter.Service over a Store, and the tenant package's Service over
// its Backend. One implementation, so that both bound, report and trace
// their calls alike.

// Bound applies o.Timeout to the context of one backend call. With no
// Timeout it returns ctx itself and a cancel func that does nothing.
func (o ServiceOptions) Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if o.Timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, o.Timeout)
}

// Unavailable reports whether err, from a backend call made under the
// caller's ctx, is the backend's unavailability (it wraps ErrUnavailable
// and the caller is still waiting), calling o.OnUnavailable with it when it
// is.
func (o ServiceOptions) Unavailable(ctx context.Context, err error) bool {
	// A caller that went away cut the call short, not the backend: there
	// is no one to answer and no outage to report.
	if !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
		return false
	}
	if o.OnUnavailable != nil {
		o.OnUnavailable(err)
	}
	return true
}

// Tracer returns the tracer named name (the instrumenting package) from
// o.TracerProvider, or from OpenTelemetry's global provider when it is nil.
func (o ServiceOptions) Tracer(name string) trace.Tracer {
	if o.TracerProvider == nil {
		return otel.Tracer(name)
	}
	return o.TracerProvider.Tracer(name)
}

// StartSpan begins a span named op with tracer, as a child of the caller's
// span in ctx, and returns the context that carries it. When the caller's
// span is not recording (tracing is off, or this trace is not sampled) it
// starts none and returns ctx and a span that records nothing: the call
// then costs nothing, not even an allocation.
func StartSpan(ctx context.Context, tracer trace.Tracer, op string) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, noSpan
	}
	return tracer.Start(ctx, op)
}

// noSpan is a span that records nothing and whose End does nothing.
var noSpan = trace.SpanFromContext(context.Background())

// EndSpan ends span, with an Error status carrying err's text when err is
// not nil. Span status is for operators, never shown to a client.
func EndSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
