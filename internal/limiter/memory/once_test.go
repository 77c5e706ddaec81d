package memory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// TestOnceBound: the store remembers at most MaxOnce keys. Past the bound
// a new key is refused and decides nothing, while the keys remembered
// still answer their retries; once OnceTTL has passed they are forgotten,
// and new keys are taken again.
func TestOnceBound(t *testing.T) {
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	s := memory.New(clock.Limiter(), 0)
	if _, err := s.Put(ctx, limiter.Definition{Name: "b", Policy: limiter.Policy{Limit: limiter.MaxLimit, Period: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	one := []limiter.Item{{Name: "b", Permits: 1}}
	for i := range limiter.MaxOnce {
		if _, err := s.Decide(ctx, one, limiter.Take, fmt.Sprintf("k%d", i)); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	before, _ := s.Available(ctx, "b")
	if _, err := s.Decide(ctx, one, limiter.Take, "one-more"); !errors.Is(err, limiter.ErrTooManyOnce) {
		t.Fatalf("key %d: got %v, want ErrTooManyOnce", limiter.MaxOnce, err)
	}
	if v, err := s.Decide(ctx, one, limiter.Take, "k7"); err != nil || !v.Replayed {
		t.Fatalf("retry of a remembered key at the bound: got %+v, %v", v, err)
	}
	if after, _ := s.Available(ctx, "b"); after.Remaining != before.Remaining {
		t.Errorf("remaining %d, then %d: a refused or replayed decision took permits", before.Remaining, after.Remaining)
	}
	clock.Advance(limiter.OnceTTL)
	// Every shard's records have expired, though only the new keys' own
	// shards are used from here: the bound counts none of them.
	for i := range 100 {
		if _, err := s.Decide(ctx, one, limiter.Take, fmt.Sprintf("new-%d", i)); err != nil {
			t.Fatalf("new key %d after OnceTTL: %v", i, err)
		}
	}
	if v, err := s.Decide(ctx, one, limiter.Take, "k7"); err != nil || v.Replayed {
		t.Fatalf("k7 after OnceTTL: got %+v, %v, want a fresh decision", v, err)
	}
}
