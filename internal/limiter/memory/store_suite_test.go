package memory_test

import (
	"testing"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	"github.com/ratelimiter/ratelimiter/internal/limiter/storetest"
)

// TestStoreSuite runs the behavioural suite every Store passes, on the real
// clock.
func TestStoreSuite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) limiter.Store { return memory.New(nil, 0) })
}

// storeOnly hides the store's AcquireBatch, so that a Service decides a
// batch one Acquire at a time, as it does over any Store that is not a
// BatchStore.
type storeOnly struct{ limiter.Store }

// TestStoreSuiteWithoutBatch runs the suite with batches decided one
// acquisition at a time by the Service.
func TestStoreSuiteWithoutBatch(t *testing.T) {
	storetest.Run(t, func(t *testing.T) limiter.Store { return storeOnly{memory.New(nil, 0)} })
}

// TestStoreBound runs the checks of the bound on the number of limiters.
func TestStoreBound(t *testing.T) {
	storetest.RunBound(t, func(t *testing.T, maxLimiters int) (limiter.Store, limiter.Store) {
		s := memory.New(nil, maxLimiters)
		return s, s
	})
}
