package httpapi

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// A batch answers each acquisition as if made alone, in order, through the
// generated client: repeated acquisitions see each other, an unknown
// limiter fails only its own result, and no rate-limit headers are sent.
func TestAcquireBatch(t *testing.T) {
	e := newEnv(t, nil)
	e.put("five", client.LimiterSpec{Limit: 5, Period: "1m"})
	e.put("nine", client.LimiterSpec{Limit: 9, Period: "1m"})
	n := func(v int64) *int64 { return &v }
	res, err := e.c.AcquireBatchWithResponse(ctx, client.BatchAcquireRequest{Acquisitions: []client.BatchAcquisition{
		{Limiter: "five", Permits: n(3)},
		{Limiter: "nine"}, // one permit, by default
		{Limiter: "five", Permits: n(3)},
		{Limiter: "missing"},
		{Limiter: "five", Permits: n(2)},
		{Limiter: "five", Permits: n(6)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.JSON200 == nil {
		t.Fatalf("got %s %s, want 200", res.Status(), res.Body)
	}
	for _, h := range []string{"RateLimit", "RateLimit-Policy", "Retry-After"} {
		if v := res.HTTPResponse.Header.Get(h); v != "" {
			t.Errorf("header %s = %q, want none on a batch", h, v)
		}
	}
	type want struct {
		limiter   string
		status    int32
		allowed   bool
		permits   int64
		remaining int64
		retry     bool
		exceeds   bool
	}
	wants := []want{
		{"five", 200, true, 3, 2, false, false},
		{"nine", 200, true, 1, 8, false, false},
		{"five", 200, false, 3, 2, true, false},
		{"missing", 404, false, 0, 0, false, false},
		{"five", 200, true, 2, 0, false, false},
		{"five", 200, false, 6, 0, false, true},
	}
	got := res.JSON200.Results
	if len(got) != len(wants) {
		t.Fatalf("got %d results, want %d: %s", len(got), len(wants), res.Body)
	}
	for i, w := range wants {
		r := got[i]
		what := fmt.Sprintf("result %d (%s)", i, w.limiter)
		if r.Limiter != w.limiter || r.Status != w.status {
			t.Errorf("%s: got limiter %q status %d, want %q %d", what, r.Limiter, r.Status, w.limiter, w.status)
			continue
		}
		if w.status != http.StatusOK {
			if r.Decision != nil || r.Problem == nil || r.Problem.Status != w.status || r.Problem.Detail == nil {
				t.Errorf("%s: got %+v, want only a problem with status %d and a detail", what, r, w.status)
			}
			continue
		}
		d := r.Decision
		if d == nil || r.Problem != nil {
			t.Errorf("%s: got %+v, want only a decision", what, r)
			continue
		}
		if d.Allowed != w.allowed || d.Permits != w.permits || d.Remaining != w.remaining || (d.RetryAfterMs != nil) != w.retry || d.ExceedsCapacity != w.exceeds || d.Limit == 0 {
			t.Errorf("%s: got %+v, want allowed=%v permits=%d remaining=%d retry=%v exceeds=%v", what, *d, w.allowed, w.permits, w.remaining, w.retry, w.exceeds)
		}
	}
	if got := e.available("five"); got != 0 {
		t.Errorf("five: %d available after the batch, want 0", got)
	}
	if got := e.available("nine"); got != 8 {
		t.Errorf("nine: %d available after the batch, want 8", got)
	}
}

// The largest batch the spec allows is decided whole.
func TestAcquireBatchOfMaxSize(t *testing.T) {
	e := newEnv(t, nil)
	e.put("big", client.LimiterSpec{Limit: 600, Period: "1h"})
	items := make([]client.BatchAcquisition, 1000)
	for i := range items {
		items[i].Limiter = "big"
	}
	res, err := e.c.AcquireBatchWithResponse(ctx, client.BatchAcquireRequest{Acquisitions: items})
	if err != nil {
		t.Fatal(err)
	}
	if res.JSON200 == nil || len(res.JSON200.Results) != 1000 {
		t.Fatalf("got %s with %d bytes, want 200 with 1000 results", res.Status(), len(res.Body))
	}
	allowed := 0
	for i, r := range res.JSON200.Results {
		if r.Decision == nil {
			t.Fatalf("result %d: %+v, want a decision", i, r)
		}
		// In order: the first 600 fit, the rest do not.
		if r.Decision.Allowed != (i < 600) {
			t.Errorf("result %d: allowed = %v, want %v", i, r.Decision.Allowed, i < 600)
		}
		if r.Decision.Allowed {
			allowed++
		}
	}
	if allowed != 600 {
		t.Errorf("%d allowed, want 600", allowed)
	}
}

// Batches reuse their slices from one request to the next: concurrent
// batches of different sizes and limiters, some failing on an unknown
// limiter, each get exactly their own results, and every permit is counted
// once.
func TestConcurrentBatchesKeepTheirOwnResults(t *testing.T) {
	e := newEnv(t, nil)
	const workers, rounds = 8, 25
	for w := range workers {
		e.put(fmt.Sprintf("w%d", w), client.LimiterSpec{Limit: 1_000_000, Period: "1h"})
	}
	var wg sync.WaitGroup
	taken := make([]int64, workers)
	for w := range workers {
		wg.Go(func() {
			name := fmt.Sprintf("w%d", w)
			for r := range rounds {
				// Sizes from 1 to 400, so that a reused batch is sometimes
				// larger and sometimes smaller than the one before.
				n := 1 + (w*131+r*37)%400
				items := make([]client.BatchAcquisition, n)
				for i := range items {
					items[i] = client.BatchAcquisition{Limiter: name, Permits: ptr(int64(1 + i%3))}
				}
				items[n/2].Limiter = "missing-" + name
				res, err := e.c.AcquireBatchWithResponse(ctx, client.BatchAcquireRequest{Acquisitions: items})
				if err != nil {
					t.Error(err)
					return
				}
				if res.JSON200 == nil || len(res.JSON200.Results) != n {
					t.Errorf("%s round %d: got %s, want 200 with %d results", name, r, res.Status(), n)
					return
				}
				for i, got := range res.JSON200.Results {
					switch {
					case got.Limiter != items[i].Limiter:
						t.Errorf("%s round %d, result %d: limiter %q, want %q", name, r, i, got.Limiter, items[i].Limiter)
					case i == n/2:
						if got.Status != http.StatusNotFound || got.Decision != nil {
							t.Errorf("%s round %d, result %d: %+v, want 404 alone", name, r, i, got)
						}
					case got.Status != http.StatusOK || got.Problem != nil || got.Decision == nil:
						t.Errorf("%s round %d, result %d: %+v, want a decision alone", name, r, i, got)
					case !got.Decision.Allowed || got.Decision.Permits != *items[i].Permits:
						t.Errorf("%s round %d, result %d: %+v, want a grant of %d", name, r, i, *got.Decision, *items[i].Permits)
					default:
						taken[w] += got.Decision.Permits
					}
				}
			}
		})
	}
	wg.Wait()
	for w := range workers {
		if got := 1_000_000 - e.available(fmt.Sprintf("w%d", w)); got != taken[w] {
			t.Errorf("w%d: %d permits taken, answers granted %d", w, got, taken[w])
		}
	}
}

// The hand-written batch answer is byte for byte what the generated code
// writes.
func TestBatchAnswerMatchesGenerated(t *testing.T) {
	detail := `Limiter "a<b>&c" does not exist.`
	reqs := []limiter.Request{{Name: "a"}, {Name: "a.b_c-d"}, {Name: "z"}, {Name: "d"}, {Name: "a<b>&c"}, {Name: "e"}, {Name: "f"}, {Name: "k", Key: `user "<42>"`}, {Name: "k", Key: "é"}}
	results := []limiter.Result{
		{Decision: limiter.Decision{Allowed: true, Permits: 5, Remaining: 4, Limit: 9, ResetAfter: 33333333334}},
		{Decision: limiter.Decision{Permits: 5, Remaining: 4, Limit: 9, ResetAfter: 33333333334, RetryAfter: 6666666667}},
		{Decision: limiter.Decision{Permits: 10, Remaining: 9, Limit: 9, ExceedsCapacity: true}},
		{Decision: limiter.Degraded(1, limiter.FailOpen)},
		{Err: limiter.ErrNotFound},
		{Err: limiter.ErrUnavailable},
		{Decision: limiter.Decision{Allowed: true, Permits: limiter.MaxLimit, Limit: limiter.MaxLimit, ResetAfter: math.MaxInt64}},
		{Decision: limiter.Decision{Allowed: true, Permits: 1, Remaining: 2, Limit: 3, ResetAfter: 1e9}},
		{Decision: limiter.Decision{Permits: 1, Limit: 3, RetryAfter: 2e9, ResetAfter: 2e9}, KeysFull: true},
	}
	problems := map[int]*gen.Problem{
		4: {Type: "about:blank", Title: "Not Found", Status: 404, Detail: &detail},
		5: {Type: "about:blank", Title: "Service Unavailable", Status: 503},
	}
	for n := range len(results) + 1 {
		generated := make([]gen.BatchResult, n)
		for i := range generated {
			generated[i] = gen.BatchResult{Limiter: reqs[i].Name, Status: 200}
			if p := problems[i]; p != nil {
				generated[i].Status, generated[i].Problem = p.Status, p
				continue
			}
			d := decisionOf(results[i].Decision)
			if key := reqs[i].Key; key != "" {
				d.Key = &key
				if results[i].KeysFull {
					full := true
					d.KeysFull = &full
				}
			}
			generated[i].Decision = &d
		}
		got, want := httptest.NewRecorder(), httptest.NewRecorder()
		if err := (&batchAnswer{batch: &batch{reqs: reqs[:n], results: results[:n]}, problems: problems}).VisitAcquireBatchResponse(got); err != nil {
			t.Fatal(err)
		}
		if err := (gen.AcquireBatch200JSONResponse{Results: generated}).VisitAcquireBatchResponse(want); err != nil {
			t.Fatal(err)
		}
		// The hand-written answer also says its length, so that it is not
		// sent chunked.
		if cl := got.Header().Get("Content-Length"); cl != strconv.Itoa(got.Body.Len()) {
			t.Errorf("%d results: Content-Length %q for a body of %d bytes", n, cl, got.Body.Len())
		}
		got.Header().Del("Content-Length")
		same(t, fmt.Sprintf("%d results", n), got, want)
	}
}

// A batch's decisions are counted as many single acquisitions would be.
func TestBatchMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	e := newEnv(t, func(o *Options) { o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	e.put("seed", client.LimiterSpec{Limit: 9, Period: "1m"})
	e.put("other", client.LimiterSpec{Limit: 9, Period: "1m"})
	n := func(v int64) *int64 { return &v }
	res, err := e.c.AcquireBatchWithResponse(ctx, client.BatchAcquireRequest{Acquisitions: []client.BatchAcquisition{
		{Limiter: "seed", Permits: n(5)}, // allowed
		{Limiter: "seed", Permits: n(5)}, // denied
		{Limiter: "missing"},             // not a decision
		{Limiter: "seed", Permits: n(4)}, // allowed
		{Limiter: "other", Permits: n(2)},
		{Limiter: "seed", Permits: n(1)}, // denied
	}})
	if err != nil || res.JSON200 == nil {
		t.Fatalf("acquireBatch: %v %v", res, err)
	}
	m := collect(t, reader)
	for _, tc := range []struct {
		metric, limiter, result string
		want                    int64
	}{
		{"ratelimiter.decisions", "seed", "allowed", 2},
		{"ratelimiter.decisions", "seed", "denied", 2},
		{"ratelimiter.permits", "seed", "granted", 9},
		{"ratelimiter.permits", "seed", "denied", 6},
		{"ratelimiter.decisions", "other", "allowed", 1},
		{"ratelimiter.permits", "other", "granted", 2},
		{"ratelimiter.decisions", "missing", "denied", 0},
	} {
		if got := sum(t, m[tc.metric], attribute.String("limiter", tc.limiter), attribute.String("result", tc.result)); got != tc.want {
			t.Errorf("%s{limiter=%s,result=%s}: got %d, want %d", tc.metric, tc.limiter, tc.result, got, tc.want)
		}
	}
}
