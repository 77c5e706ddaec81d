package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func digest(token string) string {
	d := sha256.Sum256([]byte(token))
	return hex.EncodeToString(d[:])
}

func TestCheck(t *testing.T) {
	g := NewGuard([]Token{
		NewToken("ops", "ops-token", Admin),
		NewToken("envoy", "envoy-token", Decide),
		NewToken("billing", "billing-token", Adjust|Decide),
	})
	for _, tc := range []struct {
		name, auth string
		need       Scope
		want       Code // 0: allowed
		invalid    bool
	}{
		{name: "no scope needed", need: 0},
		{name: "no header", need: Decide, want: Unauthenticated},
		{name: "basic", auth: "Basic envoy-token", need: Decide, want: Unauthenticated},
		{name: "empty bearer", auth: "Bearer ", need: Decide, want: Unauthenticated},
		{name: "unknown token", auth: "Bearer nope", need: Decide, want: Unauthenticated, invalid: true},
		{name: "prefix of a token", auth: "Bearer envoy-toke", need: Decide, want: Unauthenticated, invalid: true},
		{name: "right scope", auth: "Bearer envoy-token", need: Decide},
		{name: "scheme in lower case", auth: "bearer envoy-token", need: Decide},
		{name: "wrong scope", auth: "Bearer envoy-token", need: Adjust, want: Forbidden},
		{name: "admin cannot adjust", auth: "Bearer ops-token", need: Adjust, want: Forbidden},
		{name: "one of two scopes", auth: "Bearer ops-token", need: Admin | Decide},
		{name: "second scope of a token", auth: "Bearer billing-token", need: Adjust},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := g.Check(tc.auth, tc.need)
			if tc.want == 0 {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want an *Error", err)
			}
			if e.Code != tc.want || e.Invalid != tc.invalid {
				t.Errorf("got code %d invalid %t, want %d %t", e.Code, e.Invalid, tc.want, tc.invalid)
			}
			if strings.Contains(e.Error(), "token\"") || strings.Contains(e.Error(), "-token") {
				t.Errorf("the error quotes a token: %q", e.Error())
			}
		})
	}
}

func TestOpenScopes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []Token
		want   Scope
	}{
		{name: "none", want: All},
		{name: "admin only", tokens: []Token{NewToken("a", "x", Admin)}, want: Decide | Adjust},
		{name: "every scope", tokens: []Token{NewToken("a", "x", Admin|Adjust), NewToken("b", "y", Decide)}, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGuard(tc.tokens)
			if got := g.Open(); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
			// An open scope lets every caller through, token or not.
			if tc.want&Decide != 0 {
				if err := g.Check("Bearer wrong", Decide); err != nil {
					t.Errorf("open decide: got %v, want nil", err)
				}
			}
		})
	}
	var zero *Guard
	if got := zero.Open(); got != All {
		t.Errorf("nil Guard: got %s, want %s", got, All)
	}
}

func TestParseFile(t *testing.T) {
	h := digest("envoy-token")
	for _, tc := range []struct {
		name, file, err string
	}{
		{name: "digest and token", file: "tokens:\n  - {name: envoy, sha256: " + h + ", scopes: [decide]}\n  - {name: b, token: billing-token, scopes: [adjust, decide]}\n"},
		{name: "empty list", file: "tokens: []\n"},
		{name: "no name", file: "tokens:\n  - {sha256: " + h + ", scopes: [decide]}\n", err: "token 1: no name"},
		{name: "same name", file: "tokens:\n  - {name: a, token: x, scopes: [decide]}\n  - {name: a, token: y, scopes: [decide]}\n", err: "already taken"},
		{name: "both", file: "tokens:\n  - {name: a, token: x, sha256: " + h + ", scopes: [decide]}\n", err: "both sha256 and token"},
		{name: "neither", file: "tokens:\n  - {name: a, scopes: [decide]}\n", err: "neither sha256 nor token"},
		{name: "short digest", file: "tokens:\n  - {name: a, sha256: abcd, scopes: [decide]}\n", err: "64 hexadecimal digits"},
		{name: "no scopes", file: "tokens:\n  - {name: a, token: x}\n", err: "no scopes"},
		{name: "unknown scope", file: "tokens:\n  - {name: a, token: x, scopes: [write]}\n", err: `unknown scope "write"`},
		{name: "unknown key", file: "tokens:\n  - {name: a, token: s3cret, scope: [decide]}\n", err: "invalid YAML at line 2"},
		{name: "space in token", file: "tokens:\n  - {name: a, token: \"a b\", scopes: [decide]}\n", err: "spaces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseFile([]byte(tc.file))
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("got %v, want nil", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("got %v, want an error containing %q", err, tc.err)
			case err != nil && strings.Contains(err.Error(), "s3cret"):
				t.Errorf("the error quotes the file's token: %v", err)
			}
		})
	}
}

func TestWatcherRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tokens:\n  - {name: old, sha256: " + digest("old-token") + ", scopes: [adjust]}\n")
	var log strings.Builder
	w, err := NewWatcher(Source{Path: path, Fixed: []Token{NewToken("admin-token", "admin", Admin)}},
		slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	allowed := func(token string, need Scope) bool { return w.Guard.Check("Bearer "+token, need) == nil }
	if !allowed("old-token", Adjust) || allowed("new-token", Adjust) {
		t.Fatal("before the rotation: want old-token allowed and new-token refused")
	}
	if w.Check() {
		t.Error("an unchanged file: got a reload, want none")
	}

	write("tokens:\n  - {name: new, sha256: " + digest("new-token") + ", scopes: [adjust, decide]}\n")
	if !w.Check() {
		t.Fatal("a changed file: got no reload")
	}
	if allowed("old-token", Adjust) || !allowed("new-token", Adjust) || !allowed("admin", Admin) {
		t.Error("after the rotation: want old-token refused, new-token and the fixed admin token allowed")
	}

	write("tokens:\n  - {name: broken, scopes: [adjust]}\n")
	if w.Check() {
		t.Error("a broken file: got a reload, want none")
	}
	if !allowed("new-token", Adjust) {
		t.Error("after a broken file: want the previous tokens in force")
	}
	if !strings.Contains(log.String(), "tokens not reloaded") || !strings.Contains(log.String(), "neither sha256 nor token") {
		t.Errorf("log: got %q, want the broken file's error", log.String())
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if w.Check() || !allowed("new-token", Adjust) {
		t.Error("a removed file: want no reload and the previous tokens in force")
	}

	// Dropping the last adjust token opens adjust, loudly.
	write("tokens:\n  - {name: new, sha256: " + digest("new-token") + ", scopes: [decide]}\n")
	if !w.Check() {
		t.Fatal("a changed file: got no reload")
	}
	if !strings.Contains(log.String(), "open_scopes=[adjust]") {
		t.Errorf("log: got %q, want a warning naming adjust", log.String())
	}
}

func TestRequiredNamesKnownScopes(t *testing.T) {
	for op, s := range operations {
		if s == 0 || s&^All != 0 {
			t.Errorf("%s: got %08b, want one or more of the scopes", op, s)
		}
	}
	if s, ok := Required(ShouldRateLimit); !ok || s != Decide {
		t.Errorf("ShouldRateLimit: got %s %t, want decide", s, ok)
	}
}

// BenchmarkCheck measures the check every request of a guarded scope
// takes: the token's SHA-256 and a constant-time comparison with each
// configured token; and that of an open scope, which reads no header.
func BenchmarkCheck(b *testing.B) {
	tokens := make([]Token, 0, 8)
	for i := range 8 {
		tokens = append(tokens, NewToken("t"+strings.Repeat("x", i), "token-"+strings.Repeat("y", i), Decide))
	}
	g := NewGuard(tokens)
	for _, bc := range []struct {
		name, header string
		need         Scope
	}{
		{"guarded/8 tokens", "Bearer token-yyyyyyy", Decide},
		{"open", "", Adjust},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := g.Check(bc.header, bc.need); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
