package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/ratelimitheader"
)

// Decide takes permits from several limiters, all or nothing.
func (s *server) Decide(ctx context.Context, req gen.DecideRequestObject) (gen.DecideResponseObject, error) {
	a, err := s.decide(ctx, req.Body, limiter.Take, req.Params.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Peek answers what Decide would, taking nothing.
func (s *server) Peek(ctx context.Context, req gen.PeekRequestObject) (gen.PeekResponseObject, error) {
	a, err := s.decide(ctx, req.Body, limiter.Peek, nil)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Charge records permits already spent, fitting or not.
func (s *server) Charge(ctx context.Context, req gen.ChargeRequestObject) (gen.ChargeResponseObject, error) {
	a, err := s.decide(ctx, req.Body, limiter.Charge, req.Params.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Refund gives permits back.
func (s *server) Refund(ctx context.Context, req gen.RefundRequestObject) (gen.RefundResponseObject, error) {
	a, err := s.decide(ctx, req.Body, limiter.Refund, req.Params.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	return a, nil
}

func (s *server) decide(ctx context.Context, body *gen.DecideRequest, mode limiter.Mode, onceKey *string) (*verdictAnswer, error) {
	items, checked := itemsOf(ctx)
	if !checked { // validated by kin-openapi, not by validateFast
		if body == nil {
			return nil, invalid("body", "is required")
		}
		items = make([]limiter.Item, len(body.Items))
		for i, it := range body.Items {
			items[i] = limiter.Item{Name: it.Limiter, Permits: 1}
			if it.Permits != nil {
				items[i].Permits = *it.Permits
			}
			if it.Key != nil {
				items[i].Key = *it.Key
			}
		}
	}
	once := ""
	if onceKey != nil {
		once = *onceKey
	}
	v, err := s.limiters.Decide(ctx, items, mode, once)
	if err != nil {
		return nil, decideProblem(err)
	}
	if mode == limiter.Take && !v.Replayed {
		for _, c := range v.Checks {
			s.tel.decided(c.Name, limiter.Decision{Permits: c.Permits, Allowed: v.Allowed, Degraded: v.Degraded})
		}
	}
	return s.verdictAnswer(ctx, v), nil
}

// verdictAnswer is the answer to v, with the rate-limit headers of its
// limiters unless it is degraded.
func (s *server) verdictAnswer(ctx context.Context, v limiter.Verdict) *verdictAnswer {
	a := &verdictAnswer{v: v}
	if !v.Degraded {
		a.policy, a.rateLimit = s.verdictHeaders(ctx, v)
	}
	return a
}

// verdictHeaders returns the RateLimit-Policy and RateLimit values of v's
// limiters: one entry per limiter, in the order of the items, written on
// the stack and copied out once.
func (s *server) verdictHeaders(ctx context.Context, v limiter.Verdict) (policy, rateLimit string) {
	var pb, rb [512]byte
	p, r := pb[:0], rb[:0]
	for i, c := range v.Checks {
		if slices.ContainsFunc(v.Checks[:i], func(o limiter.Check) bool { return o.Name == c.Name }) {
			continue
		}
		if len(p) > 0 {
			p, r = append(p, ", "...), append(r, ", "...)
		}
		p = append(p, s.policyOf(ctx, c.Name, c.Limit)...)
		r = ratelimitheader.AppendValue(r, c.Name, c.Remaining, c.ResetAfter)
	}
	return string(p), string(r)
}

// decideProblem is the problem of a decision the domain refused: the ones
// only a decision meets, worded for its body; problemFor words the rest.
func decideProblem(err error) error {
	var missing *limiter.MissingError
	switch {
	case errors.As(err, &missing):
		return &problem{status: http.StatusNotFound, detail: fmt.Sprintf("Limiter %q does not exist.", missing.Name)}
	case errors.Is(err, limiter.ErrCrossGroup):
		return rejected("body.items", reason(err, limiter.ErrCrossGroup))
	case errors.Is(err, limiter.ErrInvalidItems):
		return rejected("body.items", reason(err, limiter.ErrInvalidItems))
	case errors.Is(err, limiter.ErrInvalidName):
		return rejected("body.items", reason(err, limiter.ErrInvalidName))
	case errors.Is(err, limiter.ErrInvalidPermits):
		return rejected("body.items", reason(err, limiter.ErrInvalidPermits))
	case errors.Is(err, limiter.ErrInvalidKey):
		return rejected("body.items", reason(err, limiter.ErrInvalidKey))
	case errors.Is(err, limiter.ErrKeyMismatch):
		return rejected("body.items", strings.TrimPrefix(reason(err, limiter.ErrKeyMismatch), limiter.ErrKeyMismatch.Error()+": "))
	case errors.Is(err, limiter.ErrInvalidOnceKey):
		return rejected("header.Idempotency-Key", reason(err, limiter.ErrInvalidOnceKey))
	case errors.Is(err, limiter.ErrOnceMismatch):
		return &problem{status: http.StatusUnprocessableEntity, detail: "The Idempotency-Key was already used for a request with another body; use a new key for a new request."}
	case errors.Is(err, limiter.ErrTooManyOnce):
		return &problem{status: http.StatusServiceUnavailable, detail: "The server remembers as many idempotency keys as it can; retry later, or without a key."}
	}
	return err
}

// verdictAnswer is the 200 answer of decide and peek.
type verdictAnswer struct {
	v         limiter.Verdict
	policy    string // RateLimit-Policy, empty when degraded
	rateLimit string // RateLimit, empty when degraded
}

var (
	_ gen.DecideResponseObject = (*verdictAnswer)(nil)
	_ gen.PeekResponseObject   = (*verdictAnswer)(nil)
	_ gen.ChargeResponseObject = (*verdictAnswer)(nil)
	_ gen.RefundResponseObject = (*verdictAnswer)(nil)

	_ gen.ReserveResponseObject           = (*verdictAnswer)(nil)
	_ gen.SettleReservationResponseObject = (*verdictAnswer)(nil)
	_ gen.CancelReservationResponseObject = (*verdictAnswer)(nil)
)

func (a *verdictAnswer) VisitDecideResponse(w http.ResponseWriter) error { return a.write(w) }
func (a *verdictAnswer) VisitPeekResponse(w http.ResponseWriter) error   { return a.write(w) }
func (a *verdictAnswer) VisitChargeResponse(w http.ResponseWriter) error { return a.write(w) }
func (a *verdictAnswer) VisitRefundResponse(w http.ResponseWriter) error { return a.write(w) }
func (a *verdictAnswer) VisitReserveResponse(w http.ResponseWriter) error {
	return a.write(w)
}
func (a *verdictAnswer) VisitSettleReservationResponse(w http.ResponseWriter) error {
	return a.write(w)
}
func (a *verdictAnswer) VisitCancelReservationResponse(w http.ResponseWriter) error {
	return a.write(w)
}

// write writes the Verdict by hand, as the generated code would
// (TestVerdictAnswerMatchesGenerated), without its reflection.
func (a *verdictAnswer) write(w http.ResponseWriter) error {
	v := a.v
	buf := buffers.Get().(*[]byte)
	defer buffers.Put(buf)
	b := append((*buf)[:0], `{"allowed":`...)
	b = strconv.AppendBool(b, v.Allowed)
	if v.Degraded {
		b = append(b, `,"degraded":true`...)
	}
	b = append(b, `,"exceeds_capacity":`...)
	b = strconv.AppendBool(b, v.ExceedsCapacity)
	b = append(b, `,"items":[`...)
	for i, c := range v.Checks {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"exceeds_capacity":`...)
		b = strconv.AppendBool(b, c.ExceedsCapacity)
		b = append(b, `,"fits":`...)
		b = strconv.AppendBool(b, c.Fits)
		if c.Key != "" {
			b = append(b, `,"key":`...)
			b = appendJSONString(b, c.Key)
		}
		if c.KeysFull {
			b = append(b, `,"keys_full":true`...)
		}
		b = append(b, `,"limit":`...)
		b = strconv.AppendInt(b, c.Limit, 10)
		b = append(b, `,"limiter":`...)
		b = appendJSONString(b, c.Name)
		b = append(b, `,"permits":`...)
		b = strconv.AppendInt(b, c.Permits, 10)
		b = append(b, `,"remaining":`...)
		b = strconv.AppendInt(b, c.Remaining, 10)
		b = append(b, `,"reset_after_ms":`...)
		b = strconv.AppendInt(b, millis(c.ResetAfter), 10)
		if !c.Fits && !c.ExceedsCapacity && !v.Degraded {
			b = append(b, `,"retry_after_ms":`...)
			b = strconv.AppendInt(b, millis(c.RetryAfter), 10)
		}
		b = append(b, '}')
	}
	b = append(b, ']')
	if v.Replayed {
		b = append(b, `,"replayed":true`...)
	}
	if v.Reservation != "" {
		b = append(b, `,"reservation":`...)
		b = appendJSONString(b, v.Reservation)
	}
	retry := !v.Allowed && !v.ExceedsCapacity && !v.Degraded
	if retry {
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, millis(v.RetryAfter), 10)
	}
	b = append(b, "}\n"...)
	if cap(b) <= maxPooledAnswer {
		*buf = b
	}

	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	h["Content-Length"] = []string{strconv.Itoa(len(b))}
	if a.policy != "" {
		h[hdrPolicy] = []string{a.policy}
		h[hdrRateLimit] = []string{a.rateLimit}
	}
	if retry {
		h[hdrRetryAfter] = []string{strconv.FormatInt(*retryAfter(v.RetryAfter), 10)}
	}
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(b)
	return err
}
