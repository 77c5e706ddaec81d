package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// sha256Hex is the digest a tokens file holds for token.
func sha256Hex(token string) string {
	d := sha256.Sum256([]byte(token))
	return hex.EncodeToString(d[:])
}

// call sends a request with token as its bearer token (none when empty)
// and returns the status, the WWW-Authenticate header and the body.
func call(t *testing.T, method, url, token, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(b)
}

// remainingOf returns what the limiter named name holds, asked with token.
func remainingOf(t *testing.T, base, name, token string) float64 {
	t.Helper()
	code, _, body := call(t, http.MethodGet, base+"/v1/limiters/"+name+"/available", token, "")
	var a struct{ Remaining float64 }
	if err := json.Unmarshal([]byte(body), &a); err != nil || code != http.StatusOK {
		t.Fatalf("available: got %d %s, want 200", code, body)
	}
	return a.Remaining
}

const (
	opsToken     = "ops-0123456789"
	appToken     = "app-0123456789"
	billingToken = "billing-0123456789"
)

// With a token for every scope, each operation takes a token with its
// scope: a refund, charge, settlement or cancellation without an adjust
// token is refused over HTTP and gives nothing back, and so is Envoy's
// ShouldRateLimit without a decide token over gRPC.
func TestTokensGuardEveryScope(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	write(t, tokens, "tokens:\n"+
		"  - {name: ops, token: "+opsToken+", scopes: [admin]}\n"+
		"  - {name: app, sha256: "+sha256Hex(appToken)+", scopes: [decide]}\n"+
		"  - {name: billing, sha256: "+sha256Hex(billingToken)+", scopes: [adjust]}\n")
	cfg := filepath.Join(dir, "config.yaml")
	write(t, cfg, "limiters:\n  - {name: pay, limit: 5, period: 1h, group: g}\n")
	envoy := envoyConfig(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	base, stderr, done, cancel := start(t, []string{"--listen", "127.0.0.1:0", "--config", cfg, "--envoy-config", envoy, "--tokens-file", tokens}, nil)

	if code, _, body := call(t, http.MethodPost, base+"/v1/limiters/pay/acquire", appToken, `{"permits":3}`); code != http.StatusOK {
		t.Fatalf("acquire with the decide token: got %d %s, want 200", code, body)
	}
	code, _, body := call(t, http.MethodPost, base+"/v1/reservations", appToken, `{"items":[{"limiter":"pay","permits":1}]}`)
	var v struct{ Reservation string }
	if err := json.Unmarshal([]byte(body), &v); err != nil || code != http.StatusOK || v.Reservation == "" {
		t.Fatalf("reserve with the decide token: got %d %s, want 200 and a reservation", code, body)
	}
	if got := remainingOf(t, base, "pay", appToken); got != 1 {
		t.Fatalf("remaining after 4 permits taken: got %v, want 1", got)
	}

	items := `{"items":[{"limiter":"pay","permits":4}]}`
	adjust := []struct{ name, method, path, body string }{
		{"refund", http.MethodPost, "/v1/refund", items},
		{"charge", http.MethodPost, "/v1/charge", items},
		{"settle", http.MethodPost, "/v1/reservations/" + v.Reservation + "/settle", `{"items":[{"limiter":"pay","permits":0}]}`},
		{"cancel", http.MethodDelete, "/v1/reservations/" + v.Reservation, ""},
	}
	for _, op := range adjust {
		for _, tc := range []struct {
			who, token, auth string
			want             int
		}{
			{"no token", "", `Bearer realm="ratelimiter"`, http.StatusUnauthorized},
			{"an unknown token", "forged", `Bearer realm="ratelimiter", error="invalid_token"`, http.StatusUnauthorized},
			{"the decide token", appToken, `Bearer realm="ratelimiter", error="insufficient_scope", scope="adjust"`, http.StatusForbidden},
			{"the admin token", opsToken, `Bearer realm="ratelimiter", error="insufficient_scope", scope="adjust"`, http.StatusForbidden},
		} {
			code, auth, body := call(t, op.method, base+op.path, tc.token, op.body)
			if code != tc.want || auth != tc.auth {
				t.Errorf("%s with %s: got %d %q, want %d %q", op.name, tc.who, code, auth, tc.want, tc.auth)
			}
			if !strings.Contains(body, `"status":`) || strings.Contains(body, "forged") || strings.Contains(body, appToken) {
				t.Errorf("%s with %s: got body %s, want a problem that quotes no token", op.name, tc.who, body)
			}
		}
	}
	if got := remainingOf(t, base, "pay", appToken); got != 1 {
		t.Errorf("remaining after the refused adjustments: got %v, want 1 (unchanged)", got)
	}

	// Every other scope is guarded too.
	for _, tc := range []struct {
		name, method, path, token, body string
		want                            int
	}{
		{"acquire without a token", http.MethodPost, "/v1/limiters/pay/acquire", "", "", http.StatusUnauthorized},
		{"acquire with the adjust token", http.MethodPost, "/v1/limiters/pay/acquire", billingToken, "", http.StatusForbidden},
		{"decide without a token", http.MethodPost, "/v1/decide", "", items, http.StatusUnauthorized},
		{"tenant acquire without a token", http.MethodPost, "/v1/tenants/192.0.2.1/acquire", "", "", http.StatusUnauthorized},
		{"forward-auth without a token", http.MethodGet, "/v1/forward-auth", "", "", http.StatusUnauthorized},
		{"put with the decide token", http.MethodPut, "/v1/limiters/x", appToken, `{"limit":1,"period":"1s"}`, http.StatusForbidden},
		{"list without a token", http.MethodGet, "/v1/limiters", "", "", http.StatusUnauthorized},
		{"list with the admin token", http.MethodGet, "/v1/limiters", opsToken, "", http.StatusOK},
		{"list with the adjust token", http.MethodGet, "/v1/limiters", billingToken, "", http.StatusForbidden},
		{"readiness is open", http.MethodGet, "/readyz", "", "", http.StatusOK},
		{"liveness is open", http.MethodGet, "/livez", "", "", http.StatusOK},
		{"metrics are open", http.MethodGet, "/metrics", "", "", http.StatusOK},
		{"the contract is open", http.MethodGet, "/openapi.json", "", "", http.StatusOK},
	} {
		if code, _, body := call(t, tc.method, base+tc.path, tc.token, tc.body); code != tc.want {
			t.Errorf("%s: got %d %.200s, want %d", tc.name, code, body, tc.want)
		}
	}
	if got := remainingOf(t, base, "pay", appToken); got != 1 {
		t.Errorf("remaining after the refused requests: got %v, want 1 (unchanged)", got)
	}
	if code, _, body := call(t, http.MethodPost, base+"/v1/refund", billingToken, `{"items":[{"limiter":"pay","permits":3}]}`); code != http.StatusOK {
		t.Errorf("refund with the adjust token: got %d %s, want 200", code, body)
	}
	if got := remainingOf(t, base, "pay", appToken); got != 4 {
		t.Errorf("remaining after the refund of 3: got %v, want 4", got)
	}
	if _, _, body := call(t, http.MethodGet, base+"/readyz", "", ""); strings.Contains(body, "open_scopes") {
		t.Errorf("/readyz with every scope guarded: got %s, want no open scopes", body)
	}

	conn := dial(t, stderr)
	rl := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}},
	}}
	for _, tc := range []struct {
		who, authorization string
		want               codes.Code
	}{
		{"no token", "", codes.Unauthenticated},
		{"an unknown token", "Bearer forged", codes.Unauthenticated},
		{"the adjust token", "Bearer " + billingToken, codes.PermissionDenied},
		{"the decide token", "Bearer " + appToken, codes.OK},
	} {
		ctx := t.Context()
		if tc.authorization != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tc.authorization)
		}
		resp, err := rl.ShouldRateLimit(ctx, req)
		if got := status.Code(err); got != tc.want {
			t.Errorf("ShouldRateLimit with %s: got %v (%v), want %v", tc.who, got, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "forged") {
			t.Errorf("ShouldRateLimit with %s: the status quotes the token: %v", tc.who, err)
		}
		if tc.want == codes.OK && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("ShouldRateLimit with %s: got %v, want OK", tc.who, resp.GetOverallCode())
		}
	}
	// Only the decide token's call took a hit: the refused ones took none.
	if m := scrape(t, base+"/metrics"); m[`ratelimiter_envoy_hits_total{result="within_limit"}`]+m[`ratelimiter_envoy_hits_total{result="near_limit"}`] != 1 {
		t.Errorf("envoy hits on /metrics: got %v, want 1 within the limit", m)
	}
	if resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without a token: got %v %v, want SERVING", resp, err)
	}

	if slices.ContainsFunc(stderr.snapshot(), func(rec map[string]any) bool { return rec["open_scopes"] != nil }) {
		t.Error("the log warns of open scopes, with every scope guarded")
	}
	cancel()
	waitRun(t, done)
}

// With only the admin token, decide and adjust stay open, as they were,
// and the service says so: in a WARN record at start-up and in /readyz.
func TestOpenScopesAreLoud(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	base, stderr, done, cancel := start(t, []string{"--listen", "127.0.0.1:0", "--admin-token", opsToken}, nil)
	if code, _, body := call(t, http.MethodPut, base+"/v1/limiters/pay", "", `{"limit":5,"period":"1h"}`); code != http.StatusUnauthorized {
		t.Errorf("put without a token: got %d %s, want 401", code, body)
	}
	if code, _, body := call(t, http.MethodPut, base+"/v1/limiters/pay", opsToken, `{"limit":5,"period":"1h"}`); code != http.StatusCreated {
		t.Errorf("put with the admin token: got %d %s, want 201", code, body)
	}
	if code, _, body := call(t, http.MethodPost, base+"/v1/refund", "", `{"items":[{"limiter":"pay","permits":1}]}`); code != http.StatusOK {
		t.Errorf("refund with adjust open: got %d %s, want 200", code, body)
	}

	var warned []any
	for _, rec := range stderr.snapshot() {
		if rec["level"] == "WARN" && rec["open_scopes"] != nil {
			warned = rec["open_scopes"].([]any)
		}
	}
	if want := []any{"decide", "adjust"}; !slices.Equal(warned, want) {
		t.Errorf("WARN open_scopes: got %v, want %v", warned, want)
	}
	code, _, body := call(t, http.MethodGet, base+"/readyz", "", "")
	var ready struct {
		Status     string
		OpenScopes []string `json:"open_scopes"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil || code != http.StatusOK {
		t.Fatalf("/readyz: got %d %s, want 200", code, body)
	}
	if want := []string{"decide", "adjust"}; ready.Status != "ok" || !slices.Equal(ready.OpenScopes, want) {
		t.Errorf("/readyz: got %s, want status ok and open_scopes %v", body, want)
	}
	cancel()
	waitRun(t, done)
}

// Tokens rotate through the tokens file without a restart, and a broken
// file leaves the tokens in force.
func TestTokensFileRotates(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	tokens := filepath.Join(t.TempDir(), "tokens.yaml")
	write(t, tokens, "tokens:\n  - {name: ops, sha256: "+sha256Hex("old-ops-token")+", scopes: [admin, decide, adjust]}\n")
	base, stderr, done, cancel := start(t, []string{"--listen", "127.0.0.1:0", "--tokens-file", tokens}, nil)
	list := func(token string) int {
		code, _, _ := call(t, http.MethodGet, base+"/v1/limiters", token, "")
		return code
	}
	if got := list("old-ops-token"); got != http.StatusOK {
		t.Fatalf("the old token before the rotation: got %d, want 200", got)
	}

	// Written aside and renamed, as a mounted Secret changes.
	next := tokens + ".next"
	write(t, next, "tokens:\n  - {name: ops, sha256: "+sha256Hex("new-ops-token")+", scopes: [admin, decide, adjust]}\n")
	if err := os.Rename(next, tokens); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new token accepted", func() bool { return list("new-ops-token") == http.StatusOK })
	if got := list("old-ops-token"); got != http.StatusUnauthorized {
		t.Errorf("the old token after the rotation: got %d, want 401", got)
	}

	write(t, tokens, "tokens:\n  - {name: ops, scopes: [admin]}\n")
	waitFor(t, "the broken file logged", func() bool {
		return slices.Contains(stderr.messages(), "tokens not reloaded; the previous ones stay in force")
	})
	if got := list("new-ops-token"); got != http.StatusOK {
		t.Errorf("the new token after a broken file: got %d, want 200", got)
	}
	cancel()
	waitRun(t, done)
}

// waitFor polls cond for up to 30 seconds (the tokens file is checked
// every second) and fails t if it never holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A tokens file that does not load stops the service at start-up, with
// exit status 2 and an error that says where, never quoting a token.
func TestBrokenTokensFileStopsStartUp(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, content, want string }{
		{"unknown key", "tokens:\n  - {name: a, token: s3cret-token, scope: [decide]}\n", "invalid YAML at line 2"},
		{"unknown scope", "tokens:\n  - {name: a, token: s3cret-token, scopes: [write]}\n", `unknown scope "write"`},
		{"missing", "", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if tc.content != "" {
				write(t, path, tc.content)
			}
			var stderr strings.Builder
			err := run(t.Context(), []string{"--listen", "127.0.0.1:0", "--grpc-listen=", "--tokens-file", path}, func(string) string { return "" }, io.Discard, io.Discard)
			if code := exitCode(err, &stderr); code != 2 {
				t.Fatalf("exit status: got %d (%v), want 2", code, err)
			}
			if !strings.Contains(stderr.String(), tc.want) || strings.Contains(stderr.String(), "s3cret") {
				t.Errorf("stderr: got %q, want it to say %q and quote no token", stderr.String(), tc.want)
			}
		})
	}
}
