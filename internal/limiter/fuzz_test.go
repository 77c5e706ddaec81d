package limiter_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// FuzzGCRA checks the arithmetic at arbitrary policies, instants and permit
// counts: no panic, the remaining count stays within [0, burst], a grant
// leaves exactly n fewer permits, a denial changes nothing, and a bucket is
// full again exactly ResetAfter later.
func FuzzGCRA(f *testing.F) {
	f.Add(int64(9), int64(time.Minute), int64(0), int64(0), int64(1), int64(10), int64(5))
	f.Add(int64(limiter.MaxLimit), int64(time.Millisecond), int64(0), int64(limiter.MaxNanos), int64(limiter.MaxLimit), int64(1), int64(1))
	f.Add(int64(999_999_937), int64(limiter.MaxPeriod), int64(3), int64(-1), int64(2), int64(1<<62), int64(7))
	f.Fuzz(func(t *testing.T, limit, period, burst, now, n1, n2, step int64) {
		p := limiter.Policy{Limit: limit, Period: time.Duration(period), Burst: burst}
		if p.Validate() != nil || limiter.CheckPermits(n1) != nil || limiter.CheckPermits(n2) != nil {
			return
		}
		p = p.Normalize()
		r := limiter.NewRate(p)
		var tat limiter.TAT
		tat, d1 := r.Acquire(tat, now, n1)
		checkDecision(t, p, d1)
		later := now + max(step, 0)%int64(p.Period)
		before := r.Available(tat, later)
		tat2, d2 := r.Acquire(tat, later, n2)
		checkDecision(t, p, d2)
		after := r.Available(tat2, later)
		if d2.Allowed && after.Remaining != before.Remaining-n2 {
			t.Fatalf("grant of %d: remaining %d -> %d", n2, before.Remaining, after.Remaining)
		}
		if !d2.Allowed && tat2 != tat {
			t.Fatalf("denial changed the state: %+v -> %+v", tat, tat2)
		}
		if !d2.Allowed && after.Remaining >= n2 {
			t.Fatalf("denied %d with %d available", n2, after.Remaining)
		}
		// Past MaxNanos time stands still, so the bucket cannot refill there.
		if d2.Allowed && d2.ResetAfter > 0 && clamp(later) <= limiter.MaxNanos-int64(d2.ResetAfter) {
			full := clamp(later) + int64(d2.ResetAfter)
			if got := r.Available(tat2, full).Remaining; got != p.Burst {
				t.Fatalf("ResetAfter %s later: remaining %d, want %d", d2.ResetAfter, got, p.Burst)
			}
		}
	})
}

func clamp(now int64) int64 { return min(max(now, 0), limiter.MaxNanos) }

func checkDecision(t *testing.T, p limiter.Policy, d limiter.Decision) {
	t.Helper()
	if d.Remaining < 0 || d.Remaining > p.Burst {
		t.Fatalf("remaining %d outside [0, %d]", d.Remaining, p.Burst)
	}
	if d.ExceedsCapacity != (d.Permits > p.Burst) {
		t.Fatalf("ExceedsCapacity %v for %d of burst %d", d.ExceedsCapacity, d.Permits, p.Burst)
	}
	if d.RetryAfter < 0 || d.RetryAfter > p.Period || d.ResetAfter < 0 || d.ResetAfter > p.Period {
		t.Fatalf("times out of range: %+v (period %s)", d, p.Period)
	}
	if !d.Allowed && !d.ExceedsCapacity && d.RetryAfter == 0 {
		t.Fatalf("retryable denial without a retry time: %+v", d)
	}
}

// FuzzParsePeriod: no panic; an accepted period is in range and round-trips
// through FormatPeriod.
func FuzzParsePeriod(f *testing.F) {
	for _, s := range []string{"100s", "1m", "1h30m", "1ms", "8784h", "0", "-1s", "1d", "9223372036854775807ns", "1e3s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := limiter.ParsePeriod(s)
		if err != nil {
			if !errors.Is(err, limiter.ErrInvalidPolicy) {
				t.Fatalf("ParsePeriod(%q): error %v does not wrap ErrInvalidPolicy", s, err)
			}
			return
		}
		if d < limiter.MinPeriod || d > limiter.MaxPeriod {
			t.Fatalf("ParsePeriod(%q) = %s, out of range", s, d)
		}
		back, err := limiter.ParsePeriod(limiter.FormatPeriod(d))
		if err != nil || back != d {
			t.Fatalf("round trip of %q: %s -> %q -> %s, %v", s, d, limiter.FormatPeriod(d), back, err)
		}
	})
}

// FuzzCheckName: no panic; accepted names are short printable ASCII that
// needs no escaping in a URL path segment.
func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"google-read", "", "a/b", "-x", "ä", "a.b_c-d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if limiter.CheckName(s) != nil {
			return
		}
		if len(s) == 0 || len(s) > limiter.MaxNameLen {
			t.Fatalf("accepted %q of length %d", s, len(s))
		}
		for _, c := range []byte(s) {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
			if !ok {
				t.Fatalf("accepted %q with byte %q", s, c)
			}
		}
	})
}

// FuzzParseReservationID: any text either parses to a scope and a random
// part from which NewReservationID's format gives the text back (a key
// of a keyed limiter valid, and its base64url canonical), or is refused
// with ErrInvalidReservation; it never panics.
func FuzzParseReservationID(f *testing.F) {
	for _, seed := range []string{
		limiter.NewReservationID("g:checkout"), limiter.NewReservationID("l:a.b-c_d"),
		limiter.NewReservationID("k:per.user\x00alice: user/1"), "k.a.YQ.00000000000000000000000000000000", "k.a.YR.00000000000000000000000000000000", "k.a.AA.00000000000000000000000000000000",
		"", "g.", "g..0", "x.a.00000000000000000000000000000000", "g.-a.00000000000000000000000000000000",
		"l.a.0000000000000000000000000000000g", "g.a.b.00000000000000000000000000000000",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		scope, random, err := limiter.ParseReservationID(id)
		if err != nil {
			if !errors.Is(err, limiter.ErrInvalidReservation) {
				t.Fatalf("ParseReservationID(%q): %v, want ErrInvalidReservation", id, err)
			}
			return
		}
		kind, where, ok := strings.Cut(scope, ":")
		name, key, keyed := strings.Cut(where, "\x00")
		if !ok || (kind != "g" && kind != "l" && kind != "k") || keyed != (kind == "k") || !limiter.ValidName(name) || len(random) != 32 {
			t.Fatalf("ParseReservationID(%q) = %q, %q", id, scope, random)
		}
		if keyed {
			if err := limiter.CheckKey(key); err != nil {
				t.Fatalf("ParseReservationID(%q) = %q, whose key is invalid: %v", id, scope, err)
			}
			where = name + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
		}
		if again := kind + "." + where + "." + random; again != id {
			t.Fatalf("ParseReservationID(%q) = %q, %q, which format as %q", id, scope, random, again)
		}
	})
}

// FuzzCheckKey holds CheckKey to its rule, written out rune by rune: 1 to
// MaxKeyLen bytes of valid UTF-8, none of them a C0 or C1 control
// character or DEL. So an accepted key never holds the NUL that
// Fingerprint and Scope put between a name and its key.
func FuzzCheckKey(f *testing.F) {
	for _, s := range []string{"user-42", "", "a\x00b", "\x7f", "\u0085", "é", "\xff", strings.Repeat("k", limiter.MaxKeyLen), strings.Repeat("é", 65), "/v1/search?q=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := len(key) >= 1 && len(key) <= limiter.MaxKeyLen
		for i, r := range key {
			if r == '\uFFFD' && !strings.HasPrefix(key[i:], "\uFFFD") {
				want = false // invalid UTF-8
			}
			if r < 0x20 || r >= 0x7f && r <= 0x9f {
				want = false
			}
		}
		err := limiter.CheckKey(key)
		if got := err == nil; got != want {
			t.Fatalf("CheckKey(%q) = %v, want accepted %v", key, err, want)
		}
		if err != nil && !errors.Is(err, limiter.ErrInvalidKey) {
			t.Fatalf("CheckKey(%q) = %v, want it to wrap ErrInvalidKey", key, err)
		}
		if err == nil && strings.IndexByte(key, 0) >= 0 {
			t.Fatalf("CheckKey(%q) accepted a NUL", key)
		}
	})
}
