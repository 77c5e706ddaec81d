package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// AcquireBatch decides many acquisitions, each on its own. The spec has
// already refused a body with any invalid acquisition, so that a batch is
// decided whole or not at all; the checks here only keep the domain's word.
func (s *server) AcquireBatch(ctx context.Context, req gen.AcquireBatchRequestObject) (gen.AcquireBatchResponseObject, error) {
	bt, checked := batchOf(ctx)
	if !checked { // validated by kin-openapi, not by validateFast
		if req.Body == nil {
			return nil, invalid("body", "is required")
		}
		bt = &batch{reqs: make([]limiter.Request, len(req.Body.Acquisitions))}
		for i, it := range req.Body.Acquisitions {
			bt.reqs[i] = limiter.Request{Name: it.Limiter, Permits: 1}
			if it.Permits != nil {
				bt.reqs[i].Permits = *it.Permits
			}
			if it.Key != nil {
				bt.reqs[i].Key = *it.Key
			}
		}
	}
	reqs := bt.reqs
	var errs []gen.FieldError
	for i := range reqs {
		if err := limiter.CheckName(reqs[i].Name); err != nil {
			errs = append(errs, gen.FieldError{Location: fmt.Sprintf("body.acquisitions.%d.limiter", i), Message: reason(err, limiter.ErrInvalidName)})
		}
		if err := limiter.CheckPermits(reqs[i].Permits); err != nil {
			errs = append(errs, gen.FieldError{Location: fmt.Sprintf("body.acquisitions.%d.permits", i), Message: reason(err, limiter.ErrInvalidPermits)})
		}
		if reqs[i].Key != "" {
			if err := limiter.CheckKey(reqs[i].Key); err != nil {
				errs = append(errs, gen.FieldError{Location: fmt.Sprintf("body.acquisitions.%d.key", i), Message: reason(err, limiter.ErrInvalidKey)})
			}
		}
	}
	if errs != nil {
		return nil, invalidAll(errs)
	}
	bt.results = slices.Grow(bt.results[:0], len(reqs))[:len(reqs)]
	out := bt.results
	if err := s.limiters.AcquireBatch(ctx, reqs, out); err != nil {
		return nil, err
	}
	a := &batchAnswer{batch: bt, pooled: checked}
	for i, r := range out {
		if r.Err != nil {
			if a.problems == nil {
				a.problems = make(map[int]*gen.Problem)
			}
			a.problems[i] = s.itemProblem(ctx, reqs[i].Name, r.Err)
		}
	}
	s.tel.decidedBatch(reqs, out)
	return a, nil
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
	case errors.Is(err, limiter.ErrKeyMismatch):
		status, detail = http.StatusBadRequest, strings.TrimPrefix(reason(err, limiter.ErrKeyMismatch), limiter.ErrKeyMismatch.Error()+": ")+"."
	default:
		s.log.ErrorContext(ctx, "batch acquisition failed", "limiter", name, "error", err)
	}
	return &gen.Problem{Type: "about:blank", Title: http.StatusText(status), Status: int32(status), Detail: &detail}
}
