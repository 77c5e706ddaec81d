package storetest

import (
	"errors"
	"sync"
	"testing"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// A batch decides each acquisition as if it were made alone, in order:
// repeated acquisitions on one limiter see each other, an unknown limiter
// or invalid input fails only its own result, and nothing else is touched.
func testBatch(t *testing.T, s limiter.Store) {
	svc := limiter.NewService(s)
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			a, b := "batch-a-"+string(alg), "batch-b-"+string(alg)
			put(t, s, a, limiter.Policy{Limit: 5, Period: hour, Algorithm: alg})
			put(t, s, b, limiter.Policy{Limit: 9, Period: hour, Algorithm: alg})
			reqs := []limiter.Request{
				{Name: a, Permits: 3},
				{Name: b, Permits: 9},
				{Name: a, Permits: 3}, // 2 left: denied
				{Name: "batch-missing", Permits: 1},
				{Name: a, Permits: 2},
				{Name: b, Permits: 1}, // 0 left: denied
				{Name: a, Permits: 0}, // invalid
				{Name: a, Permits: 6}, // more than it can ever hold
			}
			// out starts dirty, as a reused slice would: every result is
			// overwritten.
			out := make([]limiter.Result, len(reqs))
			for i := range out {
				out[i] = limiter.Result{Decision: limiter.Decision{Allowed: true, Remaining: 99}, Err: errors.New("stale")}
			}
			if err := svc.AcquireBatch(ctx(t), reqs, out); err != nil {
				t.Fatalf("AcquireBatch: %v", err)
			}
			for i, want := range []struct {
				allowed   bool
				remaining int64
				err       error
			}{
				{true, 2, nil}, {true, 0, nil}, {false, 2, nil}, {false, 0, limiter.ErrNotFound},
				{true, 0, nil}, {false, 0, nil}, {false, 0, limiter.ErrInvalidPermits}, {false, 0, nil},
			} {
				got := out[i]
				if want.err != nil {
					if !errors.Is(got.Err, want.err) {
						t.Errorf("result %d (%+v): got %+v, want an error wrapping %v", i, reqs[i], got, want.err)
					}
					continue
				}
				if got.Err != nil || got.Decision.Allowed != want.allowed || got.Decision.Remaining != want.remaining || got.Decision.Permits != reqs[i].Permits {
					t.Errorf("result %d (%+v): got %+v, want allowed=%v remaining=%d", i, reqs[i], got, want.allowed, want.remaining)
				}
			}
			if !out[7].Decision.ExceedsCapacity {
				t.Errorf("result 7: got %+v, want exceeds_capacity", out[7])
			}
			wantRemaining(t, s, a, 0)
			wantRemaining(t, s, b, 0)
		})
	}
	t.Run("Size", func(t *testing.T) {
		for _, n := range []int{0, limiter.MaxBatch + 1} {
			if err := svc.AcquireBatch(ctx(t), make([]limiter.Request, n), make([]limiter.Result, n)); !errors.Is(err, limiter.ErrInvalidBatch) {
				t.Errorf("AcquireBatch of %d: got %v, want ErrInvalidBatch", n, err)
			}
		}
	})
	t.Run("ResultsLength", func(t *testing.T) {
		put(t, s, "batch-short", limiter.Policy{Limit: 5, Period: hour})
		reqs := []limiter.Request{{Name: "batch-short", Permits: 1}, {Name: "batch-short", Permits: 1}}
		if err := svc.AcquireBatch(ctx(t), reqs, make([]limiter.Result, 1)); err == nil {
			t.Error("AcquireBatch with 1 result for 2 acquisitions: got no error")
		}
		wantRemaining(t, s, "batch-short", 5)
	})
}

// Concurrent batches over one limiter grant exactly its limit between them.
func testConcurrentBatches(t *testing.T, s limiter.Store) {
	svc := limiter.NewService(s)
	const limit, batches, size = 500, 8, 100 // 800 asked for
	put(t, s, "batch-shared", limiter.Policy{Limit: limit, Period: hour, Algorithm: limiter.SlidingLog})
	reqs := make([]limiter.Request, size)
	for i := range reqs {
		reqs[i] = limiter.Request{Name: "batch-shared", Permits: 1}
	}
	var (
		mu      sync.Mutex
		granted int
		wg      sync.WaitGroup
		errs    []error
	)
	for range batches {
		wg.Go(func() {
			out := make([]limiter.Result, len(reqs))
			err := svc.AcquireBatch(ctx(t), reqs, out)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			for _, r := range out {
				switch {
				case r.Err != nil:
					errs = append(errs, r.Err)
				case r.Decision.Allowed:
					granted++
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d failures, first: %v", len(errs), errs[0])
	}
	if granted != limit {
		t.Errorf("%d batches of %d over a limit of %d granted %d, want exactly %d", batches, size, limit, granted, limit)
	}
	wantRemaining(t, s, "batch-shared", 0)
}
