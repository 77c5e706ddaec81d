package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// testNoScript empties the server's script cache: every script still runs,
// through EVAL, and is cached again.
func testNoScript(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		name := "n-" + string(alg)
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		if created, err := s.Put(ctx, limiter.Definition{Name: name, Policy: limiter.Policy{Limit: 3, Period: time.Hour, Algorithm: alg}}); err != nil || !created {
			t.Fatalf("Put after SCRIPT FLUSH: got %v, %v", created, err)
		}
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		if d, err := s.Acquire(ctx, name, 2); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("Acquire after SCRIPT FLUSH: got %+v, %v, want allowed with 1 remaining", d, err)
		}
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		if a, err := s.Available(ctx, name); err != nil || a.Remaining != 1 {
			t.Fatalf("Available after SCRIPT FLUSH: got %+v, %v, want 1 remaining", a, err)
		}
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		if err := s.Delete(ctx, name); err != nil {
			t.Fatalf("Delete after SCRIPT FLUSH: %v", err)
		}
	}
	// The fallback's EVAL cached the script: EVALSHA works again.
	if _, err := s.Put(ctx, limiter.Definition{Name: "again", Policy: limiter.Policy{Limit: 1, Period: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	sha := sha1Hex(libLua + "\n" + acquireLua)
	exists, err := c.Do(ctx, c.B().ScriptExists().Sha1(sha).Build()).AsIntSlice()
	if err != nil || len(exists) != 1 {
		t.Fatalf("SCRIPT EXISTS: %v, %v", exists, err)
	}
	if _, err := s.Acquire(ctx, "again", 1); err != nil {
		t.Fatal(err)
	}
	if exists, _ := c.Do(ctx, c.B().ScriptExists().Sha1(sha).Build()).AsIntSlice(); exists[0] != 1 {
		t.Errorf("the acquire script is not cached after a call")
	}
}

func sha1Hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// testExpiry: a state key lives exactly as long as its limiter is not full,
// at the server's own time, and a definition never expires.
func testExpiry(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	pttl := func(key string) time.Duration {
		t.Helper()
		ms, err := c.Do(ctx, c.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PTTL %s: %v", key, err)
		}
		return time.Duration(ms) * time.Millisecond
	}
	put(t, s, "g", limiter.Policy{Limit: 10, Period: time.Hour})
	put(t, s, "s", limiter.Policy{Limit: 10, Period: time.Hour, Algorithm: limiter.SlidingLog})
	d, err := s.Acquire(ctx, "g", 3)
	if err != nil {
		t.Fatal(err)
	}
	// The reply's ResetAfter is the TAT's distance; the key's TTL is the
	// same instant rounded up to a millisecond, read a moment later.
	if ttl := pttl(s.stateKey("g")); ttl > d.ResetAfter+time.Millisecond || ttl < d.ResetAfter-time.Minute {
		t.Errorf("GCRA state TTL %s, want about ResetAfter %s", ttl, d.ResetAfter)
	}
	if _, err := s.Acquire(ctx, "s", 3); err != nil {
		t.Fatal(err)
	}
	// The expiry is an instant rounded up to a millisecond: up to 1ms over.
	if ttl := pttl(s.stateKey("s")); ttl > time.Hour+time.Millisecond || ttl < time.Hour-time.Minute {
		t.Errorf("sliding log state TTL %s, want about an hour", ttl)
	}
	for _, name := range []string{"g", "s"} {
		if ttl := pttl(s.defKey(name)); ttl != -time.Millisecond {
			t.Errorf("definition %s has a TTL %s, want none (-1)", name, ttl)
		}
	}
	// Denials write nothing: the TTL does not move.
	before := pttl(s.stateKey("g"))
	if d, err := s.Acquire(ctx, "g", 8); err != nil || d.Allowed {
		t.Fatalf("Acquire 8 of 7: got %+v, %v, want denied", d, err)
	}
	if after := pttl(s.stateKey("g")); after > before {
		t.Errorf("a denial moved the TTL from %s to %s", before, after)
	}

	// With a short period the state key is gone once the limiter is full.
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		name := "short-" + string(alg)
		put(t, s, name, limiter.Policy{Limit: 5, Period: 50 * time.Millisecond, Algorithm: alg})
		if _, err := s.Acquire(ctx, name, 5); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, err := c.Do(ctx, c.B().Exists().Key(s.stateKey(name)).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: state key still there 5s after the limiter was full again", alg)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if a, err := s.Available(ctx, name); err != nil || a.Remaining != 5 {
			t.Errorf("%s: Available after expiry: got %+v, %v, want 5", alg, a, err)
		}
	}
}

// testListSkipsStaleNames: a name whose definition is gone (an interrupted
// Delete) is not listed, and the page is still filled.
func testListSkipsStaleNames(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	s := newStore(t, c)
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		put(t, s, name, limiter.Policy{Limit: 1, Period: time.Hour})
	}
	for _, name := range []string{"b", "c"} {
		if err := c.Do(ctx, c.B().Del().Key(s.defKey(name)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	defs, err := s.List(ctx, "", 3)
	if err != nil || len(defs) != 3 || defs[0].Name != "a" || defs[1].Name != "d" || defs[2].Name != "e" {
		t.Errorf("List(3) with b and c gone: got %+v, %v, want a, d, e", defs, err)
	}
	// Delete cleans the index even when the definition is already gone.
	if err := s.Delete(ctx, "b"); !errors.Is(err, limiter.ErrNotFound) {
		t.Errorf("Delete(b): got %v, want ErrNotFound", err)
	}
	if n, _ := c.Do(ctx, c.B().Zcard().Key(s.names).Build()).AsInt64(); n != 4 {
		t.Errorf("index holds %d names after deleting a stale one, want 4", n)
	}
}

// TestUnavailable stops the server, or freezes it: every call fails within
// its context's deadline with an error wrapping limiter.ErrUnavailable, and
// nothing panics.
func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(*redistest.Server, testing.TB)
	}{
		{"Stopped", (*redistest.Server).Stop},
		{"Frozen", (*redistest.Server).Pause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartStandalone(t)
			c := newClient(t, srv.Addr)
			s := newStore(t, c)
			put(t, s, "u", limiter.Policy{Limit: 1, Period: time.Hour})
			tc.fail(srv, t)
			checkUnavailable(t, s)
		})
	}
}

func checkUnavailable(t *testing.T, s *Store) {
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Acquire", func(ctx context.Context) error { _, err := s.Acquire(ctx, "u", 1); return err }},
		{"Available", func(ctx context.Context) error { _, err := s.Available(ctx, "u"); return err }},
		{"Put", func(ctx context.Context) error {
			_, err := s.Put(ctx, limiter.Definition{Name: "u", Policy: limiter.Policy{Limit: 2, Period: time.Hour}})
			return err
		}},
		{"Get", func(ctx context.Context) error { _, err := s.Get(ctx, "u"); return err }},
		{"List", func(ctx context.Context) error { _, err := s.List(ctx, "", 10); return err }},
		{"Delete", func(ctx context.Context) error { return s.Delete(ctx, "u") }},
	}
	const deadline = 300 * time.Millisecond
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		err := c.call(ctx)
		elapsed := time.Since(start)
		cancel()
		t.Logf("%s: %v after %s", c.name, err, elapsed.Round(time.Millisecond))
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("%s: got %v, want an error wrapping ErrUnavailable", c.name, err)
		}
		// The deadline bounds the call; the margin covers a loaded machine.
		if elapsed > deadline+2*time.Second {
			t.Errorf("%s took %s, want about the %s deadline", c.name, elapsed, deadline)
		}
	}
}

// TestWiden: a reply remembered by an idempotency key before decide.lua
// reported keys_full replays with keys_full unset, the reservation's ID
// kept at the end.
func TestWiden(t *testing.T) {
	old := []int64{2, 1, 4, 5, 0, 0, 7, 8, 0, 0, 3, 1, 2, 9, 9, 1, 0, 11, 12, 13, 14}
	want := []int64{2, 1, 4, 5, 0, 0, 7, 8, 0, 0, 0, 3, 1, 2, 9, 9, 1, 0, 0, 11, 12, 13, 14}
	if got := widen(old, 2, true); !slices.Equal(got, want) {
		t.Errorf("widen with a reservation:\n got %v\nwant %v", got, want)
	}
	if got := widen(old[:17], 2, false); !slices.Equal(got, want[:19]) {
		t.Errorf("widen:\n got %v\nwant %v", got, want[:19])
	}
	if got := widen(want[:19], 2, false); !slices.Equal(got, want[:19]) {
		t.Errorf("widen of a current reply changed it: %v", got)
	}
	// Four parts: a current reply is as long as an earlier reservation's.
	cur := make([]int64, 1+checkFields*4)
	if got := widen(cur, 4, false); len(got) != len(cur) {
		t.Errorf("widen of a current reply of 4 parts: %d values, want %d", len(got), len(cur))
	}
}
