// Package storetest is the behavioural suite every limiter.Store must pass,
// whatever keeps its state: definitions (put, get, list, delete, replace),
// decisions (all or nothing, Available without consuming, both algorithms,
// capacity), batches of acquisitions, joint decisions and groups,
// concurrency and replenishment, keyed limiters.
//
// A shared store reads the time from its server, so the suite never injects
// a clock. It uses long periods (an hour) wherever nothing may replenish
// during a test, and short ones (a few hundred milliseconds) only to see
// permits come back, checking each answer against the instants measured
// around its call (see Elapsed): a slow machine widens those bounds, so the
// checks neither flake nor pass vacuously. Stores with an injected clock
// check the same behaviour at exact instants in their own tests.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Run runs the suite. newStore must return a new, empty store on every call,
// released by t's cleanup; the subtests run in parallel, each on its own
// store.
func Run(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	tests := []struct {
		name string
		run  func(t *testing.T, s limiter.Store)
	}{
		{"Lifecycle", testLifecycle},
		{"NotFound", testNotFound},
		{"ListPages", testListPages},
		{"ReplaceKeepsOrResetsState", testReplace},
		{"DeleteThenPutStartsFull", testDeleteThenPut},
		{"DeleteIdle", testDeleteIdle},
		{"InvalidInput", testInvalidInput},
		{"AllOrNothing", testAllOrNothing},
		{"AvailableNeverConsumes", testAvailableNeverConsumes},
		{"GCRADecisionFields", testGCRAFields},
		{"SlidingLogDecisionFields", testSlidingLogFields},
		{"ExceedsCapacity", testExceedsCapacity},
		{"LimitersAreIndependent", testIndependent},
		{"ConcurrentAcquire", testConcurrentAcquire},
		{"Replenishment", testReplenishment},
		{"Batch", testBatch},
		{"ConcurrentBatches", testConcurrentBatches},
		{"Decide", testDecide},
		{"DecideRefusals", testDecideRefusals},
		{"Groups", testGroups},
		{"ConcurrentDecide", testConcurrentDecide},
		{"ChargeRefund", testChargeRefund},
		{"Once", testOnce},
		{"ConcurrentOnce", testConcurrentOnce},
		{"Reservations", testReservations},
		{"ConcurrentSettle", testConcurrentSettle},
		{"SettleAfterRedefinition", testSettleAfterRedefinition},
		{"SettleGivesBackOnlyWhatIsHeld", testSettleHeld},
		{"Keyed", testKeyed},
		{"KeyBudget", testKeyBudget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, newStore(t))
		})
	}
}

// hour is the period of every limiter that must not replenish during a test.
const hour = time.Hour

var algorithms = []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func put(t *testing.T, s limiter.Store, name string, p limiter.Policy) bool {
	t.Helper()
	created, err := s.Put(ctx(t), limiter.Definition{Name: name, Policy: p})
	if err != nil {
		t.Fatalf("Put(%q, %+v): %v", name, p, err)
	}
	return created
}

func acquire(t *testing.T, s limiter.Store, name string, n int64) limiter.Decision {
	t.Helper()
	d, err := s.Acquire(ctx(t), name, n)
	if err != nil {
		t.Fatalf("Acquire(%q, %d): %v", name, n, err)
	}
	return d
}

func available(t *testing.T, s limiter.Store, name string) limiter.Availability {
	t.Helper()
	a, err := s.Available(ctx(t), name)
	if err != nil {
		t.Fatalf("Available(%q): %v", name, err)
	}
	return a
}

func wantRemaining(t *testing.T, s limiter.Store, name string, want int64) {
	t.Helper()
	if got := available(t, s, name).Remaining; got != want {
		t.Errorf("Available(%q).Remaining: got %d, want %d", name, got, want)
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want one wrapping %v", what, err, want)
	}
}

// testDeleteIdle: DeleteIdle deletes a limiter only while it holds no
// counts, and leaves one that holds some as it is, counts included.
func testDeleteIdle(t *testing.T, s limiter.Store) {
	d, ok := s.(limiter.IdleDeleter)
	if !ok {
		t.Skipf("%T does not delete idle limiters", s)
	}
	for _, alg := range algorithms {
		for _, keyed := range []bool{false, true} {
			name := fmt.Sprintf("idle-%s-%v", alg, keyed)
			if _, err := s.Put(ctx(t), limiter.Definition{Name: name, Keyed: keyed, Policy: limiter.Policy{Limit: 5, Period: hour, Algorithm: alg}}); err != nil {
				t.Fatal(err)
			}
			item := []limiter.Item{{Name: name, Permits: 2}}
			if keyed {
				item[0].Key = "k"
			}
			if v, err := s.Decide(ctx(t), item, limiter.Take, ""); err != nil || !v.Allowed {
				t.Fatalf("%s: take 2: %+v, %v", name, v, err)
			}
			wantErr(t, name+": DeleteIdle holding counts", d.DeleteIdle(ctx(t), name), limiter.ErrNotIdle)
			if v, err := s.Decide(ctx(t), item, limiter.Peek, ""); err != nil || v.Checks[0].Remaining != 3 {
				t.Errorf("%s: after DeleteIdle refused: got %+v, %v, want 3 left", name, v, err)
			}
			if _, err := s.Decide(ctx(t), item, limiter.Refund, ""); err != nil {
				t.Fatal(err)
			}
			if err := d.DeleteIdle(ctx(t), name); err != nil {
				t.Errorf("%s: DeleteIdle when full again: %v", name, err)
			}
			_, err := s.Get(ctx(t), name)
			wantErr(t, name+": Get after DeleteIdle", err, limiter.ErrNotFound)
			wantErr(t, name+": DeleteIdle again", d.DeleteIdle(ctx(t), name), limiter.ErrNotFound)
		}
	}
}
