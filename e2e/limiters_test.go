package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestLimiterLifecycle creates, reads, replaces and deletes a limiter.
func TestLimiterLifecycle(t *testing.T) {
	t.Parallel()
	api := sharedService(t).api
	ctx := t.Context()
	const name = "lifecycle.api_v1-x"
	path := "/v1/limiters/" + name

	missing, err := api.GetLimiterWithResponse(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, missing, http.StatusNotFound, path, "")

	created, err := api.PutLimiterWithResponse(ctx, name, client.LimiterSpec{Limit: 9, Period: "90m"})
	if err != nil {
		t.Fatal(err)
	}
	want := client.Limiter{Name: name, Limit: 9, Period: "1h30m0s", Algorithm: client.AlgorithmGcra, Burst: ptr[int64](9)}
	if created.StatusCode() != http.StatusCreated || created.JSON201 == nil {
		t.Fatalf("create: got %d %s, want 201", created.StatusCode(), created.Body)
	}
	checkLimiter(t, "create", *created.JSON201, want)
	if created.Headers201 == nil || created.Headers201.Location != path {
		t.Errorf("create: Location: got %+v, want %q", created.Headers201, path)
	}

	got, err := api.GetLimiterWithResponse(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got.JSON200 == nil {
		t.Fatalf("get: got %d %s, want 200", got.StatusCode(), got.Body)
	}
	checkLimiter(t, "get", *got.JSON200, want)

	// Replacing with the same policy, however its period is spelled,
	// answers 200 and keeps the state.
	take(t, api, name, 4, true)
	replaced, err := api.PutLimiterWithResponse(ctx, name, client.LimiterSpec{Limit: 9, Period: "1h30m"})
	if err != nil {
		t.Fatal(err)
	}
	if replaced.StatusCode() != http.StatusOK || replaced.JSON200 == nil {
		t.Fatalf("replace: got %d %s, want 200", replaced.StatusCode(), replaced.Body)
	}
	checkLimiter(t, "replace with the same policy", *replaced.JSON200, want)
	if got := available(t, api, name); got != 5 {
		t.Errorf("available after replacing with the same policy: got %d, want 5 (state kept)", got)
	}

	// A different policy starts the limiter full.
	slog := client.AlgorithmSlidingLog
	replaced, err = api.PutLimiterWithResponse(ctx, name, client.LimiterSpec{Limit: 7, Period: "1h", Algorithm: &slog})
	if err != nil {
		t.Fatal(err)
	}
	if replaced.StatusCode() != http.StatusOK || replaced.JSON200 == nil {
		t.Fatalf("replace: got %d %s, want 200", replaced.StatusCode(), replaced.Body)
	}
	want = client.Limiter{Name: name, Limit: 7, Period: "1h0m0s", Algorithm: client.AlgorithmSlidingLog}
	checkLimiter(t, "replace with another policy", *replaced.JSON200, want)
	if got := available(t, api, name); got != 7 {
		t.Errorf("available after replacing with another policy: got %d, want 7 (full)", got)
	}

	deleted, err := api.DeleteLimiterWithResponse(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if deleted.StatusCode() != http.StatusNoContent || len(deleted.Body) != 0 {
		t.Errorf("delete: got %d %q, want 204 and no body", deleted.StatusCode(), deleted.Body)
	}

	t.Run("gone after delete", func(t *testing.T) {
		get, err := api.GetLimiterWithResponse(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		p := checkProblem(t, get, http.StatusNotFound, path, "")
		if wantDetail := fmt.Sprintf("Limiter %q does not exist.", name); p.Detail == nil || *p.Detail != wantDetail {
			t.Errorf("detail: got %s, want %q", strPtr(p.Detail), wantDetail)
		}
		del, err := api.DeleteLimiterWithResponse(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		checkProblem(t, del, http.StatusNotFound, path, "")
		acq, err := api.AcquireWithResponse(ctx, name, client.AcquireRequest{})
		if err != nil {
			t.Fatal(err)
		}
		checkProblem(t, acq, http.StatusNotFound, path+"/acquire", "")
		avail, err := api.GetAvailableWithResponse(ctx, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkProblem(t, avail, http.StatusNotFound, path+"/available", "")
	})
}

// TestListLimiters pages through the limiters.
func TestListLimiters(t *testing.T) {
	t.Parallel()
	api := sharedService(t).api
	ctx := t.Context()
	// Other tests add limiters to the same server meanwhile: these names
	// are checked for, in order, among whatever else is listed.
	var mine []string
	for i := range 5 {
		name := fmt.Sprintf("list-%d", i)
		mine = append(mine, name)
		res, err := api.PutLimiterWithResponse(ctx, name, client.LimiterSpec{Limit: int64(i + 1), Period: "1m"})
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode() != http.StatusCreated {
			t.Fatalf("create %s: got %d %s, want 201", name, res.StatusCode(), res.Body)
		}
	}

	for _, size := range []int32{1, 2, 3, 1000} {
		t.Run(fmt.Sprintf("page_size=%d", size), func(t *testing.T) {
			var names []string
			params := client.ListLimitersParams{PageSize: &size}
			for pages := 0; ; pages++ {
				if pages > 1000 {
					t.Fatalf("more than 1000 pages: next_page_token never ends")
				}
				res, err := api.ListLimitersWithResponse(ctx, &params)
				if err != nil {
					t.Fatal(err)
				}
				if res.JSON200 == nil {
					t.Fatalf("list: got %d %s, want 200", res.StatusCode(), res.Body)
				}
				page := res.JSON200
				if len(page.Items) > int(size) {
					t.Fatalf("page %d: got %d items, want at most %d", pages, len(page.Items), size)
				}
				for _, l := range page.Items {
					names = append(names, l.Name)
					if i := slices.Index(mine, l.Name); i >= 0 {
						checkLimiter(t, "listed", l, client.Limiter{
							Name: l.Name, Limit: int64(i + 1), Period: "1m0s",
							Algorithm: client.AlgorithmGcra, Burst: ptr(int64(i + 1)),
						})
					}
				}
				if page.NextPageToken == nil {
					break
				}
				if len(page.Items) != int(size) {
					t.Errorf("page %d: got %d items and a next page, want %d (only the last page may be short)", pages, len(page.Items), size)
				}
				params.PageToken = page.NextPageToken
			}
			if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
				t.Errorf("names: got %q, want strictly ascending", names)
			}
			for _, name := range mine {
				if !slices.Contains(names, name) {
					t.Errorf("names: got %q, want %s among them", names, name)
				}
			}
		})
	}

	t.Run("default page size", func(t *testing.T) {
		res, err := api.ListLimitersWithResponse(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.JSON200 == nil {
			t.Fatalf("list: got %d %s, want 200", res.StatusCode(), res.Body)
		}
		if n := len(res.JSON200.Items); n > 100 || (n < 100 && res.JSON200.NextPageToken != nil) {
			t.Errorf("list: got %d items, next page %v; want at most 100, and 100 when more remain", n, res.JSON200.NextPageToken != nil)
		}
	})
}

// TestAcquire takes permits from limiters, all or nothing.
func TestAcquire(t *testing.T) {
	t.Parallel()
	api := sharedService(t).api
	ctx := t.Context()
	slog := client.AlgorithmSlidingLog
	// Periods are long enough that nothing refills during a test.
	limiters := []struct {
		name string
		spec client.LimiterSpec
	}{
		{"acquire-gcra", client.LimiterSpec{Limit: 9, Period: "1h"}},
		{"acquire-sliding", client.LimiterSpec{Limit: 9, Period: "1h", Algorithm: &slog}},
		{"acquire-burst", client.LimiterSpec{Limit: 100, Period: "24h", Burst: ptr[int64](9)}},
	}
	type step struct {
		permits       int64 // 0: no body, which takes one permit
		wantAllowed   bool
		wantRemaining int64
		wantExceeds   bool
	}
	steps := []step{
		{permits: 10, wantAllowed: false, wantRemaining: 9, wantExceeds: true},
		{permits: 5, wantAllowed: true, wantRemaining: 4},
		{permits: 5, wantAllowed: false, wantRemaining: 4},
		{permits: 4, wantAllowed: true, wantRemaining: 0},
		{permits: 1, wantAllowed: false, wantRemaining: 0},
		{permits: 10, wantAllowed: false, wantRemaining: 0, wantExceeds: true},
	}
	for _, l := range limiters {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			put(t, api, l.name, l.spec)
			for i, s := range steps {
				before := available(t, api, l.name)
				if before != available(t, api, l.name) {
					t.Fatalf("step %d: two availability queries disagree: available consumes", i)
				}
				d := acquire(t, api, l.name, s.permits)
				if d.Allowed != s.wantAllowed || d.Remaining != s.wantRemaining || d.ExceedsCapacity != s.wantExceeds || d.Permits != max(s.permits, 1) || d.Limit != l.spec.Limit {
					t.Errorf("step %d: acquire %d: got %+v, want allowed %v, remaining %d, exceeds capacity %v, permits %d, limit %d",
						i, s.permits, d, s.wantAllowed, s.wantRemaining, s.wantExceeds, max(s.permits, 1), l.spec.Limit)
				}
				switch {
				case d.Allowed && d.RetryAfterMs != nil:
					t.Errorf("step %d: retry_after_ms: got %d on a grant, want none", i, *d.RetryAfterMs)
				case d.ExceedsCapacity && d.RetryAfterMs != nil:
					t.Errorf("step %d: retry_after_ms: got %d when no wait helps, want none", i, *d.RetryAfterMs)
				case !d.Allowed && !d.ExceedsCapacity && (d.RetryAfterMs == nil || *d.RetryAfterMs < 1):
					t.Errorf("step %d: retry_after_ms: got %v on a denial that waiting fixes, want at least 1", i, d.RetryAfterMs)
				}
				after := available(t, api, l.name)
				wantAfter := before
				if s.wantAllowed {
					wantAfter -= max(s.permits, 1)
				}
				if after != wantAfter {
					t.Errorf("step %d: available: got %d after acquiring %d (allowed %v) from %d, want %d", i, after, s.permits, d.Allowed, before, wantAfter)
				}
			}
		})
	}

	t.Run("batch", func(t *testing.T) {
		t.Parallel()
		put(t, api, "batch-a", client.LimiterSpec{Limit: 5, Period: "1h"})
		put(t, api, "batch-b", client.LimiterSpec{Limit: 9, Period: "1h", Algorithm: &slog})
		items := []client.BatchAcquisition{
			{Limiter: "batch-a", Permits: ptr[int64](3)},
			{Limiter: "batch-b", Permits: ptr[int64](9)},
			{Limiter: "batch-a", Permits: ptr[int64](3)},
			{Limiter: "batch-none"},
			{Limiter: "batch-a", Permits: ptr[int64](2)},
		}
		res, err := api.AcquireBatchWithResponse(ctx, client.BatchAcquireRequest{Acquisitions: items})
		if err != nil {
			t.Fatal(err)
		}
		if res.JSON200 == nil || len(res.JSON200.Results) != len(items) {
			t.Fatalf("batch: got %d %s, want 200 with %d results", res.StatusCode(), res.Body, len(items))
		}
		for i, want := range []struct {
			status    int32
			allowed   bool
			remaining int64
		}{{200, true, 2}, {200, true, 0}, {200, false, 2}, {404, false, 0}, {200, true, 0}} {
			r := res.JSON200.Results[i]
			switch {
			case r.Limiter != items[i].Limiter || r.Status != want.status:
				t.Errorf("result %d: got %s %d, want %s %d", i, r.Limiter, r.Status, items[i].Limiter, want.status)
			case want.status != 200 && (r.Problem == nil || r.Problem.Status != want.status || r.Decision != nil):
				t.Errorf("result %d: got %+v, want a %d problem", i, r, want.status)
			case want.status == 200 && (r.Decision == nil || r.Decision.Allowed != want.allowed || r.Decision.Remaining != want.remaining):
				t.Errorf("result %d: got %+v, want allowed %v, remaining %d", i, r.Decision, want.allowed, want.remaining)
			}
		}
		if got := available(t, api, "batch-a"); got != 0 {
			t.Errorf("batch-a: %d available after the batch, want 0", got)
		}
	})

	t.Run("no body takes one permit", func(t *testing.T) {
		t.Parallel()
		const name = "acquire-empty-body"
		put(t, api, name, client.LimiterSpec{Limit: 3, Period: "1h"})
		res, err := api.AcquireWithBodyWithResponse(ctx, name, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.JSON200 == nil || !res.JSON200.Allowed || res.JSON200.Permits != 1 || res.JSON200.Remaining != 2 {
			t.Errorf("acquire without a body: got %d %s, want one permit granted, 2 remaining", res.StatusCode(), res.Body)
		}
	})
}

// checkLimiter compares a limiter in an answer with want.
func checkLimiter(t *testing.T, what string, got, want client.Limiter) {
	t.Helper()
	if got.Name != want.Name || got.Limit != want.Limit || got.Period != want.Period || got.Algorithm != want.Algorithm ||
		(got.Burst == nil) != (want.Burst == nil) || (got.Burst != nil && *got.Burst != *want.Burst) {
		t.Errorf("%s: got %s, want %s", what, fmtLimiter(got), fmtLimiter(want))
	}
}

func fmtLimiter(l client.Limiter) string {
	burst := "none"
	if l.Burst != nil {
		burst = fmt.Sprint(*l.Burst)
	}
	return fmt.Sprintf("{name %q, limit %d, period %q, algorithm %s, burst %s}", l.Name, l.Limit, l.Period, l.Algorithm, burst)
}

// put creates or replaces a limiter, failing t unless it succeeds.
func put(t *testing.T, api *client.ClientWithResponses, name string, spec client.LimiterSpec) client.Limiter {
	t.Helper()
	res, err := api.PutLimiterWithResponse(t.Context(), name, spec)
	if err != nil {
		t.Fatalf("put %s: %v", name, err)
	}
	switch {
	case res.JSON201 != nil:
		return *res.JSON201
	case res.JSON200 != nil:
		return *res.JSON200
	}
	t.Fatalf("put %s: got %d %s, want 200 or 201", name, res.StatusCode(), res.Body)
	return client.Limiter{}
}

// acquire takes permits from a limiter (one, with no body, when permits is
// 0) and returns the decision, failing t on anything but one.
func acquire(t *testing.T, api *client.ClientWithResponses, name string, permits int64) client.Decision {
	t.Helper()
	var (
		res *client.AcquireResponse
		err error
	)
	if permits == 0 {
		res, err = api.AcquireWithBodyWithResponse(t.Context(), name, "application/json", nil)
	} else {
		res, err = api.AcquireWithResponse(t.Context(), name, client.AcquireRequest{Permits: &permits})
	}
	if err != nil {
		t.Fatalf("acquire %d from %s: %v", permits, name, err)
	}
	if res.JSON200 == nil {
		t.Fatalf("acquire %d from %s: got %d %s, want 200", permits, name, res.StatusCode(), res.Body)
	}
	return *res.JSON200
}

// take acquires permits from a limiter and fails t unless the decision is
// wantAllowed.
func take(t *testing.T, api *client.ClientWithResponses, name string, permits int64, wantAllowed bool) client.Decision {
	t.Helper()
	d := acquire(t, api, name, permits)
	if d.Allowed != wantAllowed {
		t.Fatalf("acquire %d from %s: got allowed %v (%+v), want %v", permits, name, d.Allowed, d, wantAllowed)
	}
	return d
}

// available returns how many permits a limiter could grant now.
func available(t *testing.T, api *client.ClientWithResponses, name string) int64 {
	t.Helper()
	res, err := api.GetAvailableWithResponse(t.Context(), name, nil)
	if err != nil {
		t.Fatalf("available %s: %v", name, err)
	}
	if res.JSON200 == nil {
		t.Fatalf("available %s: got %d %s, want 200", name, res.StatusCode(), res.Body)
	}
	return res.JSON200.Remaining
}

// TestMaxLimiters: a service holds at most --max-limiters limiters; one more
// is refused with a 409 problem and not created, while replacing one and
// creating one after a delete still work.
func TestMaxLimiters(t *testing.T) {
	t.Parallel()
	svc := startService(t, map[string]string{"RATELIMITER_MAX_LIMITERS": "2"})
	api := svc.api
	spec := client.LimiterSpec{Limit: 5, Period: "1m"}
	put(t, api, "a", spec)
	put(t, api, "b", spec)
	res, err := api.PutLimiterWithResponse(t.Context(), "c", spec)
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, res, http.StatusConflict, "/v1/limiters/c", "")
	if get, err := api.GetLimiterWithResponse(t.Context(), "c"); err != nil || get.StatusCode() != http.StatusNotFound {
		t.Errorf("get c after the refusal: got %v %v, want 404", get.StatusCode(), err)
	}
	if l := put(t, api, "a", client.LimiterSpec{Limit: 7, Period: "1m"}); l.Limit != 7 {
		t.Errorf("replace a at the maximum: got %+v, want limit 7", l)
	}
	if del, err := api.DeleteLimiterWithResponse(t.Context(), "b"); err != nil || del.StatusCode() != http.StatusNoContent {
		t.Fatalf("delete b: got %v %v, want 204", del.StatusCode(), err)
	}
	put(t, api, "c", spec)
}
