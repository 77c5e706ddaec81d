package limiter

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// MaxBatch is the most acquisitions one call to AcquireBatch decides.
const MaxBatch = 1000

// Request is one acquisition of a batch: Permits from the limiter Name, or
// from its key Key when it is keyed.
type Request struct {
	Name    string
	Key     string
	Permits int64
}

// Result is the outcome of one Request: its Decision (and for a key, its
// KeysFull, as KeyDecision has it), or the error the same acquisition made
// alone would have returned (Decision is then zero).
type Result struct {
	Decision Decision
	KeysFull bool
	Err      error
}

// BatchStore is a Store that decides many acquisitions in one round trip to
// its backend. A Service asks any other Store once per acquisition.
type BatchStore interface {
	Store
	// AcquireBatch decides each reqs[i] into out[i] as Acquire would, each
	// on its own: the batch is not atomic, and one request's failure does
	// not fail the others. Requests on one limiter are decided in the order
	// given. len(out) == len(reqs), and every request is valid (CheckName,
	// CheckPermits, and CheckKey when it names a key). A request with a key
	// is decided as AcquireKey would, one without as Acquire would, and
	// each fails with ErrKeyMismatch where its limiter says otherwise.
	AcquireBatch(ctx context.Context, reqs []Request, out []Result)
}

// AcquireBatch decides up to MaxBatch independent acquisitions, each all or
// nothing, into out: out[i] is the result of reqs[i], and out must be as
// long as reqs. The caller owns out, so that a server can reuse it from one
// batch to the next. An invalid request fails on its own result and
// reaches no store; the others are decided. Requests on one limiter are
// decided in the order given. Results the store could not give are decided
// by the FailureMode, as Acquire decides them. The error is for the batch
// as a whole, and leaves out unset: it wraps ErrInvalidBatch when reqs is
// empty or longer than MaxBatch.
func (s *Service) AcquireBatch(ctx context.Context, reqs []Request, out []Result) (err error) {
	ctx, span := s.start(ctx, "limiter.AcquireBatch", "")
	defer func() { end(span, err) }()
	if len(reqs) == 0 || len(reqs) > MaxBatch {
		return fmt.Errorf("limiter: acquire batch: %w: %d acquisitions, want 1 to %d", ErrInvalidBatch, len(reqs), MaxBatch)
	}
	if len(out) != len(reqs) {
		return fmt.Errorf("limiter: acquire batch: %d results for %d acquisitions", len(out), len(reqs))
	}
	span.SetAttributes(attribute.Int("ratelimiter.batch_size", len(reqs)))
	clear(out)
	// The store sees only the valid requests, in order; index maps them
	// back to reqs. Usually every one is valid, and the store decides reqs
	// into out as they are.
	valid, results, index := reqs, out, []int(nil)
	for i, r := range reqs {
		err := CheckName(r.Name)
		if err == nil {
			err = CheckPermits(r.Permits)
		}
		if err == nil && r.Key != "" {
			err = CheckKey(r.Key)
		}
		if err == nil {
			if index != nil {
				valid = append(valid, r)
				index = append(index, i)
			}
			continue
		}
		if index == nil {
			// The first invalid request: the valid ones so far are reqs[:i].
			valid = append(make([]Request, 0, len(reqs)), reqs[:i]...)
			index = make([]int, i, len(reqs))
			for j := range index {
				index[j] = j
			}
		}
		out[i].Err = fmt.Errorf("limiter: acquire %q: %w", truncate(r.Name, MaxNameLen+1), err)
	}
	if len(valid) == 0 {
		return nil
	}
	if index != nil {
		results = make([]Result, len(valid))
	}
	sctx, cancel := s.bound(ctx)
	if bs, ok := s.store.(BatchStore); ok {
		bs.AcquireBatch(sctx, valid, results)
	} else {
		for i, r := range valid {
			if r.Key == "" {
				results[i].Decision, results[i].Err = s.store.Acquire(sctx, r.Name, r.Permits)
				continue
			}
			d, err := s.store.AcquireKey(sctx, r.Name, r.Key, r.Permits)
			results[i] = Result{Decision: d.Decision, KeysFull: d.KeysFull, Err: err}
		}
	}
	cancel()
	degraded := 0
	for i := range results {
		r := &results[i]
		switch {
		case r.Err == nil:
		case s.unavailable(ctx, r.Err):
			*r = Result{Decision: Degraded(valid[i].Permits, s.opts.FailureMode)}
			degraded++
		default:
			r.Err = fmt.Errorf("limiter: acquire %q: %w", valid[i].Name, r.Err)
		}
	}
	if degraded > 0 {
		span.SetStatus(codes.Error, "decided without the store")
		span.SetAttributes(attribute.Int("ratelimiter.degraded", degraded))
	}
	for j, i := range index {
		out[i] = results[j]
	}
	return nil
}
