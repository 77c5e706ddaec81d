package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	dockerclient "github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/ratelimiter/ratelimiter/client"
)

// servicePort is the port the service listens on in its container.
const servicePort = "8080/tcp"

// startTimeout bounds how long a container may take to become ready.
const startTimeout = 60 * time.Second

// service is a running ratelimiter container and a client for it.
type service struct {
	ctr  *testcontainers.DockerContainer
	url  string       // base URL, such as http://localhost:32768
	http *http.Client // the HTTP client under api, for the pages outside the spec
	api  *client.ClientWithResponses
}

// startService runs a container of the image with env added to its
// environment, waits until /readyz answers 200, and terminates it when t
// ends.
func startService(t *testing.T, env map[string]string, opts ...testcontainers.ContainerCustomizer) *service {
	t.Helper()
	requireDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	opts = append([]testcontainers.ContainerCustomizer{testcontainers.WithLogger(tclog.TestLogger(t))}, opts...)
	ctr, svc, err := runService(ctx, env, opts...)
	testcontainers.CleanupContainer(t, ctr)
	if err != nil {
		t.Fatalf("start the service: %v", err)
	}
	t.Cleanup(svc.http.CloseIdleConnections)
	return svc
}

// runService runs a container of the image; see startService. The container
// is returned, when there is one, even with an error.
func runService(ctx context.Context, env map[string]string, opts ...testcontainers.ContainerCustomizer) (*testcontainers.DockerContainer, *service, error) {
	opts = append([]testcontainers.ContainerCustomizer{
		testcontainers.WithEnv(env),
		testcontainers.WithExposedPorts(servicePort),
		testcontainers.WithWaitStrategy(wait.ForHTTP("/readyz").
			WithPort(servicePort).
			WithStatusCodeMatcher(func(status int) bool { return status == http.StatusOK }).
			WithPollInterval(50 * time.Millisecond).
			WithStartupTimeout(startTimeout)),
	}, opts...)
	ctr, err := testcontainers.Run(ctx, imageName, opts...)
	if err != nil {
		return ctr, nil, err
	}
	svc, err := newService(ctx, ctr)
	return ctr, svc, err
}

// newService makes a client for the service running in ctr.
func newService(ctx context.Context, ctr *testcontainers.DockerContainer) (*service, error) {
	host, err := ctr.Host(ctx)
	if err != nil {
		return nil, fmt.Errorf("container host: %w", err)
	}
	port, err := ctr.MappedPort(ctx, servicePort)
	if err != nil {
		return nil, fmt.Errorf("mapped port: %w", err)
	}
	svc := &service{
		ctr: ctr,
		url: fmt.Sprintf("http://%s:%s", host, port.Port()),
		http: &http.Client{
			Transport: http.DefaultTransport.(*http.Transport).Clone(),
			Timeout:   10 * time.Second,
		},
	}
	svc.api, err = svc.newClient()
	if err != nil {
		return nil, err
	}
	return svc, nil
}

// newClient returns another client of the service, with opts.
func (s *service) newClient(opts ...client.ClientOption) (*client.ClientWithResponses, error) {
	opts = append([]client.ClientOption{client.WithHTTPClient(s.http)}, opts...)
	return client.NewClientWithResponses(s.url, opts...)
}

// logs returns what the container wrote so far on stdout and stderr.
func (s *service) logs(ctx context.Context) (stdout, stderr []byte, err error) {
	return containerLogs(ctx, s.ctr)
}

// containerLogs returns what ctr wrote so far on stdout and stderr.
func containerLogs(ctx context.Context, ctr *testcontainers.DockerContainer) (stdout, stderr []byte, err error) {
	rc, err := suite.provider.Client().ContainerLogs(ctx, ctr.GetContainerID(), dockerclient.ContainerLogsOptions{
		ShowStdout: true,
		ShowStderr: true,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("container logs: %w", err)
	}
	defer rc.Close()
	var out, errOut bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &errOut, rc); err != nil {
		return nil, nil, fmt.Errorf("container logs: %w", err)
	}
	return out.Bytes(), errOut.Bytes(), nil
}

// shared is the container of the tests that need no configuration of their
// own; they use limiter names and tenant addresses of their own, so they run
// in parallel on it.
var shared struct {
	once sync.Once
	ctr  *testcontainers.DockerContainer
	svc  *service
	err  error
}

// sharedEnv configures the shared container. The per-IP period is a day, so
// that tenant capacity does not visibly refill while a test compares it.
var sharedEnv = map[string]string{
	"RATELIMITER_TENANT_LIMIT":  "100",
	"RATELIMITER_TENANT_PERIOD": "24h",
}

// sharedService returns the shared container, started on first use and
// terminated by TestMain.
func sharedService(t *testing.T) *service {
	t.Helper()
	requireDocker(t)
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		shared.ctr, shared.svc, shared.err = runService(ctx, sharedEnv)
	})
	if shared.err != nil {
		t.Fatalf("start the shared service: %v", shared.err)
	}
	return shared.svc
}

// stopShared terminates the shared container, if it was started.
func stopShared() error {
	if shared.ctr == nil {
		return nil
	}
	if shared.svc != nil {
		shared.svc.http.CloseIdleConnections()
	}
	return testcontainers.TerminateContainer(shared.ctr)
}
