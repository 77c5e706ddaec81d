package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	dockerclient "github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestDataDirInContainer runs the image with a Docker volume as its data
// directory on a read-only root filesystem (the image makes the directory
// its user's), and restarts the same container: after docker stop the
// limiter and its count are as they were; after docker kill it is there,
// exhausted.
func TestDataDirInContainer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	volume := fmt.Sprintf("ratelimiter-e2e-data-%d", time.Now().UnixNano())
	t.Cleanup(func() {
		_, _ = suite.provider.Client().VolumeRemove(context.Background(), volume, dockerclient.VolumeRemoveOptions{Force: true})
	})
	svc := startService(t, map[string]string{"RATELIMITER_DATA_DIR": "/var/lib/ratelimiter"},
		testcontainers.WithMounts(testcontainers.VolumeMount(volume, "/var/lib/ratelimiter")),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.ReadonlyRootfs = true }))
	const name = "daily"
	put(t, svc.api, name, client.LimiterSpec{Limit: 100, Period: "24h"})
	take(t, svc.api, name, 37, true)

	restart := func(t *testing.T) *service {
		t.Helper()
		if err := svc.ctr.Start(ctx); err != nil {
			t.Fatalf("start the container again: %v", err)
		}
		again, err := newService(ctx, svc.ctr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(again.http.CloseIdleConnections)
		return again
	}

	timeout := 20 * time.Second
	if err := svc.ctr.Stop(ctx, &timeout); err != nil {
		t.Fatalf("docker stop: %v", err)
	}
	svc = restart(t)
	if got := available(t, svc.api, name); got != 63 {
		t.Errorf("after docker stop and start: %d available, want 63 as before", got)
	}

	if _, err := suite.provider.Client().ContainerKill(ctx, svc.ctr.GetContainerID(), dockerclient.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatalf("docker kill: %v", err)
	}
	// Wait until Docker has seen the process exit.
	for deadline := time.Now().Add(startTimeout); ; {
		state, err := svc.ctr.State(ctx)
		if err == nil && !state.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed container still runs: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	svc = restart(t)
	if got := available(t, svc.api, name); got != 0 {
		t.Errorf("after docker kill and start: %d available, want 0 (exhausted by the crash rule)", got)
	}
	res, err := svc.api.GetLimiterWithResponse(ctx, name)
	if err != nil || res.JSON200 == nil || res.JSON200.Limit != 100 {
		t.Errorf("the limiter after docker kill: %v %s, want it kept", err, res.Body)
	}
}
