package forwardauth

import (
	"context"
	"errors"
	"fmt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Decider decides items together, all or nothing; *limiter.Service is
// one.
type Decider interface {
	Decide(ctx context.Context, items []limiter.Item, mode limiter.Mode, once string) (limiter.Verdict, error)
}

// Service decides the requests proxies ask about. It is safe for
// concurrent use.
type Service struct {
	cfg      Config
	limiters Decider
	// failOpen is the answer when deciding fails other than by the
	// backend's failure mode, which the Decider applies itself.
	failOpen bool
}

// NewService returns a Service deciding by cfg, which must have passed
// Check, through limiters. failOpen says what a decision that fails
// answers (see Answer.Failed).
func NewService(cfg Config, limiters Decider, failOpen bool) *Service {
	return &Service{cfg: cfg, limiters: limiters, failOpen: failOpen}
}

// Config returns the configuration s decides by.
func (s *Service) Config() Config { return s.cfg }

// Answer is the decision on one request.
type Answer struct {
	// Allowed says whether the request may pass.
	Allowed bool
	// Items are what it was charged, one per rule it matched; none when
	// it matched none.
	Items []limiter.Item
	// Verdict is the decision on Items, when there are any.
	Verdict limiter.Verdict
	// Failed is the error of a decision that could not be made: Allowed
	// then follows the failure mode, as it does for a Degraded verdict.
	Failed error
	// Refused is why a request was denied before any decision, whatever
	// the failure mode: its path, which a rule matches by, is refused
	// (ErrPath).
	Refused error
}

// Degraded reports an answer made without the backend: Allowed then
// follows the failure mode.
func (a Answer) Degraded() bool { return a.Failed != nil || a.Verdict.Degraded }

// Decide decides req: allowed when it matches no rule (denied with
// Config.DenyUnmatched), otherwise as its items are decided together;
// denied, charging nothing, when its path is refused (Answer.Refused).
// The error is that of a request that cannot be decided at all: one
// wrapping ErrNoClient.
func (s *Service) Decide(ctx context.Context, req Request) (Answer, error) {
	items, err := s.cfg.Items(req)
	if errors.Is(err, ErrPath) {
		return Answer{Refused: err}, nil
	}
	if err != nil {
		return Answer{}, err
	}
	if len(items) == 0 {
		return Answer{Allowed: !s.cfg.DenyUnmatched}, nil
	}
	v, err := s.limiters.Decide(ctx, items, limiter.Take, "")
	if err != nil {
		return Answer{Allowed: s.failOpen, Items: items, Failed: fmt.Errorf("forwardauth: %w", err)}, nil
	}
	return Answer{Allowed: v.Allowed, Items: items, Verdict: v}, nil
}
