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

func newStore(t *testing.T) (*memory.Store, *clocktest.Clock) {
	t.Helper()
	c := clocktest.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	return memory.New(c.Limiter(), 0), c
}

func put(t *testing.T, s *memory.Store, name string, p limiter.Policy) bool {
	t.Helper()
	return putDef(t, s, limiter.Definition{Name: name, Policy: p})
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	s, c := newStore(t)
	p := limiter.Policy{Limit: 9, Period: time.Minute}
	if !put(t, s, "a", p) {
		t.Error("first Put: got created=false, want true")
	}
	def, err := s.Get(ctx, "a")
	if err != nil || def.Policy != p.Normalize() {
		t.Errorf("Get: got %+v, %v, want %+v", def, err, p.Normalize())
	}
	if d, _ := s.Acquire(ctx, "a", 5); !d.Allowed {
		t.Fatalf("Acquire 5: got %+v", d)
	}
	// Re-applying the same policy keeps the state: a configuration push must
	// not hand out a fresh limit.
	if put(t, s, "a", p) {
		t.Error("second Put: got created=true, want false")
	}
	if a, _ := s.Available(ctx, "a"); a.Remaining != 4 {
		t.Errorf("after identical Put: available %d, want 4", a.Remaining)
	}
	// A different policy starts full.
	put(t, s, "a", limiter.Policy{Limit: 20, Period: time.Minute})
	if a, _ := s.Available(ctx, "a"); a.Remaining != 20 {
		t.Errorf("after new policy: available %d, want 20", a.Remaining)
	}
	// The injected clock drives refills.
	s.Acquire(ctx, "a", 20)
	c.Advance(30 * time.Second)
	if a, _ := s.Available(ctx, "a"); a.Remaining != 10 {
		t.Errorf("30s later: available %d, want 10", a.Remaining)
	}
	if err := s.Delete(ctx, "a"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	for name, err := range map[string]error{
		"Get":       func() error { _, err := s.Get(ctx, "a"); return err }(),
		"Acquire":   func() error { _, err := s.Acquire(ctx, "a", 1); return err }(),
		"Available": func() error { _, err := s.Available(ctx, "a"); return err }(),
		"Delete":    s.Delete(ctx, "a"),
	} {
		if !errors.Is(err, limiter.ErrNotFound) {
			t.Errorf("%s after Delete: got %v, want ErrNotFound", name, err)
		}
	}
}

func TestListPages(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	var want []string
	for i := range 25 {
		name := fmt.Sprintf("l%02d", (i*7)%25) // out of order
		put(t, s, name, limiter.Policy{Limit: 1, Period: time.Second})
	}
	for i := range 25 {
		want = append(want, fmt.Sprintf("l%02d", i))
	}
	s.Delete(ctx, "l13")
	want = append(want[:13], want[14:]...)
	var got []string
	after := ""
	for {
		page, err := s.List(ctx, after, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 10 {
			t.Fatalf("page of %d, want at most 10", len(page))
		}
		for _, d := range page {
			got = append(got, d.Name)
		}
		if len(page) < 10 {
			break
		}
		after = page[len(page)-1].Name
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("listed %v, want %v", got, want)
	}
}

func TestPutRejectsInvalidPolicy(t *testing.T) {
	s, _ := newStore(t)
	_, err := s.Put(context.Background(), limiter.Definition{Name: "a", Policy: limiter.Policy{Limit: 0, Period: time.Second}})
	if !errors.Is(err, limiter.ErrInvalidPolicy) {
		t.Errorf("Put: got %v, want ErrInvalidPolicy", err)
	}
	if _, err := s.Get(context.Background(), "a"); !errors.Is(err, limiter.ErrNotFound) {
		t.Errorf("Get after rejected Put: got %v, want ErrNotFound", err)
	}
}
