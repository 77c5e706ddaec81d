package limiter

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Service is the entry point to named limiters: it validates input before it
// reaches the Store, so bad input never touches state, and traces each call
// as a child of the caller's span when that span is recording.
// It is safe for concurrent use.
type Service struct {
	store  Store
	tracer trace.Tracer
}

// NewService returns a Service over store, tracing through the global
// OpenTelemetry tracer provider.
func NewService(store Store) *Service {
	return &Service{store: store, tracer: otel.Tracer("github.com/ratelimiter/ratelimiter/internal/limiter")}
}

// Put validates def and creates or replaces the limiter; see Store.Put.
func (s *Service) Put(ctx context.Context, def Definition) (created bool, err error) {
	ctx, span := s.start(ctx, "limiter.Put", def.Name)
	defer func() { end(span, err) }()
	if err := CheckName(def.Name); err != nil {
		return false, fmt.Errorf("limiter: put: %w", err)
	}
	if err := def.Policy.Validate(); err != nil {
		return false, fmt.Errorf("limiter: put %q: %w", def.Name, err)
	}
	def.Policy = def.Policy.Normalize()
	created, err = s.store.Put(ctx, def)
	if err != nil {
		return false, fmt.Errorf("limiter: put %q: %w", def.Name, err)
	}
	return created, nil
}

// Get returns the named limiter's definition.
func (s *Service) Get(ctx context.Context, name string) (def Definition, err error) {
	ctx, span := s.start(ctx, "limiter.Get", name)
	defer func() { end(span, err) }()
	if err := CheckName(name); err != nil {
		return Definition{}, fmt.Errorf("limiter: get: %w", err)
	}
	def, err = s.store.Get(ctx, name)
	if err != nil {
		return Definition{}, fmt.Errorf("limiter: get %q: %w", name, err)
	}
	return def, nil
}

// List returns up to max definitions whose names sort after `after`.
func (s *Service) List(ctx context.Context, after string, max int) (defs []Definition, err error) {
	ctx, span := s.start(ctx, "limiter.List", "")
	defer func() { end(span, err) }()
	defs, err = s.store.List(ctx, after, max)
	if err != nil {
		return nil, fmt.Errorf("limiter: list: %w", err)
	}
	return defs, nil
}

// Delete removes the named limiter.
func (s *Service) Delete(ctx context.Context, name string) (err error) {
	ctx, span := s.start(ctx, "limiter.Delete", name)
	defer func() { end(span, err) }()
	if err := CheckName(name); err != nil {
		return fmt.Errorf("limiter: delete: %w", err)
	}
	if err := s.store.Delete(ctx, name); err != nil {
		return fmt.Errorf("limiter: delete %q: %w", name, err)
	}
	return nil
}

// Acquire takes permits from the named limiter, all or nothing. Invalid
// names and permit counts are rejected before the store is consulted.
func (s *Service) Acquire(ctx context.Context, name string, permits int64) (d Decision, err error) {
	ctx, span := s.start(ctx, "limiter.Acquire", name)
	defer func() {
		if err == nil && span.IsRecording() {
			span.SetAttributes(attribute.Int64("ratelimiter.permits", permits), attribute.Bool("ratelimiter.allowed", d.Allowed), attribute.Int64("ratelimiter.remaining", d.Remaining))
		}
		end(span, err)
	}()
	if err := CheckName(name); err != nil {
		return Decision{}, fmt.Errorf("limiter: acquire: %w", err)
	}
	if err := CheckPermits(permits); err != nil {
		return Decision{}, fmt.Errorf("limiter: acquire %q: %w", name, err)
	}
	d, err = s.store.Acquire(ctx, name, permits)
	if err != nil {
		return Decision{}, fmt.Errorf("limiter: acquire %q: %w", name, err)
	}
	return d, nil
}

// Available reports what the named limiter could grant now.
func (s *Service) Available(ctx context.Context, name string) (a Availability, err error) {
	ctx, span := s.start(ctx, "limiter.Available", name)
	defer func() { end(span, err) }()
	if err := CheckName(name); err != nil {
		return Availability{}, fmt.Errorf("limiter: available: %w", err)
	}
	a, err = s.store.Available(ctx, name)
	if err != nil {
		return Availability{}, fmt.Errorf("limiter: available %q: %w", name, err)
	}
	return a, nil
}

// start begins a child span of the caller's span. When the caller's span is
// not recording (tracing is off, or this trace is not sampled) no span is
// started at all: the call then costs nothing, not even an allocation.
func (s *Service) start(ctx context.Context, op, name string) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, noSpan
	}
	ctx, span := s.tracer.Start(ctx, op)
	if name != "" {
		span.SetAttributes(attribute.String("ratelimiter.limiter", name))
	}
	return ctx, span
}

// noSpan is a span that records nothing and whose End does nothing.
var noSpan = trace.SpanFromContext(context.Background())

func end(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
