package limiter

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// FailureMode decides acquisitions that a Store cannot answer because it is
// unavailable (a shared backend that is down or too slow).
type FailureMode uint8

const (
	// FailClosed denies them: no caller goes over a limit, at the price of
	// denying everyone while the store is down. It is the zero value.
	FailClosed FailureMode = iota
	// FailOpen grants them: callers keep working while the store is down,
	// at the price of not limiting them meanwhile.
	FailOpen
)

// String returns "fail-closed" or "fail-open".
func (m FailureMode) String() string {
	if m == FailOpen {
		return "fail-open"
	}
	return "fail-closed"
}

// ServiceOptions tune a Service. The zero value fails closed with no
// timeout of its own.
type ServiceOptions struct {
	// FailureMode decides acquisitions the store cannot answer. Either way
	// the Decision is Degraded, and whether the store took the permits is
	// unknown (see Decision.Degraded).
	FailureMode FailureMode
	// Timeout bounds each call to the store; zero leaves only the caller's
	// context. A store call that runs out of time is unavailable.
	Timeout time.Duration
	// OnUnavailable, when set, is called with the error of every store call
	// that failed with ErrUnavailable, before the Service answers. It must
	// be safe for concurrent use and quick, since outages make it hot.
	OnUnavailable func(err error)
	// TracerProvider gives the tracer of the Service's spans; nil means
	// OpenTelemetry's global provider.
	TracerProvider trace.TracerProvider
}

// Service is the entry point to named limiters: it validates input before it
// reaches the Store, so bad input never touches state, decides acquisitions
// by its FailureMode when the Store is unavailable, and traces each call as
// a child of the caller's span when that span is recording.
// It is safe for concurrent use.
type Service struct {
	store  Store
	opts   ServiceOptions
	tracer trace.Tracer
}

// NewService returns a Service over store with the zero ServiceOptions,
// tracing through OpenTelemetry's global tracer provider.
func NewService(store Store) *Service { return NewServiceWith(store, ServiceOptions{}) }

// NewServiceWith returns a Service over store tuned by opts.
func NewServiceWith(store Store, opts ServiceOptions) *Service {
	return &Service{store: store, opts: opts, tracer: opts.Tracer("github.com/ratelimiter/ratelimiter/internal/limiter")}
}

// bound and unavailable are the shared ServiceOptions.Bound and
// ServiceOptions.Unavailable, under short names for the call sites below.
func (s *Service) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return s.opts.Bound(ctx)
}

func (s *Service) unavailable(ctx context.Context, err error) bool {
	return s.opts.Unavailable(ctx, err)
}

// Put validates def and creates or replaces the limiter; see Store.Put,
// whose maximum number of limiters refuses a creation with an error
// wrapping ErrTooManyLimiters.
func (s *Service) Put(ctx context.Context, def Definition) (created bool, err error) {
	ctx, span := s.start(ctx, "limiter.Put", def.Name)
	defer func() { end(span, err) }()
	if err := CheckName(def.Name); err != nil {
		return false, fmt.Errorf("limiter: put: %w", err)
	}
	if err := def.Policy.Validate(); err != nil {
		return false, fmt.Errorf("limiter: put %q: %w", def.Name, err)
	}
	if err := CheckGroup(def.Group); err != nil {
		return false, fmt.Errorf("limiter: put %q: %w", def.Name, err)
	}
	if err := CheckKeyed(def); err != nil {
		return false, fmt.Errorf("limiter: put %q: %w", def.Name, err)
	}
	def = def.Normalize()
	sctx, cancel := s.bound(ctx)
	created, err = s.store.Put(sctx, def)
	cancel()
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
	sctx, cancel := s.bound(ctx)
	def, err = s.store.Get(sctx, name)
	cancel()
	if err != nil {
		return Definition{}, fmt.Errorf("limiter: get %q: %w", name, err)
	}
	return def, nil
}

// MaxList is the largest max List accepts: it bounds what one call reads
// from the store and holds in memory. The HTTP API's largest page, 1,000
// limiters, asks for one more to learn whether another page follows.
const MaxList = 10_000

// List returns up to max definitions whose names sort after `after`, in
// name order. max must be from 1 to MaxList, otherwise the error wraps
// ErrInvalidPageSize and the store is not consulted.
func (s *Service) List(ctx context.Context, after string, max int) (defs []Definition, err error) {
	ctx, span := s.start(ctx, "limiter.List", "")
	defer func() { end(span, err) }()
	if max < 1 || max > MaxList {
		return nil, fmt.Errorf("limiter: list: %w: must be between 1 and %d, got %d", ErrInvalidPageSize, MaxList, max)
	}
	sctx, cancel := s.bound(ctx)
	defs, err = s.store.List(sctx, after, max)
	cancel()
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
	sctx, cancel := s.bound(ctx)
	err = s.store.Delete(sctx, name)
	cancel()
	if err != nil {
		return fmt.Errorf("limiter: delete %q: %w", name, err)
	}
	return nil
}

// DeleteIdle deletes the named limiter only while it holds no counts, in
// one step with that check (see IdleDeleter); the error wraps ErrNotIdle
// when it holds some, and ErrNotFound when there is none.
func (s *Service) DeleteIdle(ctx context.Context, name string) (err error) {
	ctx, span := s.start(ctx, "limiter.DeleteIdle", name)
	defer func() { end(span, err) }()
	if err := CheckName(name); err != nil {
		return fmt.Errorf("limiter: delete: %w", err)
	}
	d, ok := s.store.(IdleDeleter)
	if !ok {
		return fmt.Errorf("limiter: delete %q: %w: the backend cannot delete only an idle limiter", name, ErrNotIdle)
	}
	sctx, cancel := s.bound(ctx)
	err = d.DeleteIdle(sctx, name)
	cancel()
	if err != nil {
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
	sctx, cancel := s.bound(ctx)
	d, err = s.store.Acquire(sctx, name, permits)
	cancel()
	if err != nil {
		if s.unavailable(ctx, err) {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.Bool("ratelimiter.degraded", true))
			return Degraded(permits, s.opts.FailureMode), nil
		}
		return Decision{}, fmt.Errorf("limiter: acquire %q: %w", name, err)
	}
	return d, nil
}

// Degraded is the decision on an acquisition of permits that the store could
// not answer, by mode. The store may still have taken the permits; see
// Decision.Degraded.
func Degraded(permits int64, mode FailureMode) Decision {
	return Decision{Allowed: mode == FailOpen, Permits: permits, Degraded: true}
}

// Available reports what the named limiter could grant now.
func (s *Service) Available(ctx context.Context, name string) (a Availability, err error) {
	ctx, span := s.start(ctx, "limiter.Available", name)
	defer func() { end(span, err) }()
	if err := CheckName(name); err != nil {
		return Availability{}, fmt.Errorf("limiter: available: %w", err)
	}
	sctx, cancel := s.bound(ctx)
	a, err = s.store.Available(sctx, name)
	cancel()
	if err != nil {
		return Availability{}, fmt.Errorf("limiter: available %q: %w", name, err)
	}
	return a, nil
}

// start begins a child span of the caller's span (see StartSpan), naming
// the limiter when there is one.
func (s *Service) start(ctx context.Context, op, name string) (context.Context, trace.Span) {
	ctx, span := StartSpan(ctx, s.tracer, op)
	if name != "" && span.IsRecording() {
		span.SetAttributes(attribute.String("ratelimiter.limiter", name))
	}
	return ctx, span
}

// end is EndSpan.
func end(span trace.Span, err error) { EndSpan(span, err) }
