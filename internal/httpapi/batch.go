package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// AcquireBatch decides many acquisitions, each on its own. The spec has
// already refused a body with any invalid acquisition, so that a batch is
// decided whole or not at all; the checks here only keep the domain's word.
func (s *server) AcquireBatch(ctx context.Context, req gen.AcquireBatchRequestObject) (gen.AcquireBatchResponseObject, error) {
	if req.Body == nil {
		return nil, invalid("body", "is required")
	}
	items := req.Body.Acquisitions
	reqs := make([]limiter.Request, len(items))
	var errs []gen.FieldError
	for i, it := range items {
		reqs[i] = limiter.Request{Name: it.Limiter, Permits: 1}
		if it.Permits != nil {
			reqs[i].Permits = *it.Permits
		}
		where := fmt.Sprintf("body.acquisitions.%d.", i)
		if err := limiter.CheckName(reqs[i].Name); err != nil {
			errs = append(errs, gen.FieldError{Location: where + "limiter", Message: reason(err, limiter.ErrInvalidName)})
		}
		if err := limiter.CheckPermits(reqs[i].Permits); err != nil {
			errs = append(errs, gen.FieldError{Location: where + "permits", Message: reason(err, limiter.ErrInvalidPermits)})
		}
	}
	if errs != nil {
		return nil, invalidAll(errs)
	}
	out, err := s.limiters.AcquireBatch(ctx, reqs)
	if err != nil {
		return nil, err
	}
	results := make([]gen.BatchResult, len(out))
	for i, r := range out {
		name := reqs[i].Name
		results[i].Limiter = name
		if r.Err != nil {
			p := s.itemProblem(ctx, name, r.Err)
			results[i].Status = int32(p.Status)
			results[i].Problem = p
			continue
		}
		s.tel.decided(ctx, name, r.Decision)
		d := decisionOf(r.Decision)
		results[i].Status = http.StatusOK
		results[i].Decision = &d
	}
	return gen.AcquireBatch200JSONResponse{Results: results}, nil
}

// itemProblem is the problem of one acquisition of a batch that failed: what
// problemFor answers the same acquisition made alone. Invalid input never
// gets here: AcquireBatch refuses the whole batch first.
func (s *server) itemProblem(ctx context.Context, name string, err error) *gen.Problem {
	status, detail := http.StatusInternalServerError, "internal error"
	switch {
	case errors.Is(err, limiter.ErrNotFound):
		status, detail = http.StatusNotFound, fmt.Sprintf("Limiter %q does not exist.", name)
	case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		status, detail = http.StatusServiceUnavailable, "The request was cancelled or timed out."
	case errors.Is(err, limiter.ErrUnavailable):
		status, detail = http.StatusServiceUnavailable, "The limiter backend is unavailable."
	default:
		s.log.ErrorContext(ctx, "batch acquisition failed", "limiter", name, "error", err)
	}
	return &gen.Problem{Type: "about:blank", Title: http.StatusText(status), Status: int32(status), Detail: &detail}
}

// decisionOf is the generated model of a decision: the JSON of a batch
// result, and the reference for the hand-written answers of acquire.
func decisionOf(d limiter.Decision) gen.Decision {
	out := gen.Decision{
		Allowed:         d.Allowed,
		Permits:         d.Permits,
		Remaining:       d.Remaining,
		Limit:           d.Limit,
		ResetAfterMs:    millis(d.ResetAfter),
		ExceedsCapacity: d.ExceedsCapacity,
	}
	if !d.Allowed && !d.ExceedsCapacity && d.RetryAfter > 0 {
		retry := millis(d.RetryAfter)
		out.RetryAfterMs = &retry
	}
	if d.Degraded {
		degraded := true
		out.Degraded = &degraded
	}
	return out
}
