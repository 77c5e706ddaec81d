package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimiter/ratelimiter/internal/config"
	"github.com/ratelimiter/ratelimiter/internal/rls"
)

// A change made to the files after the configuration in force was read,
// and before the reloader first looks at them, is reloaded: the reloader
// compares the files with what was loaded, not with what it first finds
// (it once did, and missed such a change).
func TestReloadSeesAChangeMadeBeforeItStarts(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(path, []byte(userRule(2)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load([]string{"--envoy-config", path}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	b, err := newBackend(t.Context(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := rls.Apply(t.Context(), b.limiters, cfg.Envoy); err != nil {
		t.Fatal(err)
	}
	svc, err := rls.NewService(b.limiters, cfg.Envoy, rls.Options{})
	if err != nil {
		t.Fatal(err)
	}

	// The same size, and the same modification time.
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(userRule(5)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}

	r := &reloader{cfg: cfg, b: b, svc: svc, logger: logger}
	go r.run(t.Context(), nil)
	deadline := time.Now().Add(3 * reloadInterval)
	ask := func(ctx context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return svc.ShouldRateLimit(ctx, r)
	}
	for limitOf(t, ask) != 5 {
		if time.Now().After(deadline) {
			t.Fatalf("limit %d, want 5: the change was not reloaded", limitOf(t, ask))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// userRule is an Envoy configuration of domain web with one rule, a
// limit a minute per user.
func userRule(limit int) string {
	return fmt.Sprintf("domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", limit)
}

// limitOf returns the limit that ask answers for user carol of domain web,
// by a check that charges nothing.
func limitOf(t *testing.T, ask func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)) uint32 {
	t.Helper()
	resp, err := ask(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "carol"}}, HitsAddend: wrapperspb.UInt64(0)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
}
