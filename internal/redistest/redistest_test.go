package redistest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

func TestStandalone(t *testing.T) {
	addr := redistest.Standalone(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	defer c.Close()
	got, err := c.Do(context.Background(), c.B().Ping().Build()).ToString()
	if err != nil || got != "PONG" {
		t.Errorf("PING: got %q, %v, want PONG", got, err)
	}
}

func TestCluster(t *testing.T) {
	addrs := redistest.Cluster(t)
	if len(addrs) != 3 {
		t.Fatalf("got %d addresses, want 3", len(addrs))
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatalf("connect to %v: %v", addrs, err)
	}
	defer c.Close()
	ctx := context.Background()
	info, err := c.Do(ctx, c.B().ClusterInfo().Build()).ToString()
	if err != nil || !strings.Contains(info, "cluster_state:ok") {
		t.Fatalf("CLUSTER INFO: got %q, %v, want cluster_state:ok", info, err)
	}
	// Keys in every third of the slot space: the client follows the
	// cluster's routing to all three masters.
	if n := len(c.Nodes()); n != 3 {
		t.Errorf("client knows %d nodes, want 3", n)
	}
	for _, key := range []string{"{a}", "{b}", "{c}", "{d}", "{e}"} {
		if err := c.Do(ctx, c.B().Set().Key(key).Value("1").Build()).Error(); err != nil {
			t.Errorf("SET %s: %v", key, err)
		}
	}
}
