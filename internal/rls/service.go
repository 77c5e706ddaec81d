package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Bounds of one request, beyond which it is refused with INVALID_ARGUMENT
// before anything is decided.
const (
	// MaxDescriptors is the most descriptors a request holds: the most
	// items of one joint decision.
	MaxDescriptors = limiter.MaxItems
	// MaxEntries is the most entries a descriptor holds.
	MaxEntries = 16
	// MaxEntryBytes bounds an entry's key and value, each.
	MaxEntryBytes = 4096
)

// Limiters is what the service needs of the limiters: limiter.Service.
type Limiters interface {
	Decide(ctx context.Context, items []limiter.Item, mode limiter.Mode, once string) (limiter.Verdict, error)
	Put(ctx context.Context, def limiter.Definition) (bool, error)
}

// Service implements RateLimitService on the limiters, with the rules of a
// Config that can be replaced at any time.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	limiters Limiters
	config   atomic.Pointer[Config]
	logger   *slog.Logger
}

// NewService returns the service of the limiters, deciding by cfg.
func NewService(limiters Limiters, cfg *Config, logger *slog.Logger) *Service {
	s := &Service{limiters: limiters, logger: logger}
	s.config.Store(cfg)
	return s
}

// SetConfig makes cfg the configuration of the requests that start from
// now on. Its limiters must exist already (see Apply).
func (s *Service) SetConfig(cfg *Config) { s.config.Store(cfg) }

// Config returns the configuration in force.
func (s *Service) Config() *Config { return s.config.Load() }

// Apply puts the limiter of every rule of cfg, which may be nil: created
// when missing, replaced when its policy changed (it then starts full),
// left as it is, state and all, otherwise.
func Apply(ctx context.Context, limiters Limiters, cfg *Config) error {
	for _, def := range cfg.Limiters() {
		if _, err := limiters.Put(ctx, def); err != nil {
			return fmt.Errorf("limiter %s of rule %s: %w", def.Name, cfg.ruleOf(def.Name), err)
		}
	}
	return nil
}

// ruleOf returns the path of the rule whose limiter is name.
func (c *Config) ruleOf(name string) string {
	for _, r := range c.Rules {
		if r.Limiter.Name == name {
			return r.Path
		}
	}
	return ""
}

// part is one descriptor of a request, resolved.
type part struct {
	rule   *Rule
	key    string
	hits   int64
	refund bool
	// status is the descriptor's answer, once decided.
	status *rlsv3.RateLimitResponse_DescriptorStatus
}

// ShouldRateLimit decides a request's descriptors: those of ordinary rules
// all or nothing, in one joint decision (see the package doc).
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	parts, err := s.resolve(req)
	if err != nil {
		return nil, err
	}
	// Replaced rules do not apply, as envoyproxy/ratelimit decides.
	replaced := make(map[string]bool)
	for _, p := range parts {
		if p.rule != nil {
			for _, name := range p.rule.Replaces {
				replaced[name] = true
			}
		}
	}
	var take, peek, refund, shadow []*part
	var quota []*part
	denied := false // an ordinary rule that can never grant the hits
	for _, p := range parts {
		r := p.rule
		switch {
		case r == nil || r.Name != "" && replaced[r.Name]:
			p.status = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		case r.Unlimited:
			p.status = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		case p.refund:
			refund = append(refund, p)
		case p.hits == 0:
			peek = append(peek, p)
		case r.ShadowMode:
			shadow = append(shadow, p)
		case r.QuotaMode:
			quota = append(quota, p)
		default:
			take = append(take, p)
			denied = denied || r.Limiter.Name == "" || p.hits > limiter.MaxLimit
		}
	}

	overLimit := false
	// Ordinary rules: all or nothing. One that can never grant its hits
	// (a limit of 0, more hits than any limit) denies the request without
	// a decision that could charge the others: they are only checked.
	if len(take) > 0 {
		mode := limiter.Take
		if denied {
			mode = limiter.Peek
		}
		ok, err := s.decide(ctx, take, mode)
		if err != nil {
			return nil, err
		}
		overLimit = !ok || denied
	}
	// Quota rules: each on its own; the request is over the limit when
	// every one of them is.
	if len(quota) > 0 {
		over := 0
		for _, p := range quota {
			mode := limiter.Take
			if overLimit {
				mode = limiter.Peek // a denied request charges nothing
			}
			if _, err := s.decide(ctx, []*part{p}, mode); err != nil {
				return nil, err
			}
			if p.status.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
				over++
			}
		}
		overLimit = overLimit || over == len(quota)
	}
	// Shadow rules: decided and reported, but always OK, as
	// envoyproxy/ratelimit answers them.
	if len(shadow) > 0 {
		if _, err := s.decide(ctx, shadow, limiter.Take); err != nil {
			return nil, err
		}
		for _, p := range shadow {
			p.status.Code = rlsv3.RateLimitResponse_OK
		}
	}
	if len(peek) > 0 {
		if _, err := s.decide(ctx, peek, limiter.Peek); err != nil {
			return nil, err
		}
	}
	if len(refund) > 0 {
		if _, err := s.decide(ctx, refund, limiter.Refund); err != nil {
			return nil, err
		}
	}

	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(parts)),
	}
	if overLimit {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for i, p := range parts {
		resp.Statuses[i] = p.status
	}
	return resp, nil
}

// resolve checks a request and finds the rule and key of each descriptor.
func (s *Service) resolve(req *rlsv3.RateLimitRequest) ([]*part, error) {
	switch n := len(req.GetDescriptors()); {
	case req.GetDomain() == "":
		return nil, status.Error(codes.InvalidArgument, "the domain is empty")
	case n == 0:
		return nil, status.Error(codes.InvalidArgument, "the request has no descriptor")
	case n > MaxDescriptors:
		return nil, status.Errorf(codes.InvalidArgument, "the request has %d descriptors, more than the %d one request may hold", n, MaxDescriptors)
	}
	cfg := s.config.Load()
	hits := max(1, int64(req.GetHitsAddend()))
	parts := make([]*part, len(req.Descriptors))
	entries := make([]Entry, 0, MaxEntries)
	for i, d := range req.Descriptors {
		entries = entries[:0]
		switch n := len(d.GetEntries()); {
		case n == 0:
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d has no entry", i)
		case n > MaxEntries:
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries, more than the %d a descriptor may hold", i, n, MaxEntries)
		}
		for j, e := range d.Entries {
			if len(e.GetKey()) > MaxEntryBytes || len(e.GetValue()) > MaxEntryBytes {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d, entry %d: a key or value is longer than %d bytes", i, j, MaxEntryBytes)
			}
			entries = append(entries, Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		p := &part{hits: hits, refund: d.GetIsNegativeHits()}
		if h := d.GetHitsAddend(); h != nil {
			p.hits = int64(min(h.GetValue(), math.MaxInt64))
		}
		if d.GetLimit() != nil {
			return nil, status.Errorf(codes.Unimplemented, "descriptor %d: a limit override is not supported yet", i)
		}
		p.rule, p.key = cfg.Match(req.Domain, entries)
		parts[i] = p
	}
	return parts, nil
}

// decide decides ps together in mode, and sets their statuses; it reports
// whether the verdict allowed them. A limiter found missing (deleted
// through the HTTP API) is put back, once, and the decision made again.
func (s *Service) decide(ctx context.Context, ps []*part, mode limiter.Mode) (bool, error) {
	items := make([]limiter.Item, 0, len(ps))
	idx := make([]int, 0, len(ps)) // the part of each item
	for i, p := range ps {
		if p.rule.Limiter.Name == "" || p.hits > limiter.MaxLimit {
			// Never fits: reported without a limiter.
			p.status = &rlsv3.RateLimitResponse_DescriptorStatus{
				Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: currentLimit(p.rule),
				DurationUntilReset: durationpb.New(p.rule.Unit.Period()),
			}
			continue
		}
		permits := p.hits
		if permits == 0 {
			permits = 1 // a check only: what one more hit would find
		}
		items = append(items, limiter.Item{Name: p.rule.Limiter.Name, Key: p.key, Permits: permits})
		idx = append(idx, i)
	}
	if len(items) == 0 {
		return false, nil
	}
	v, err := s.limiters.Decide(ctx, items, mode, "")
	var missing *limiter.MissingError
	if errors.As(err, &missing) {
		for _, p := range ps {
			if p.rule.Limiter.Name == missing.Name {
				if _, perr := s.limiters.Put(ctx, p.rule.Limiter); perr != nil {
					return false, s.failed(perr)
				}
				break
			}
		}
		v, err = s.limiters.Decide(ctx, items, mode, "")
	}
	if err != nil {
		return false, s.failed(err)
	}
	if v.Degraded && !v.Allowed {
		return false, status.Error(codes.Unavailable, "the rate limit backend is unavailable")
	}
	for k, c := range v.Checks {
		p := ps[idx[k]]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: currentLimit(p.rule)}
		if !v.Degraded {
			st.LimitRemaining = uint32(min(c.Remaining, math.MaxUint32))
			reset := c.ResetAfter
			fits := c.Fits || mode == limiter.Peek && p.hits == 0
			if !fits {
				if mode != limiter.Peek || p.hits > 0 {
					st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				}
				if !c.ExceedsCapacity {
					reset = c.RetryAfter
				}
			}
			st.DurationUntilReset = durationpb.New(roundUp(reset))
		}
		p.status = st
	}
	return v.Allowed, nil
}

// failed turns a decision's error into the gRPC status Envoy acts on:
// UNAVAILABLE for the backend (which failure_mode_deny then denies),
// INTERNAL for anything else, never UNKNOWN, which Envoy lets through.
func (s *Service) failed(err error) error {
	if errors.Is(err, limiter.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.Unavailable, "the rate limit backend is unavailable")
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, "the request was canceled")
	}
	s.logger.Error("rate limit decision failed", "error", err)
	return status.Error(codes.Internal, "the decision failed")
}

// currentLimit is a rule's limit as the protocol states it.
func currentLimit(r *Rule) *rlsv3.RateLimitResponse_RateLimit {
	return &rlsv3.RateLimitResponse_RateLimit{
		Name: r.Name, RequestsPerUnit: r.RequestsPerUnit,
		Unit: rlsv3.RateLimitResponse_RateLimit_Unit(r.Unit),
	}
}

// roundUp rounds d up to whole milliseconds: a caller told to wait never
// retries too early, and the durations read as the HTTP API's.
func roundUp(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}
