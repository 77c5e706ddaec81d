package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Reserve takes permits from several limiters, all or nothing, and holds
// them as a reservation to settle later.
func (s *server) Reserve(ctx context.Context, req gen.ReserveRequestObject) (gen.ReserveResponseObject, error) {
	if req.Body == nil {
		return nil, invalid("body", "is required")
	}
	var ttl time.Duration
	if req.Body.TTL != nil {
		d, err := time.ParseDuration(*req.Body.TTL)
		if err != nil || d < time.Millisecond || d > limiter.MaxReservationTTL {
			return nil, rejected("body.ttl", fmt.Sprintf("must be a duration from 1ms to %s, such as 2m, got %q", limiter.MaxReservationTTL, *req.Body.TTL))
		}
		ttl = d
	}
	items := make([]limiter.Item, len(req.Body.Items))
	for i, it := range req.Body.Items {
		items[i] = limiter.Item{Name: it.Limiter, Permits: 1}
		if it.Permits != nil {
			items[i].Permits = *it.Permits
		}
		if it.Key != nil {
			items[i].Key = *it.Key
		}
	}
	once := ""
	if req.Params.IdempotencyKey != nil {
		once = *req.Params.IdempotencyKey
	}
	v, err := s.limiters.Reserve(ctx, items, ttl, once)
	if err != nil {
		return nil, reservationProblem(err)
	}
	if !v.Replayed {
		for _, c := range v.Checks {
			s.tel.decided(c.Name, limiter.Decision{Permits: c.Permits, Allowed: v.Allowed, Degraded: v.Degraded})
		}
	}
	return s.verdictAnswer(ctx, v), nil
}

// SettleReservation settles a reservation to what was spent.
func (s *server) SettleReservation(ctx context.Context, req gen.SettleReservationRequestObject) (gen.SettleReservationResponseObject, error) {
	if req.Body == nil {
		return nil, invalid("body", "is required")
	}
	actual := make([]limiter.Item, len(req.Body.Items))
	for i, it := range req.Body.Items {
		actual[i] = limiter.Item{Name: it.Limiter, Permits: it.Permits}
		if it.Key != nil {
			actual[i].Key = *it.Key
		}
	}
	once := ""
	if req.Params.IdempotencyKey != nil {
		once = *req.Params.IdempotencyKey
	}
	v, err := s.limiters.Settle(ctx, req.ID, actual, once)
	if err != nil {
		return nil, reservationProblem(err)
	}
	return s.verdictAnswer(ctx, v), nil
}

// CancelReservation gives back everything a reservation holds.
func (s *server) CancelReservation(ctx context.Context, req gen.CancelReservationRequestObject) (gen.CancelReservationResponseObject, error) {
	v, err := s.limiters.Settle(ctx, req.ID, nil, "")
	if err != nil {
		return nil, reservationProblem(err)
	}
	return s.verdictAnswer(ctx, v), nil
}

// reservationProblem is the problem of a reservation the domain refused:
// those only reservations meet, then those of any decision.
func reservationProblem(err error) error {
	switch {
	case errors.Is(err, limiter.ErrReservationNotFound):
		return &problem{status: http.StatusNotFound, detail: "The reservation does not exist: it was settled or cancelled, or its TTL has passed."}
	case errors.Is(err, limiter.ErrInvalidReservation):
		return rejected("body.items", reason(err, limiter.ErrInvalidReservation))
	case errors.Is(err, limiter.ErrTooManyReservations):
		return &problem{status: http.StatusServiceUnavailable, detail: "The server holds as many reservations as it can; retry later, or decide without one."}
	}
	return decideProblem(err)
}
