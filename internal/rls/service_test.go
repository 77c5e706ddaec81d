package rls

import (
	"context"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/rueidis"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// testConfig is the configuration of the service tests.
const testConfig = `domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: plan
    value: free
    rate_limit: {unit: day, requests_per_unit: 2, name: free}
  - key: plan
    value: trial
    rate_limit: {unit: day, requests_per_unit: 10, replaces: [{name: free}]}
  - key: banned
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: internal
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}
`

// backends runs f against the service on each backend: the memory store,
// and a Redis store on a real server.
func backends(t *testing.T, f func(t *testing.T, l *limiter.Service)) {
	t.Run("memory", func(t *testing.T) { f(t, limiter.NewService(memory.New(nil, 0))) })
	t.Run("redis", func(t *testing.T) {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{redistest.Standalone(t)}, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		st, err := limiterredis.New(c, fmt.Sprintf("rls%d:", time.Now().UnixNano()), 1000)
		if err != nil {
			t.Fatal(err)
		}
		f(t, limiter.NewService(st))
	})
}

// serve starts the service of cfg on the limiters, on a loopback port, and
// returns a client of it through a real gRPC connection.
func serve(t *testing.T, l Limiters, cfg *Config) rlsv3.RateLimitServiceClient {
	return serveWith(t, l, cfg, Options{})
}

// serveWith is serve with options.
func serveWith(t *testing.T, l Limiters, cfg *Config, opts Options) rlsv3.RateLimitServiceClient {
	t.Helper()
	if err := Apply(t.Context(), l, cfg); err != nil {
		t.Fatal(err)
	}
	return start(t, l, cfg, opts)
}

// start is serveWith on limiters whose limiters are put already, or
// cannot be.
func start(t *testing.T, l Limiters, cfg *Config, opts Options) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := NewService(l, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	cfg, err := Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// desc is a descriptor of key=value pairs.
func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hits sets a descriptor's own hits_addend.
func hits(d *commonv3.RateLimitDescriptor, n uint64) *commonv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func codesOf(r *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	out := []rlsv3.RateLimitResponse_Code{r.OverallCode}
	for _, s := range r.Statuses {
		out = append(out, s.Code)
	}
	return out
}

func wantCodes(t *testing.T, what string, r *rlsv3.RateLimitResponse, want ...rlsv3.RateLimitResponse_Code) {
	t.Helper()
	got := codesOf(r)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: codes (overall, then each descriptor) %v, want %v", what, got, want)
	}
}

// A descriptor is limited per value; its status states the limit, what is
// left and when it is full again, or when the request would fit.
func TestShouldRateLimit(t *testing.T) {
	backends(t, func(t *testing.T, l *limiter.Service) {
		c := serve(t, l, mustParse(t, testConfig))
		for i := range 3 {
			r := ask(t, c, desc("user", "alice"))
			wantCodes(t, "alice", r, ok, ok)
			st := r.Statuses[0]
			if st.LimitRemaining != uint32(2-i) || st.CurrentLimit.GetRequestsPerUnit() != 3 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
				t.Errorf("alice %d: status %v", i, st)
			}
			// Until the key is full again: 20 minutes for each permit
			// taken (GCRA, 3 an hour), less the moments since.
			if d, want := st.DurationUntilReset.AsDuration(), time.Duration(i+1)*20*time.Minute; d <= want-time.Minute || d > want {
				t.Errorf("alice %d: duration until reset %s, want the time until full again, %s", i, d, want)
			}
		}
		r := ask(t, c, desc("user", "alice"))
		wantCodes(t, "alice, a 4th time", r, over, over)
		// GCRA: one permit every 20 minutes; the next fits in at most that.
		if d := r.Statuses[0].DurationUntilReset.AsDuration(); d <= 19*time.Minute || d > 20*time.Minute {
			t.Errorf("over the limit: duration until reset %s, want the wait until one fits (~20m)", d)
		}
		wantCodes(t, "bob", ask(t, c, desc("user", "bob")), ok, ok)
	})
}

// The descriptors of a request are decided all or nothing: when one is
// over its limit, none is charged.
func TestAllOrNothing(t *testing.T) {
	backends(t, func(t *testing.T, l *limiter.Service) {
		c := serve(t, l, mustParse(t, testConfig))
		for range 3 {
			wantCodes(t, "user and route", ask(t, c, desc("user", "carol"), desc("route", "/search")), ok, ok, ok)
		}
		// carol is out; the route, with 2 left, is not charged.
		for range 3 {
			wantCodes(t, "carol over", ask(t, c, desc("user", "carol"), desc("route", "/search")), over, over, ok)
		}
		r := ask(t, c, hits(desc("route", "/search"), 0))
		if got := r.Statuses[0].LimitRemaining; got != 2 {
			t.Errorf("route after three denied requests: %d left, want 2", got)
		}
		// A limit of 0 denies, and charges nothing else either.
		wantCodes(t, "banned", ask(t, c, desc("route", "/search"), desc("banned", "x")), over, ok, over)
		if got := ask(t, c, hits(desc("route", "/search"), 0)).Statuses[0].LimitRemaining; got != 2 {
			t.Errorf("route after a banned request: %d left, want 2", got)
		}
	})
}

// hits_addend: the request's applies to each descriptor (at least 1), a
// descriptor's own overrides it, 0 only checks; is_negative_hits refunds.
func TestHitsAddend(t *testing.T) {
	backends(t, func(t *testing.T, l *limiter.Service) {
		c := serve(t, l, mustParse(t, testConfig))
		r, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", HitsAddend: 4, Descriptors: []*commonv3.RateLimitDescriptor{desc("route", "/a")}})
		if err != nil || r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1 {
			t.Fatalf("4 hits of 5: %v %v", r, err)
		}
		wantCodes(t, "2 more", ask(t, c, hits(desc("route", "/a"), 2)), over, over)
		if got := ask(t, c, hits(desc("route", "/a"), 0)).Statuses[0].LimitRemaining; got != 1 {
			t.Errorf("after a denied 2: %d left, want 1", got)
		}
		refund := hits(desc("route", "/a"), 3)
		refund.IsNegativeHits = true
		wantCodes(t, "refund 3", ask(t, c, refund), ok, ok)
		if got := ask(t, c, hits(desc("route", "/a"), 0)).Statuses[0].LimitRemaining; got != 4 {
			t.Errorf("after refunding 3: %d left, want 4", got)
		}
		// A refund of 0 hits gives nothing back: it only checks.
		zero := hits(desc("route", "/a"), 0)
		zero.IsNegativeHits = true
		r = ask(t, c, zero)
		if wantCodes(t, "refund 0", r, ok, ok); r.Statuses[0].LimitRemaining != 4 {
			t.Errorf("refunding 0: %d left, want 4", r.Statuses[0].LimitRemaining)
		}
		// More hits than any limit refund up to full.
		all := hits(desc("route", "/a"), math.MaxUint64)
		all.IsNegativeHits = true
		r = ask(t, c, all)
		if wantCodes(t, "refund more than any limit", r, ok, ok); r.Statuses[0].LimitRemaining != 5 {
			t.Errorf("refunding more than any limit: %d left, want 5", r.Statuses[0].LimitRemaining)
		}
		// A check or a refund never denies, on a limit of 0 too: it answers
		// OK with nothing left.
		refundBanned := desc("banned", "x")
		refundBanned.IsNegativeHits = true
		for what, d := range map[string]*commonv3.RateLimitDescriptor{"check a limit of 0": hits(desc("banned", "x"), 0), "refund a limit of 0": refundBanned} {
			r := ask(t, c, d, hits(desc("route", "/a"), 0))
			if wantCodes(t, what, r, ok, ok, ok); r.Statuses[0].LimitRemaining != 0 || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 || r.Statuses[0].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
				t.Errorf("%s: status %v", what, r.Statuses[0])
			}
		}
		wantCodes(t, "more hits than the limit", ask(t, c, hits(desc("route", "/b"), 6)), over, over)
		wantCodes(t, "more hits than any limit", ask(t, c, hits(desc("route", "/b"), math.MaxUint64)), over, over)
		if got := ask(t, c, hits(desc("route", "/b"), 0)).Statuses[0].LimitRemaining; got != 5 {
			t.Errorf("after denied hits: %d left, want 5", got)
		}
	})
}

// Rules as envoyproxy/ratelimit applies them: unknown descriptors and
// unlimited rules are under no limit, a rule replaces another by name,
// shadow-mode rules never deny, and the sliding log decides its rule.
func TestRules(t *testing.T) {
	backends(t, func(t *testing.T, l *limiter.Service) {
		c := serve(t, l, mustParse(t, testConfig))
		r := ask(t, c, desc("unknown", "x"))
		wantCodes(t, "unknown descriptor", r, ok, ok)
		if r.Statuses[0].CurrentLimit != nil {
			t.Errorf("unknown descriptor: limit %v, want none", r.Statuses[0].CurrentLimit)
		}
		r = ask(t, c, desc("internal", "x"))
		if wantCodes(t, "unlimited", r, ok, ok); r.Statuses[0].LimitRemaining != math.MaxUint32 {
			t.Errorf("unlimited: %d left", r.Statuses[0].LimitRemaining)
		}
		unknown, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "elsewhere", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "alice"), desc("route", "/")}})
		if err != nil {
			t.Fatal(err)
		}
		wantCodes(t, "unknown domain", unknown, ok, ok, ok)
		for i, st := range unknown.Statuses {
			if st.CurrentLimit != nil || st.LimitRemaining != 0 || st.DurationUntilReset != nil {
				t.Errorf("unknown domain, descriptor %d: %v, want OK with no limit", i, st)
			}
		}
		// free allows 2 a day alone; with trial, which replaces it, 10.
		for range 2 {
			wantCodes(t, "free", ask(t, c, desc("plan", "free")), ok, ok)
		}
		wantCodes(t, "free, 3rd", ask(t, c, desc("plan", "free")), over, over)
		wantCodes(t, "free replaced by trial", ask(t, c, desc("plan", "free"), desc("plan", "trial")), ok, ok, ok)
		for range 3 {
			wantCodes(t, "shadow", ask(t, c, desc("shadow", "x")), ok, ok)
		}
		// A denied request does not charge its shadow-mode rules either:
		// they are only checked, and reported.
		r = ask(t, c, desc("banned", "x"), desc("shadow", "y"))
		if wantCodes(t, "shadow in a denied request", r, over, over, ok); r.Statuses[1].LimitRemaining != 1 {
			t.Errorf("shadow in a denied request: %d left, want 1", r.Statuses[1].LimitRemaining)
		}
		if got := ask(t, c, hits(desc("shadow", "y"), 0)).Statuses[0].LimitRemaining; got != 1 {
			t.Errorf("shadow after a denied request: %d left, want 1", got)
		}
		wantCodes(t, "shadow allowed", ask(t, c, desc("shadow", "y")), ok, ok)
		if got := ask(t, c, hits(desc("shadow", "y"), 0)).Statuses[0].LimitRemaining; got != 0 {
			t.Errorf("shadow after an allowed request: %d left, want 0", got)
		}
		for i := range 3 {
			want := ok
			if i == 2 {
				want = over
			}
			wantCodes(t, "sliding log", ask(t, c, desc("log", "x")), want, want)
		}
	})
}

// Bad requests are refused with INVALID_ARGUMENT and charge nothing.
func TestInvalidRequests(t *testing.T) {
	backends(t, func(t *testing.T, l *limiter.Service) {
		c := serve(t, l, mustParse(t, testConfig))
		many := make([]*commonv3.RateLimitDescriptor, MaxDescriptors+1)
		for i := range many {
			many[i] = desc("user", "dave")
		}
		deep := desc()
		for range MaxEntries + 1 {
			deep.Entries = append(deep.Entries, &commonv3.RateLimitDescriptor_Entry{Key: "user", Value: "dave"})
		}
		long := desc("user", string(make([]byte, MaxEntryBytes+1)))
		for name, req := range map[string]*rlsv3.RateLimitRequest{
			"no domain":            {Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "dave")}},
			"no descriptor":        {Domain: "web"},
			"too many descriptors": {Domain: "web", Descriptors: many},
			"an empty descriptor":  {Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "dave"), desc()}},
			"too many entries":     {Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "dave"), deep}},
			"a long value":         {Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "dave"), long}},
		} {
			_, err := c.ShouldRateLimit(t.Context(), req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
			}
		}
		if got := ask(t, c, hits(desc("user", "dave"), 0)).Statuses[0].LimitRemaining; got != 3 {
			t.Errorf("after refused requests: %d left, want 3", got)
		}
	})
}

// Without its backend the service answers UNAVAILABLE when it fails
// closed (Envoy's failure_mode_deny then denies), and OK when it fails
// open; never UNKNOWN, which Envoy lets through. So it does when a
// limiter must be put first: a limit set by the request, on its first
// use, and a limiter found missing.
func TestBackendUnavailable(t *testing.T) {
	cfg := mustParse(t, testConfig)
	override := desc("user", "erin")
	override.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
	for _, tc := range []struct {
		name    string
		d       *commonv3.RateLimitDescriptor
		limit   uint32 // the limit a fail-open answer states
		missing bool   // the decision finds the limiter missing
	}{
		{"a configured rule", desc("user", "erin"), 3, false},
		{"a limit set by the request", override, 5, false},
		{"a limiter found missing", desc("user", "erin"), 3, true},
	} {
		for _, mode := range []limiter.FailureMode{limiter.FailClosed, limiter.FailOpen} {
			t.Run(tc.name+"/"+mode.String(), func(t *testing.T) {
				var l Limiters = unreachable(cfg, mode)
				if tc.missing {
					l = &missingOnce{Limiters: l}
				}
				r, err := start(t, l, cfg, Options{}).ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{tc.d}})
				switch {
				case mode == limiter.FailClosed && status.Code(err) != codes.Unavailable:
					t.Errorf("got %v %v, want UNAVAILABLE", r, err)
				case mode == limiter.FailOpen && err != nil:
					t.Errorf("got %v, want OK", err)
				case mode == limiter.FailOpen:
					// A degraded status: OK, the rule's limit, nothing known
					// of what is left or when.
					if st := r.Statuses[0]; r.OverallCode != ok || st.Code != ok || st.CurrentLimit.GetRequestsPerUnit() != tc.limit || st.LimitRemaining != 0 || st.DurationUntilReset != nil {
						t.Errorf("got %v, want OK with a limit of %d", r, tc.limit)
					}
				}
			})
		}
	}
}

// unreachable returns limiters on a Redis store that never connects: every
// call fails as in an outage, and decisions follow mode.
func unreachable(cfg *Config, mode limiter.FailureMode) *limiter.Service {
	return limiter.NewServiceWith(limiterredis.NewLazy(cfg.Limiters(), 0), limiter.ServiceOptions{FailureMode: mode})
}

// missingOnce is Limiters whose first decision finds the limiter of its
// first item missing, as after a delete through the HTTP API.
type missingOnce struct {
	Limiters
	found atomic.Bool
}

func (m *missingOnce) Decide(ctx context.Context, items []limiter.Item, mode limiter.Mode, once string) (limiter.Verdict, error) {
	if m.found.CompareAndSwap(false, true) {
		return limiter.Verdict{}, fmt.Errorf("limiter: decide: %w", &limiter.MissingError{Name: items[0].Name})
	}
	return m.Limiters.Decide(ctx, items, mode, once)
}

// While the limiter of a new limit is being put, requests with a limit
// already put are answered, and those with the same new limit wait for
// that one put rather than making their own.
func TestLimitOverridePutDoesNotBlock(t *testing.T) {
	cfg := mustParse(t, testConfig)
	l := &slowPut{Limiters: limiter.NewService(memory.New(nil, 0)), release: make(chan struct{}), started: make(chan struct{}, 8)}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(l.release) }) }
	c := serve(t, l, cfg)
	t.Cleanup(release) // a put still hanging when the test fails, before the server stops
	withLimit := func(n uint32) *commonv3.RateLimitDescriptor {
		d := desc("user", "heidi")
		d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_MINUTE}
		return d
	}
	// A limit of 2 is put at once.
	wantCodes(t, "a limit of 2", ask(t, c, withLimit(2)), ok, ok)

	// The put of a limit of 3 hangs; two requests set it.
	l.block.Store(true)
	answers := make(chan *rlsv3.RateLimitResponse, 2)
	for range 2 {
		go func() {
			resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{withLimit(3)}})
			if err != nil {
				t.Errorf("a limit of 3: %v", err)
			}
			answers <- resp
		}()
	}
	select {
	case <-l.started:
	case <-time.After(5 * time.Second):
		t.Fatal("the limiter of a limit of 3 was never put")
	}
	// Meanwhile the limit of 2 is answered.
	done := make(chan struct{})
	go func() {
		defer close(done)
		wantCodes(t, "a limit of 2, while another is put", ask(t, c, withLimit(2)), ok, ok)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a request with a limit already put waited for the put of another")
	}
	release()
	for range 2 {
		select {
		case r := <-answers:
			if r != nil && r.OverallCode != ok {
				t.Errorf("a limit of 3: %v", r)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a request with a limit of 3 never answered")
		}
	}
	if n := l.overridePuts.Load(); n != 2 {
		t.Errorf("%d puts of a limit's limiter, want 2: one per limit", n)
	}
	if got := ask(t, c, hits(withLimit(3), 0)).Statuses[0].LimitRemaining; got != 1 {
		t.Errorf("a limit of 3 after two requests: %d left, want 1", got)
	}
}

// slowPut is Limiters whose puts, once block is set, hang until release
// is closed, each telling started first; it counts the puts of the
// limiters of limits set by requests.
type slowPut struct {
	Limiters
	block        atomic.Bool
	release      chan struct{}
	started      chan struct{}
	overridePuts atomic.Int64
}

func (s *slowPut) Put(ctx context.Context, def limiter.Definition) (bool, error) {
	if strings.Contains(def.Name, "override") {
		s.overridePuts.Add(1)
	}
	if s.block.Load() {
		s.started <- struct{}{}
		<-s.release
	}
	return s.Limiters.Put(ctx, def)
}

// A limit set by the request applies in place of the configuration's, in
// a known domain, per key as a rule's would; an invalid one is refused.
func TestLimitOverride(t *testing.T) {
	backends(t, func(t *testing.T, l *limiter.Service) {
		c := serve(t, l, mustParse(t, testConfig))
		withLimit := func(n uint32, unit typev3.RateLimitUnit, kv ...string) *commonv3.RateLimitDescriptor {
			d := desc(kv...)
			d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
			return d
		}
		for i := range 2 {
			r := ask(t, c, withLimit(2, typev3.RateLimitUnit_MINUTE, "user", "frank"))
			wantCodes(t, "override", r, ok, ok)
			if l := r.Statuses[0].CurrentLimit; l.GetRequestsPerUnit() != 2 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || r.Statuses[0].LimitRemaining != uint32(1-i) {
				t.Errorf("override %d: %v", i, r.Statuses[0])
			}
		}
		wantCodes(t, "override, 3rd", ask(t, c, withLimit(2, typev3.RateLimitUnit_MINUTE, "user", "frank")), over, over)
		// The configuration's rule for the same descriptor is another count.
		wantCodes(t, "the configured rule", ask(t, c, desc("user", "frank")), ok, ok)
		wantCodes(t, "a limit of 0", ask(t, c, withLimit(0, typev3.RateLimitUnit_MINUTE, "user", "grace")), over, over)
		// Several descriptors with limits: still all or nothing.
		wantCodes(t, "joint", ask(t, c, withLimit(1, typev3.RateLimitUnit_HOUR, "k", "a"), withLimit(5, typev3.RateLimitUnit_HOUR, "k", "b")), ok, ok, ok)
		wantCodes(t, "joint, again", ask(t, c, withLimit(1, typev3.RateLimitUnit_HOUR, "k", "a"), withLimit(5, typev3.RateLimitUnit_HOUR, "k", "b")), over, over, ok)
		if got := ask(t, c, hits(withLimit(5, typev3.RateLimitUnit_HOUR, "k", "b"), 0)).Statuses[0].LimitRemaining; got != 4 {
			t.Errorf("b after a denied joint request: %d left, want 4", got)
		}
		for name, d := range map[string]*commonv3.RateLimitDescriptor{
			"unknown unit":     withLimit(5, typev3.RateLimitUnit_UNKNOWN, "user", "h"),
			"over the maximum": withLimit(limiter.MaxLimit+1, typev3.RateLimitUnit_SECOND, "user", "h"),
		} {
			if _, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{d}}); status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
			}
		}
	})
}

// Quota-mode rules deny a request only when every quota rule it names is
// over its limit; each is charged on its own.
func TestQuotaMode(t *testing.T) {
	backends(t, func(t *testing.T, l *limiter.Service) {
		c := serve(t, l, mustParse(t, `domain: web
descriptors:
  - key: service
    value: s1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: s2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`))
		both := func() *rlsv3.RateLimitResponse {
			return ask(t, c, desc("service", "s1"), desc("service", "s2"))
		}
		wantCodes(t, "both in quota", both(), ok, ok, ok)
		wantCodes(t, "s1 over its quota", both(), ok, over, ok)
		wantCodes(t, "both over their quota", both(), over, over, over)
	})
}

// Every rule's hits are counted by result, as envoyproxy/ratelimit's users
// monitor them; answers carry the draft-11 headers when told to.
func TestMetricsAndHeaders(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	c := serveWith(t, limiter.NewService(memory.New(nil, 0)), mustParse(t, testConfig), Options{MeterProvider: mp, Headers: true})
	for range 4 {
		ask(t, c, desc("user", "ivan")) // 3 allowed (the 3rd near the limit), 1 over
	}
	for range 2 {
		ask(t, c, desc("shadow", "x")) // 1 allowed (near its limit of 1), 1 over in shadow mode
	}
	got := hitsCounted(t, reader)
	want := map[string]int64{
		"web.user within_limit": 2, "web.user near_limit": 1, "web.user over_limit": 1,
		"web.shadow near_limit": 1, "web.shadow shadow_mode": 1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("hits %v, want %v", got, want)
	}

	r := ask(t, c, desc("user", "judy"), desc("plan", "free"))
	h := make(map[string]string)
	for _, hv := range r.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	if p := h["RateLimit-Policy"]; p != `"web.user";q=3;w=3600, "free";q=2;w=86400` {
		t.Errorf("RateLimit-Policy %q", p)
	}
	if v := h["RateLimit"]; !strings.HasPrefix(v, `"web.user";r=2;t=`) || !strings.Contains(v, `, "free";r=1;t=`) {
		t.Errorf("RateLimit %q", v)
	}
}

// Hits decided without the backend, by the failure mode, are counted as
// degraded, and answered without headers: nothing is known of the limit
// they met.
func TestMetricsDegraded(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := mustParse(t, testConfig)
	c := start(t, unreachable(cfg, limiter.FailOpen), cfg, Options{MeterProvider: mp, Headers: true})
	if h := ask(t, c, desc("user", "ivan")).ResponseHeadersToAdd; len(h) != 0 {
		t.Errorf("degraded: headers %v, want none", h)
	}
	ask(t, c, desc("shadow", "x"))
	want := map[string]int64{"web.user degraded": 1, "web.shadow degraded": 1}
	if got := hitsCounted(t, reader); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("hits %v, want %v", got, want)
	}
}

// hitsCounted returns what the hits metric counted, by rule and result.
func hitsCounted(t *testing.T, reader sdkmetric.Reader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	got := make(map[string]int64)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "ratelimiter.envoy.hits" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				rule, _ := dp.Attributes.Value("rule")
				result, _ := dp.Attributes.Value("result")
				got[rule.AsString()+" "+result.AsString()] += dp.Value
			}
		}
	}
	return got
}

// Concurrent requests of three descriptors, spread over three services
// with stores of their own on one Redis (standalone, and a 3-master
// Cluster), admit exactly the smallest limit, and the denied ones charge
// nothing.
func TestAcrossReplicasOnRedis(t *testing.T) {
	const yaml = `domain: web
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 120}
  - key: route
    rate_limit: {unit: year, requests_per_unit: 200, algorithm: sliding_log}
  - key: global
    rate_limit: {unit: year, requests_per_unit: 300}
`
	for name, addrs := range map[string]func(testing.TB) []string{
		"standalone": func(t testing.TB) []string { return []string{redistest.Standalone(t)} },
		"cluster":    redistest.Cluster,
	} {
		t.Run(name, func(t *testing.T) {
			cfg := mustParse(t, yaml)
			addr := addrs(t)
			prefix := fmt.Sprintf("rls%d:", time.Now().UnixNano())
			var clients []rlsv3.RateLimitServiceClient
			for range 3 {
				c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addr, DisableCache: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(c.Close)
				st, err := limiterredis.New(c, prefix, 1000)
				if err != nil {
					t.Fatal(err)
				}
				clients = append(clients, serve(t, limiter.NewService(st), cfg))
			}
			req := func(hits uint64) *rlsv3.RateLimitRequest {
				r := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "u"), desc("route", "/r"), desc("global", "g")}}
				for _, d := range r.Descriptors {
					d.HitsAddend = wrapperspb.UInt64(hits)
				}
				return r
			}
			const calls = 600
			results := make(chan error, calls)
			var admitted atomic.Int64
			for i := range calls {
				go func() {
					resp, err := clients[i%3].ShouldRateLimit(context.Background(), req(1))
					if err == nil && resp.OverallCode == ok {
						admitted.Add(1)
					}
					results <- err
				}()
			}
			for range calls {
				if err := <-results; err != nil {
					t.Fatal(err)
				}
			}
			if got := admitted.Load(); got != 120 {
				t.Errorf("admitted %d of %d, want exactly 120", got, calls)
			}
			resp, err := clients[0].ShouldRateLimit(t.Context(), req(0))
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []uint32{0, 80, 180} {
				if got := resp.Statuses[i].LimitRemaining; got != want {
					t.Errorf("descriptor %d: %d left, want %d", i, got, want)
				}
			}
		})
	}
}
