package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dockerclient "github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

// The image every container of the suite runs.
const (
	imageRepo = "ratelimiter"
	imageTag  = "e2e"
	imageName = imageRepo + ":" + imageTag
)

// goImageEnv names a Go toolchain image to build with instead of the
// Dockerfile's default GO_IMAGE, for machines that cannot pull one.
const goImageEnv = "RATELIMITER_E2E_GO_IMAGE"

// fallbackCommit is the COMMIT build argument when git cannot tell HEAD.
const fallbackCommit = "0e2e0e2e0e2e0e2e0e2e0e2e0e2e0e2e0e2e0e2e"

// buildTimeout bounds the image build; a cold one takes a few minutes on
// two cores.
const buildTimeout = 15 * time.Minute

// suite is what TestMain prepares for every test.
var suite struct {
	// skip, when not empty, is why every test skips: no Docker engine.
	skip string
	// provider talks to the Docker engine.
	provider *testcontainers.DockerProvider
	// version and commit are the VERSION and COMMIT build arguments the
	// image was stamped with.
	version, commit string
}

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

// runSuite builds the image, runs the tests and stops the shared container;
// it returns the process's exit status.
func runSuite(m *testing.M) int {
	flag.Parse()
	// Inside a container (a /.dockerenv file), testcontainers would dial the
	// default gateway rather than the ports published on this host. The
	// reaper needs an image that cannot always be pulled, and every
	// container is terminated by the test that started it anyway.
	setDefaultEnv("TESTCONTAINERS_HOST_OVERRIDE", "localhost")
	setDefaultEnv("TESTCONTAINERS_RYUK_DISABLED", "true")

	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()

	provider, err := dockerProvider(ctx)
	if err != nil {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			fmt.Fprintf(os.Stderr, "e2e: FAIL: CI=%s and Docker is unavailable: %v\n", os.Getenv("CI"), err)
			return 1
		}
		suite.skip = fmt.Sprintf("Docker is unavailable (%v): the end-to-end tests did NOT run", err)
		banner := strings.Repeat("!", 78)
		fmt.Fprintf(os.Stderr, "%s\ne2e: %s.\ne2e: start a Docker engine to run them; with CI=true this is a failure.\n%s\n",
			banner, suite.skip, banner)
		return m.Run()
	}
	suite.provider = provider
	defer provider.Close()

	if err := buildImage(ctx, provider); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: build %s: %v\n", imageName, err)
		return 1
	}

	code := m.Run()
	if err := stopShared(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: terminate the shared container: %v\n", err)
		code = 1
	}
	return code
}

// setDefaultEnv sets key to value unless it is set already.
func setDefaultEnv(key, value string) {
	if _, ok := os.LookupEnv(key); !ok {
		os.Setenv(key, value)
	}
}

// dockerProvider connects to the Docker engine and checks that it answers.
func dockerProvider(ctx context.Context) (*testcontainers.DockerProvider, error) {
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := provider.Health(hctx); err != nil {
		provider.Close()
		return nil, fmt.Errorf("the engine does not answer: %w", err)
	}
	return provider, nil
}

// buildImage builds imageName from the project's Dockerfile, once per run.
// Docker's layer cache makes a rebuild of unchanged sources quick, which is
// why VERSION derives from the commit rather than the clock: a new VERSION
// would recompile the whole service every run.
func buildImage(ctx context.Context, provider *testcontainers.DockerProvider) error {
	root, err := filepath.Abs("..")
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "Dockerfile")); err != nil {
		return fmt.Errorf("the project's Dockerfile: %w", err)
	}
	suite.commit = gitCommit(root)
	suite.version = "e2e-" + suite.commit[:12]

	args := map[string]*string{
		"VERSION": &suite.version,
		"COMMIT":  &suite.commit,
	}
	goImage := os.Getenv(goImageEnv)
	if goImage != "" {
		args["GO_IMAGE"] = &goImage
	}
	var buildLog bytes.Buffer
	req := &testcontainers.ContainerRequest{FromDockerfile: testcontainers.FromDockerfile{
		Context:        root,
		Dockerfile:     "Dockerfile",
		Repo:           imageRepo,
		Tag:            imageTag,
		BuildArgs:      args,
		BuildLogWriter: &buildLog,
		// The image outlives the run, so that the next one reuses its
		// layers, and carries only the labels of its Dockerfile.
		KeepImage: true,
	}}
	previous := imageID(ctx, provider)
	start := time.Now()
	name, err := provider.BuildImage(ctx, req)
	if err != nil {
		return fmt.Errorf("%w\n--- build log ---\n%s", err, tail(buildLog.String(), 8<<10))
	}
	if name != imageName {
		return fmt.Errorf("built %q, want %q", name, imageName)
	}
	if goImage == "" {
		goImage = "the Dockerfile's default"
	}
	fmt.Fprintf(os.Stderr, "e2e: built %s (VERSION=%s COMMIT=%s GO_IMAGE=%s) in %s\n",
		imageName, suite.version, suite.commit, goImage, time.Since(start).Round(time.Second))

	// The image the tag named before, if this build replaced it, is left
	// without a name: remove it rather than let every change of the
	// sources leave one behind. It may still be in use elsewhere; then
	// it stays.
	if previous != "" && previous != imageID(ctx, provider) {
		if _, err := provider.Client().ImageRemove(ctx, previous, dockerclient.ImageRemoveOptions{PruneChildren: true}); err == nil {
			fmt.Fprintf(os.Stderr, "e2e: removed the image %s named before\n", previous)
		}
	}
	return nil
}

// imageID is the ID of the image imageName names, or "" when there is none.
func imageID(ctx context.Context, provider *testcontainers.DockerProvider) string {
	img, err := provider.Client().ImageInspect(ctx, imageName)
	if err != nil {
		return ""
	}
	return img.ID
}

// gitCommit is the commit checked out in dir, or fallbackCommit when git
// cannot tell.
func gitCommit(dir string) string {
	out, err := exec.Command("git", "-C", dir, "rev-parse", "HEAD").Output()
	commit := strings.TrimSpace(string(out))
	if err != nil || len(commit) != 40 {
		return fallbackCommit
	}
	return commit
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// requireDocker skips t when the suite runs without a Docker engine.
func requireDocker(t *testing.T) {
	t.Helper()
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
}
