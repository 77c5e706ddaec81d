package rls

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/keystest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// modelConfig is the configuration of the model test: per-value rules of
// both algorithms, a fixed value that overrides its key's default, a
// nested rule, a wildcard, an unlimited rule, a limit of 0 and a
// shadow-mode rule.
const modelConfig = `domain: m
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: a
    value: vip
    rate_limit: {unit: second, requests_per_unit: 20, burst: 8}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: sliding_log}
  - key: c
    value: x
    descriptors:
      - key: d
        rate_limit: {unit: second, requests_per_unit: 3}
  - key: w
    value: p*
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: u
    rate_limit: {unlimited: true}
  - key: z
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: s
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 3}
`

// modelRule is the reference's reading of modelConfig: which rule a
// descriptor falls under, written out by hand for this configuration
// rather than by walking a tree.
type modelRule struct {
	name      string // "" for none
	policy    limiter.Policy
	unlimited bool
	zero      bool
	shadow    bool
}

func modelRuleOf(entries []Entry) modelRule {
	one := func(k string) (string, bool) {
		if len(entries) == 1 && entries[0].Key == k {
			return entries[0].Value, true
		}
		return "", false
	}
	if v, ok := one("a"); ok {
		if v == "vip" {
			return modelRule{name: "a_vip", policy: limiter.Policy{Limit: 20, Period: time.Second, Burst: 8}}
		}
		return modelRule{name: "a", policy: limiter.Policy{Limit: 5, Period: time.Second}}
	}
	if _, ok := one("b"); ok {
		return modelRule{name: "b", policy: limiter.Policy{Limit: 4, Period: time.Minute, Algorithm: limiter.SlidingLog}}
	}
	if len(entries) == 2 && entries[0] == (Entry{"c", "x"}) && entries[1].Key == "d" {
		return modelRule{name: "c_x.d", policy: limiter.Policy{Limit: 3, Period: time.Second}}
	}
	if v, ok := one("w"); ok && strings.HasPrefix(v, "p") {
		return modelRule{name: "w_p*", policy: limiter.Policy{Limit: 6, Period: time.Second}}
	}
	if _, ok := one("u"); ok {
		return modelRule{name: "u", unlimited: true}
	}
	if _, ok := one("z"); ok {
		return modelRule{name: "z", zero: true}
	}
	if _, ok := one("s"); ok {
		return modelRule{name: "s", policy: limiter.Policy{Limit: 3, Period: time.Second}, shadow: true}
	}
	return modelRule{}
}

// TestShouldRateLimitMatchesModel drives the service with random requests
// of one to three descriptors, random hits (0 to check only, or a refund
// now and then, of 0 hits too) at random instants, and holds every answer
// to a brute-force reference: the rule of each descriptor as modelRuleOf
// reads the configuration, one keystest.Model (the reference GCRA and
// sliding log) per rule and key, the request's ordinary descriptors
// granted all or nothing, each (rule, key) charged the sum of its hits,
// then its shadow-mode descriptors, all or nothing too, only when the
// request is allowed. Only the ordinary descriptors that a denied request
// cannot grant answer OVER_LIMIT.
func TestShouldRateLimitMatchesModel(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed, 3000) })
	}
}

func runModel(t *testing.T, seed uint64, steps int) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	l := limiter.NewService(memory.New(clock.Limiter(), 0))
	cfg := mustParse(t, modelConfig)
	if err := Apply(t.Context(), l, cfg); err != nil {
		t.Fatal(err)
	}
	svc, err := NewService(l, cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	models := make(map[string]*keystest.Model) // by rule and key
	modelOf := func(r modelRule, key string) *keystest.Model {
		id := r.name + "\x00" + key
		if models[id] == nil {
			models[id] = keystest.NewModel(r.policy, 1)
		}
		return models[id]
	}
	rng := rand.New(rand.NewPCG(seed, 0x51))
	vals := []string{"v1", "v2", "vip", "p1", "pq", "q", "x"}
	keys := []string{"a", "a", "b", "w", "u", "z", "s", "unknown"}
	var allowed, denied int
	for step := range steps {
		if rng.IntN(5) == 0 {
			clock.Advance(time.Duration(rng.Int64N(int64(400 * time.Millisecond))))
			continue
		}
		req := &rlsv3.RateLimitRequest{Domain: "m", HitsAddend: uint32(rng.IntN(3))}
		type desc struct {
			entries []Entry
			hits    int64
			refund  bool
		}
		var ds []desc
		for range 1 + rng.IntN(3) {
			var d desc
			if rng.IntN(6) == 0 {
				d.entries = []Entry{{"c", "x"}, {"d", vals[rng.IntN(2)]}}
			} else {
				d.entries = []Entry{{keys[rng.IntN(len(keys))], vals[rng.IntN(len(vals))]}}
			}
			pd := &commonv3.RateLimitDescriptor{}
			for _, e := range d.entries {
				pd.Entries = append(pd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
			}
			d.hits = max(1, int64(req.HitsAddend))
			switch rng.IntN(8) {
			case 0:
				d.hits = 0
				pd.HitsAddend = wrapperspb.UInt64(0)
			case 1:
				d.hits = 1 + rng.Int64N(4)
				pd.HitsAddend = wrapperspb.UInt64(uint64(d.hits))
			case 2:
				d.refund, pd.IsNegativeHits = true, true
			case 3:
				// A refund of 0 hits only checks.
				d.hits = 0
				pd.HitsAddend, pd.IsNegativeHits = wrapperspb.UInt64(0), true
			}
			ds = append(ds, d)
			req.Descriptors = append(req.Descriptors, pd)
		}
		resp, err := svc.ShouldRateLimit(t.Context(), req)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		now := clock.Wall().UnixNano()

		// The reference: the ordinary descriptors that hit, summed by rule
		// and key, all or nothing; the shadow-mode ones likewise.
		sums, shadowSums := make(map[string]int64), make(map[string]int64)
		rules := make(map[string]modelRule)
		ok := true
		for _, d := range ds {
			r := modelRuleOf(d.entries)
			if r.name == "" || r.unlimited || d.refund || d.hits == 0 {
				continue
			}
			if r.zero {
				ok = false
				continue
			}
			id := r.name + "\x00" + Key(d.entries, values(d.entries))
			if r.shadow {
				shadowSums[id] += d.hits
			} else {
				sums[id] += d.hits
			}
			rules[id] = r
		}
		fits := func(id string, n int64) bool {
			key := strings.SplitN(id, "\x00", 2)[1]
			av, _ := modelOf(rules[id], key).Available(key, now)
			return n <= keystest.Capacity(rules[id].policy) && av.Remaining >= n
		}
		for id, n := range sums {
			ok = ok && fits(id, n)
		}
		shadowOK := true
		for id, n := range shadowSums {
			shadowOK = shadowOK && fits(id, n)
		}
		// The code of each descriptor, before anything is charged.
		wantCodes := make([]rlsv3.RateLimitResponse_Code, len(ds))
		for i, d := range ds {
			r := modelRuleOf(d.entries)
			switch {
			case r.name == "" || r.unlimited || r.shadow || d.refund || d.hits == 0:
				wantCodes[i] = rlsv3.RateLimitResponse_OK
			case r.zero:
				wantCodes[i] = rlsv3.RateLimitResponse_OVER_LIMIT
			default:
				id := r.name + "\x00" + Key(d.entries, values(d.entries))
				wantCodes[i] = rlsv3.RateLimitResponse_OK
				if !ok && !fits(id, sums[id]) {
					wantCodes[i] = rlsv3.RateLimitResponse_OVER_LIMIT
				}
			}
		}
		for i, st := range resp.Statuses {
			if st.Code != wantCodes[i] {
				t.Fatalf("step %d: %v: descriptor %d %v: %v, the model %v", step, req, i, ds[i].entries, st.Code, wantCodes[i])
			}
		}
		want := rlsv3.RateLimitResponse_OK
		if !ok {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != want {
			t.Fatalf("step %d: %v: %v, the model %v (sums %v)", step, req, resp.OverallCode, want, sums)
		}
		if ok {
			allowed++
			if !shadowOK {
				clear(shadowSums)
			}
			for _, charged := range []map[string]int64{sums, shadowSums} {
				for id, n := range charged {
					key := strings.SplitN(id, "\x00", 2)[1]
					if d, _ := modelOf(rules[id], key).Acquire(key, now, n); !d.Allowed {
						t.Fatalf("step %d: the model denies %s %d, which fit", step, id, n)
					}
				}
			}
		} else {
			denied++
		}
		// Every descriptor with a limit reports what its key holds after
		// its decision: the others' after the verdict, the refunds'
		// after the refunds, which apply whatever the verdict, after it.
		check := func(refunds bool) {
			for i, d := range ds {
				r := modelRuleOf(d.entries)
				if d.refund != refunds || r.name == "" || r.unlimited {
					continue
				}
				st := resp.Statuses[i]
				key := Key(d.entries, values(d.entries))
				var av limiter.Availability // a limit of 0 has nothing, ever
				if !r.zero {
					av, _ = modelOf(r, key).Available(key, now)
				}
				if int64(st.LimitRemaining) != av.Remaining || st.CurrentLimit.GetRequestsPerUnit() != uint32(r.policy.Limit) {
					t.Fatalf("step %d: %v: descriptor %d %v: %d left of %d, the model %d of %d", step, req, i, d.entries, st.LimitRemaining, st.CurrentLimit.GetRequestsPerUnit(), av.Remaining, r.policy.Limit)
				}
			}
		}
		check(false)
		for _, d := range ds {
			r := modelRuleOf(d.entries)
			if !d.refund || r.name == "" || r.unlimited || r.zero {
				continue
			}
			key := Key(d.entries, values(d.entries))
			modelOf(r, key).Refund(key, now, d.hits)
		}
		check(true)
	}
	if allowed < steps/10 || denied < steps/10 {
		t.Errorf("%d allowed and %d denied of %d steps: the test does not cover both", allowed, denied, steps)
	}
}
