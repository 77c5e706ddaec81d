package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/ratelimitheader"
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
// List, Lowest and DeleteIdle serve Sweep and the bound of limits set by
// requests.
type Limiters interface {
	Decide(ctx context.Context, items []limiter.Item, mode limiter.Mode, once string) (limiter.Verdict, error)
	Put(ctx context.Context, def limiter.Definition) (bool, error)
	List(ctx context.Context, after string, max int) ([]limiter.Definition, error)
	Lowest(ctx context.Context, name string, k int) ([]limiter.KeyEntry, error)
	DeleteIdle(ctx context.Context, name string) error
}

// MaxOverrides is the most distinct limits that requests may set on their
// descriptors (RateLimitDescriptor.limit) that the backend holds at once,
// for every process on it and across restarts; each is a limiter of
// OverrideMaxKeys keys, deleted by Sweep once it holds no counts. A
// request with one more is refused with RESOURCE_EXHAUSTED.
const (
	MaxOverrides    = 100
	OverrideMaxKeys = 1000
)

// Service implements RateLimitService on the limiters, with the rules of a
// Config that can be replaced at any time.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	limiters Limiters
	config   atomic.Pointer[Config]
	opts     Options
	hits     metric.Int64Counter
	options  atomic.Pointer[sync.Map] // *Rule → *ruleOptions: see optionsOf

	mu        sync.Mutex
	overrides map[string]*Rule            // by limiter name, once its limiter was put; pruned by Sweep
	pending   map[string]*pendingOverride // by limiter name, while its limiter is put

	fullUntil time.Time       // see putOverride; under mu
	fullHeld  map[string]bool // the limits held when last found full; under mu
	now       func() time.Time

	sweepMu   sync.Mutex           // one Sweep at a time
	idleSince map[string]time.Time // by limiter name: when Sweep first found it without counts
}

// pendingOverride is the put of a limit's limiter, which the requests
// that set the same limit meanwhile wait for, and no other request does.
type pendingOverride struct {
	done chan struct{} // closed once rule and err are set
	rule *Rule
	err  error
}

// Options configure a Service.
type Options struct {
	// Logger logs what goes wrong; nil discards.
	Logger *slog.Logger
	// MeterProvider gets the hits metric (see NewService); nil: none.
	MeterProvider metric.MeterProvider
	// Headers adds the draft-11 RateLimit and RateLimit-Policy headers of
	// the request's rules to every answer (response_headers_to_add), for
	// Envoy to pass on to the client.
	Headers bool
}

// NearLimitRatio is the share of a limit past which allowed hits count as
// near the limit, as envoyproxy/ratelimit counts them.
const NearLimitRatio = 0.8

// NewService returns the service of the limiters, deciding by cfg. It
// counts the hits of every rule in the metric ratelimiter.envoy.hits, by
// domain, rule (its name, or its place in the tree) and result:
// within_limit, near_limit (allowed past NearLimitRatio of the limit),
// over_limit, shadow_mode (over the limit of a shadow-mode rule, and
// answered OK), or degraded (decided by the failure mode, the backend
// being unavailable: nothing is known of the limit).
func NewService(limiters Limiters, cfg *Config, opts Options) (*Service, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = noop.NewMeterProvider()
	}
	hits, err := opts.MeterProvider.Meter("github.com/ratelimiter/ratelimiter/internal/rls").Int64Counter("ratelimiter.envoy.hits",
		metric.WithUnit("{hit}"),
		metric.WithDescription("Hits of the Envoy rate limit service's rules, by domain, rule and result."))
	if err != nil {
		return nil, fmt.Errorf("rls: create ratelimiter.envoy.hits: %w", err)
	}
	s := &Service{limiters: limiters, opts: opts, hits: hits, overrides: make(map[string]*Rule), pending: make(map[string]*pendingOverride), now: time.Now}
	s.SetConfig(cfg)
	return s, nil
}

// SetConfig makes cfg the configuration of the requests that start from
// now on. Its limiters must exist already (see Apply).
func (s *Service) SetConfig(cfg *Config) {
	s.config.Store(cfg)
	// The options of the rules in force from now on are made afresh, so
	// that the rules of earlier configurations do not stay cached.
	s.options.Store(new(sync.Map))
}

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
	// over tells that the descriptor was over its limit, even when its
	// answer is OK (a shadow-mode rule).
	over bool
	// degraded tells that the backend could not decide the descriptor:
	// its answer follows the failure mode.
	degraded bool
}

// neverFits reports whether p's hits can never be granted: its rule has a
// limit of 0 (no limiter), or the hits exceed any limit.
func (p *part) neverFits() bool {
	return p.rule.Limiter.Name == "" || p.hits > limiter.MaxLimit
}

// ShouldRateLimit decides a request's descriptors: those of ordinary rules
// all or nothing, in one joint decision (see the package doc).
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	parts, err := s.resolve(ctx, req)
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
	var take, peek, refund, shadow, quota []*part
	denied := false // an ordinary rule that can never grant the hits
	for _, p := range parts {
		r := p.rule
		switch {
		case r == nil || r.Name != "" && replaced[r.Name]:
			p.status = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		case r.Unlimited:
			p.status = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		case p.hits == 0:
			peek = append(peek, p) // a refund of 0 too: it gives nothing back
		case p.refund:
			refund = append(refund, p)
		case r.ShadowMode:
			shadow = append(shadow, p)
		case r.QuotaMode:
			quota = append(quota, p)
		default:
			take = append(take, p)
			denied = denied || p.neverFits()
		}
	}

	// A call its caller gave up on before anything was decided is charged
	// nothing; one given up on while it is decided may be charged all the
	// same, as the README says.
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
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
	// envoyproxy/ratelimit answers them. They come last, since only an
	// allowed request charges them.
	if len(shadow) > 0 {
		mode := limiter.Take
		if overLimit {
			mode = limiter.Peek // a denied request charges nothing
		}
		if _, err := s.decide(ctx, shadow, mode); err != nil {
			return nil, err
		}
		for _, p := range shadow {
			p.over = p.status.Code == rlsv3.RateLimitResponse_OVER_LIMIT
			p.status.Code = rlsv3.RateLimitResponse_OK
			if p.over {
				s.opts.Logger.DebugContext(ctx, "shadow-mode rule over its limit", "domain", p.rule.Domain, "rule", p.rule.Path, "key", p.key, "hits", p.hits)
			}
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
		s.count(ctx, p)
	}
	if s.opts.Headers {
		resp.ResponseHeadersToAdd = headers(parts)
	}
	return resp, nil
}

// Results of the hits metric, as indexes of a rule's options.
const (
	withinLimit = iota
	nearLimit
	overLimit
	shadowMode
	degraded
	results
)

var resultNames = [results]string{"within_limit", "near_limit", "over_limit", "shadow_mode", "degraded"}

// ruleOptions are the hits metric's options of one rule, by result.
type ruleOptions [results]metric.AddOption

// optionsOf returns the hits metric's options of r, made once per rule
// rather than at every hit: an attribute set costs allocations and
// hashing that a hot path should not pay per call.
//
// The limits set by requests count as one rule per domain,
// "<domain>.override": requests choose them, and their limiters come and
// go (see Sweep), so that a rule of their own each would make the metric's
// series, and this cache, grow without end.
func (s *Service) optionsOf(r *Rule) *ruleOptions {
	cache := s.options.Load()
	var key any = r
	if r.override {
		key = overrideKey(r.Domain)
	}
	if o, ok := cache.Load(key); ok {
		return o.(*ruleOptions)
	}
	rule := r.Name
	switch {
	case r.override:
		rule = r.Domain + ".override"
	case rule == "":
		rule = r.Path
	}
	o := new(ruleOptions)
	for i, name := range resultNames {
		o[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("domain", r.Domain), attribute.String("rule", rule), attribute.String("result", name)))
	}
	actual, _ := cache.LoadOrStore(key, o)
	return actual.(*ruleOptions)
}

// overrideKey is the key of a domain's limits set by requests in the
// cache of optionsOf.
type overrideKey string

// count records the hits of a decided part in the hits metric.
func (s *Service) count(ctx context.Context, p *part) {
	r := p.rule
	if r == nil || r.Unlimited || p.refund || p.hits == 0 || p.status == nil || p.status.CurrentLimit == nil {
		return
	}
	result := withinLimit
	switch {
	case p.degraded:
		// Neither within nor over: the limit was not consulted.
		result = degraded
	case r.ShadowMode && p.over:
		result = shadowMode
	case p.status.Code == rlsv3.RateLimitResponse_OVER_LIMIT:
		result = overLimit
	case float64(p.status.LimitRemaining) < (1-NearLimitRatio)*float64(r.RequestsPerUnit):
		result = nearLimit
	}
	s.hits.Add(ctx, p.hits, s.optionsOf(r)[result])
}

// headers are the draft-11 headers of the parts' rules, one entry per
// rule with a limit, in the order of the descriptors. A degraded part has
// none, as a degraded answer of the HTTP API has none: what is left is not
// known.
func headers(parts []*part) []*corev3.HeaderValue {
	var policy, value []string
	seen := make(map[*Rule]bool)
	for _, p := range parts {
		st := p.status
		if p.rule == nil || p.rule.Unlimited || p.degraded || st == nil || st.CurrentLimit == nil || seen[p.rule] {
			continue
		}
		seen[p.rule] = true
		name := p.rule.Name
		if name == "" {
			name = p.rule.Path
		}
		policy = append(policy, ratelimitheader.Policy(name, p.rule.period(), int64(p.rule.RequestsPerUnit)))
		reset := time.Duration(0)
		if d := st.DurationUntilReset; d != nil {
			reset = d.AsDuration()
		}
		value = append(value, ratelimitheader.Value(name, int64(st.LimitRemaining), reset))
	}
	if len(policy) == 0 {
		return nil
	}
	return []*corev3.HeaderValue{
		{Key: ratelimitheader.PolicyField, Value: strings.Join(policy, ", ")},
		{Key: ratelimitheader.Field, Value: strings.Join(value, ", ")},
	}
}

// resolve checks a request and finds the rule and key of each descriptor.
func (s *Service) resolve(ctx context.Context, req *rlsv3.RateLimitRequest) ([]*part, error) {
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
		if o := d.GetLimit(); o != nil {
			// A limit set by the request applies in place of the
			// configuration's, in a known domain only, as
			// envoyproxy/ratelimit applies it.
			if cfg.known(req.Domain) {
				r, err := s.override(ctx, req.Domain, o)
				if err != nil {
					return nil, status.Errorf(status.Code(err), "descriptor %d: %s", i, status.Convert(err).Message())
				}
				p.rule, p.key = r, Key(entries, values(entries))
			}
		} else {
			p.rule, p.key = cfg.Match(req.Domain, entries)
		}
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
		permits := p.hits
		switch {
		case permits == 0:
			permits = 1 // a check only: what one more hit would find
		case mode == limiter.Refund:
			permits = min(permits, limiter.MaxLimit) // up to full: no limiter holds more
		}
		if p.rule.Limiter.Name == "" || permits > limiter.MaxLimit {
			// Reported without a limiter: over the limit, unless only
			// checked or given back, which never deny.
			st := &rlsv3.RateLimitResponse_DescriptorStatus{
				Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: currentLimit(p.rule),
				DurationUntilReset: durationpb.New(p.rule.period()),
			}
			if p.hits == 0 || mode == limiter.Refund {
				st.Code = rlsv3.RateLimitResponse_OK
			}
			p.status = st
			continue
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
		var perr error
		for _, p := range ps {
			if p.rule.Limiter.Name == missing.Name {
				perr = s.putBack(ctx, p.rule)
				break
			}
		}
		if perr != nil && !unavailable(perr) {
			return false, s.failed(perr)
		}
		// When the backend could not put it back, the decision made again
		// cannot reach it either, and follows the failure mode.
		v, err = s.limiters.Decide(ctx, items, mode, "")
		if perr != nil && errors.As(err, &missing) {
			err = perr
		}
	}
	if err != nil {
		return false, s.failed(err)
	}
	if v.Degraded && !v.Allowed {
		return false, status.Error(codes.Unavailable, "the rate limit backend is unavailable")
	}
	for k, c := range v.Checks {
		p := ps[idx[k]]
		p.degraded = v.Degraded
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
// RESOURCE_EXHAUSTED for a limiter the backend has no room for, INTERNAL
// for anything else, never UNKNOWN, which Envoy lets through.
func (s *Service) failed(err error) error {
	if unavailable(err) {
		return status.Error(codes.Unavailable, "the rate limit backend is unavailable")
	}
	if isNoRoom(err) {
		if !errors.Is(err, errTooManyOverrides) { // the bound, which requests reach: not logged
			s.opts.Logger.Warn("a limiter has no room", "error", err)
		}
		return noRoom(err)
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, "the request was canceled")
	}
	s.opts.Logger.Error("rate limit decision failed", "error", err)
	return status.Error(codes.Internal, "the decision failed")
}

// unavailable reports whether err is the backend's: unavailable, or too
// slow.
func unavailable(err error) bool {
	return errors.Is(err, limiter.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// currentLimit is a rule's limit as the protocol states it.
func currentLimit(r *Rule) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{
		Name: r.Name, RequestsPerUnit: r.RequestsPerUnit,
		Unit: rlsv3.RateLimitResponse_RateLimit_Unit(r.Unit),
	}
	if r.Multiplier > 1 {
		l.UnitMultiplier = wrapperspb.UInt32(r.Multiplier)
	}
	return l
}

// roundUp rounds d up to whole milliseconds: a caller told to wait never
// retries too early, and the durations read as the HTTP API's.
func roundUp(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}

// values returns the values of entries.
func values(entries []Entry) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Value
	}
	return out
}

// override returns the rule of a limit a request sets on a descriptor of
// domain: a keyed limiter per distinct limit of the domain, put on first
// use. When the backend cannot put it, the rule is returned all the same:
// its decision cannot reach the backend either, and follows the failure
// mode; a later request puts it.
func (s *Service) override(ctx context.Context, domain string, o *commonv3.RateLimitDescriptor_RateLimitOverride) (*Rule, error) {
	unit := Unit(o.GetUnit())
	mult := max(1, o.GetUnitMultiplier().GetValue())
	switch {
	case unit < Second || unit > Year:
		return nil, status.Errorf(codes.InvalidArgument, "the limit's unit %v is not one of SECOND to YEAR", o.GetUnit())
	case int64(o.GetRequestsPerUnit()) > limiter.MaxLimit:
		return nil, status.Errorf(codes.InvalidArgument, "the limit's requests_per_unit %d is over %d", o.GetRequestsPerUnit(), int64(limiter.MaxLimit))
	}
	period := time.Duration(mult) * unit.Period()
	if period/time.Duration(mult) != unit.Period() || period > limiter.MaxPeriod {
		return nil, status.Errorf(codes.InvalidArgument, "the limit's period, %d × %v, is over %s", mult, o.GetUnit(), limiter.FormatPeriod(limiter.MaxPeriod))
	}
	r := &Rule{Domain: domain, Path: fmt.Sprintf("%s.override.%d_per_%d_%s", domain, o.GetRequestsPerUnit(), mult, o.GetUnit()),
		Unit: unit, Multiplier: mult, RequestsPerUnit: o.GetRequestsPerUnit(), override: true}
	if r.RequestsPerUnit == 0 {
		return r, nil // denies every hit, without a limiter
	}
	r.Limiter = limiter.Definition{
		Name: overrideName(domain, r.Path), Group: groupName(domain), Keyed: true, MaxKeys: OverrideMaxKeys,
		Policy: limiter.Policy{Limit: int64(r.RequestsPerUnit), Period: period}.Normalize(),
	}
	name := r.Limiter.Name
	s.mu.Lock()
	if known, ok := s.overrides[name]; ok {
		s.mu.Unlock()
		return known, nil
	}
	if p, ok := s.pending[name]; ok {
		s.mu.Unlock()
		select {
		case <-p.done:
			return p.rule, p.err
		case <-ctx.Done():
			return nil, s.failed(ctx.Err())
		}
	}
	// The limiter is put without the lock, which a backend that does not
	// answer would otherwise hold for every request that sets a limit; and
	// whatever becomes of this request, since others may wait for the put
	// (the backend bounds it with its own timeout).
	p := &pendingOverride{done: make(chan struct{})}
	s.pending[name] = p
	s.mu.Unlock()
	err := s.putOverride(context.WithoutCancel(ctx), r.Limiter)
	p.rule = r
	switch {
	case err == nil:
	case errors.Is(err, errTooManyOverrides):
		p.rule, p.err = nil, noRoom(err)
	case isNoRoom(err):
		s.opts.Logger.Warn("a limit set by a request has no room", "rule", r.Path, "error", err)
		p.rule, p.err = nil, noRoom(err)
	case unavailable(err):
		// Not remembered: a later request puts it.
	default:
		p.rule, p.err = nil, s.failed(err)
	}
	s.mu.Lock()
	delete(s.pending, name)
	if err == nil {
		s.overrides[name] = r
	}
	s.mu.Unlock()
	close(p.done)
	return p.rule, p.err
}
