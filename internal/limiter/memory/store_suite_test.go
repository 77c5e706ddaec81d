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
	storetest.Run(t, func(t *testing.T) limiter.Store { return memory.New(nil) })
}
