package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/ratelimiter/ratelimiter/client"
)

// maxImageBytes bounds the image: a static binary on an empty base.
const maxImageBytes = 25_000_000

// TestImage checks the properties of the image built from the Dockerfile.
func TestImage(t *testing.T) {
	t.Parallel()
	requireDocker(t)
	ctx := t.Context()
	img, err := suite.provider.Client().ImageInspect(ctx, imageName)
	if err != nil {
		t.Fatalf("inspect %s: %v", imageName, err)
	}
	if img.Config == nil {
		t.Fatalf("inspect %s: no config", imageName)
	}
	cfg := img.Config

	t.Run("numeric non-root user", func(t *testing.T) {
		if cfg.User != "65532:65532" {
			t.Errorf("User: got %q, want 65532:65532", cfg.User)
		}
		uid, gid, _ := strings.Cut(cfg.User, ":")
		for _, id := range []string{uid, gid} {
			if n, err := strconv.Atoi(id); err != nil || n == 0 {
				t.Errorf("User: got %q, want numeric non-zero user and group IDs", cfg.User)
			}
		}
	})

	t.Run("entrypoint and port", func(t *testing.T) {
		if !slices.Equal(cfg.Entrypoint, []string{"/ratelimiter"}) {
			t.Errorf("Entrypoint: got %q, want [/ratelimiter]", cfg.Entrypoint)
		}
		if _, ok := cfg.ExposedPorts[servicePort]; !ok {
			t.Errorf("ExposedPorts: got %v, want %s", cfg.ExposedPorts, servicePort)
		}
	})

	t.Run("OCI labels", func(t *testing.T) {
		want := map[string]string{
			"org.opencontainers.image.title":    "ratelimiter",
			"org.opencontainers.image.version":  suite.version,
			"org.opencontainers.image.revision": suite.commit,
			"org.opencontainers.image.source":   "https://github.com/ratelimiter/ratelimiter",
		}
		for k, v := range want {
			if got, ok := cfg.Labels[k]; !ok || got != v {
				t.Errorf("label %s: got %q, want %q", k, got, v)
			}
		}
		if cfg.Labels["org.opencontainers.image.description"] == "" {
			t.Errorf("label org.opencontainers.image.description: got none, want a description")
		}
	})

	t.Run("size", func(t *testing.T) {
		t.Logf("image size: %d bytes (%.1f MB)", img.Size, float64(img.Size)/1e6)
		if img.Size > maxImageBytes {
			t.Errorf("size: got %d bytes, want at most %d", img.Size, maxImageBytes)
		}
	})

	t.Run("--version", func(t *testing.T) {
		t.Parallel()
		ctr, err := testcontainers.Run(ctx, imageName,
			testcontainers.WithLogger(tclog.TestLogger(t)),
			testcontainers.WithCmd("--version"),
			testcontainers.WithWaitStrategy(wait.ForExit().WithExitTimeout(30*time.Second)),
		)
		testcontainers.CleanupContainer(t, ctr)
		if err != nil {
			t.Fatal(err)
		}
		state, err := ctr.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stdout, stderr, err := containerLogs(ctx, ctr)
		if err != nil {
			t.Fatal(err)
		}
		if state.ExitCode != 0 {
			t.Errorf("exit code: got %d, want 0 (stderr %q)", state.ExitCode, stderr)
		}
		want := fmt.Sprintf("ratelimiter %s (commit %s, go", suite.version, suite.commit)
		if !strings.HasPrefix(string(stdout), want) {
			t.Errorf("--version: got %q, want it to start with %q", stdout, want)
		}
	})

	t.Run("startup log", func(t *testing.T) {
		svc := sharedService(t)
		_, stderr, err := svc.logs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first, _, _ := bufio.NewReader(bytes.NewReader(stderr)).ReadLine()
		var rec struct {
			Level, Msg, Version, Commit string
		}
		if err := json.Unmarshal(first, &rec); err != nil {
			t.Fatalf("first log record: got %q, want JSON: %v", first, err)
		}
		if rec.Msg != "starting" || rec.Level != "INFO" || rec.Version != suite.version || rec.Commit != suite.commit {
			t.Errorf("first log record: got %s, want msg starting, level INFO, version %s, commit %s", first, suite.version, suite.commit)
		}
	})

	t.Run("read-only root filesystem", func(t *testing.T) {
		t.Parallel()
		svc := startService(t, nil, testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.ReadonlyRootfs = true
		}))
		inspect, err := svc.ctr.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !inspect.HostConfig.ReadonlyRootfs {
			t.Fatalf("container: got a writable root filesystem, want read-only")
		}
		if inspect.Config.User != "65532:65532" {
			t.Errorf("container user: got %q, want 65532:65532", inspect.Config.User)
		}
		const name = "read-only"
		put(t, svc.api, name, client.LimiterSpec{Limit: 3, Period: "1m"})
		take(t, svc.api, name, 2, true)
		if got := available(t, svc.api, name); got != 1 {
			t.Errorf("available: got %d, want 1", got)
		}
		res, err := svc.api.AcquireTenantWithResponse(ctx, "198.51.100.7", client.AcquireRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if res.JSON200 == nil || !res.JSON200.Allowed {
			t.Errorf("acquire for a tenant: got %d %s, want a grant", res.StatusCode(), res.Body)
		}
		getPage(t, svc, "/metrics")
		getPage(t, svc, "/docs")
	})
}
