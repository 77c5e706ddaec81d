// Package redistest starts real Redis servers in containers for tests: one
// standalone server, or a three-master Redis Cluster. The image is built
// offline from this machine's redis-server (see Image), because no registry
// can be reached from the test machines.
//
// When no Docker engine answers, the helpers skip the test with a loud
// message, except under CI=true, where they fail it: in CI nothing may be
// skipped silently.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// startTimeout bounds building the image and starting one server.
const startTimeout = 2 * time.Minute

var (
	envOnce   sync.Once
	engineErr error
)

// requireDocker configures testcontainers for these machines, checks once
// that a Docker engine answers and that the image exists, and otherwise skips
// t (or fails it under CI=true).
func requireDocker(t testing.TB) {
	t.Helper()
	envOnce.Do(func() {
		// Inside a container (a /.dockerenv file), testcontainers would
		// dial the default gateway rather than the ports published on this
		// host; and the reaper's image cannot be pulled. Every container is
		// terminated by the test that started it instead.
		setDefaultEnv("TESTCONTAINERS_HOST_OVERRIDE", "localhost")
		setDefaultEnv("TESTCONTAINERS_RYUK_DISABLED", "true")
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		engineErr = engineHealthy(ctx)
		if engineErr == nil {
			engineErr = ensureImage(ctx)
		}
	})
	if engineErr != nil {
		unavailable(t, engineErr)
	}
}

// unavailable skips t with a loud message, or fails it under CI=true.
func unavailable(t testing.TB, err error) {
	t.Helper()
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("redistest: FAIL: CI=%s and no Redis container can run: %v", os.Getenv("CI"), err)
		return
	}
	banner := strings.Repeat("!", 78)
	t.Skipf("\n%s\nredistest: SKIPPED: no Redis container can run (%v).\nStart a Docker engine and install redis-server to run this test; with CI=true this is a failure.\n%s",
		banner, err, banner)
}

func setDefaultEnv(key, value string) {
	if _, ok := os.LookupEnv(key); !ok {
		os.Setenv(key, value)
	}
}

func engineHealthy(ctx context.Context) error {
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	defer provider.Close()
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := provider.Health(hctx); err != nil {
		return fmt.Errorf("docker: the engine does not answer: %w", err)
	}
	return nil
}

// testLogger sends testcontainers' progress lines to the test's log, shown
// with -v or when the test fails.
type testLogger struct{ t testing.TB }

func (l testLogger) Printf(format string, args ...any) {
	l.t.Helper()
	l.t.Logf(format, args...)
}

// Server is one Redis server in a container, terminated when its test ends.
type Server struct {
	// Addr is the server's host:port on the loopback interface.
	Addr string

	container testcontainers.Container
}

// Standalone starts a standalone Redis server for the duration of t and
// returns its address (host:port on the loopback interface).
func Standalone(t testing.TB) string {
	t.Helper()
	return StartStandalone(t).Addr
}

// StartStandalone is Standalone returning the Server, for tests that stop
// it to observe failures.
func StartStandalone(t testing.TB) *Server {
	t.Helper()
	requireDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := testcontainers.Run(ctx, Image,
		testcontainers.WithLogger(testLogger{t}),
		testcontainers.WithCmd("--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"),
		testcontainers.WithExposedPorts("6379/tcp"),
		// The image has no shell, so the port check from inside the
		// container cannot run; the log line and the published port do.
		testcontainers.WithWaitStrategy(
			wait.ForLog("Ready to accept connections"),
			wait.ForListeningPort("6379/tcp").SkipInternalCheck(),
		),
	)
	testcontainers.CleanupContainer(t, c)
	if err != nil {
		t.Fatalf("redistest: start %s: %v", Image, err)
	}
	host, err := c.Host(ctx)
	if err != nil {
		t.Fatalf("redistest: container host: %v", err)
	}
	port, err := c.MappedPort(ctx, "6379/tcp")
	if err != nil {
		t.Fatalf("redistest: mapped port: %v", err)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	return &Server{Addr: net.JoinHostPort(host, port.Port()), container: c}
}

// Stop stops the server's container (it is still removed when the test
// ends). Connections to Addr are refused from then on.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	timeout := time.Duration(0) // SIGKILL at once: an abrupt failure
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := s.container.Stop(ctx, &timeout); err != nil {
		t.Fatalf("redistest: stop: %v", err)
	}
}

// Pause freezes the server's process until the test ends: connections stay
// open and nothing answers, as with a hung server or a network partition.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		t.Fatalf("redistest: pause: %v", err)
	}
	id := s.container.GetContainerID()
	if _, err := cli.ContainerPause(ctx, id, client.ContainerPauseOptions{}); err != nil {
		cli.Close()
		t.Fatalf("redistest: pause: %v", err)
	}
	// Cleanups run last first: the container is running again when it
	// is terminated, unless Unpause did that already.
	t.Cleanup(func() {
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		info, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err == nil && (info.Container.State == nil || !info.Container.State.Paused) {
			return
		}
		if _, err := cli.ContainerUnpause(ctx, id, client.ContainerUnpauseOptions{}); err != nil {
			t.Errorf("redistest: unpause: %v", err)
		}
	})
}

// Unpause lets a paused server run again: it answers on the same address,
// with the data it held.
func (s *Server) Unpause(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		t.Fatalf("redistest: unpause: %v", err)
	}
	defer cli.Close()
	if _, err := cli.ContainerUnpause(ctx, s.container.GetContainerID(), client.ContainerUnpauseOptions{}); err != nil {
		t.Fatalf("redistest: unpause: %v", err)
	}
}
