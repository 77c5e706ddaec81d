package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/redis/rueidis"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// clusterTimeout bounds forming the cluster once its servers run.
const clusterTimeout = 30 * time.Second

// slotRanges splits Redis Cluster's 16384 hash slots over three masters, as
// redis-cli --cluster create does.
var slotRanges = [3][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

// Cluster starts a Redis Cluster of three masters (no replicas) for the
// duration of t, waits until every node reports cluster_state:ok, and
// returns the masters' addresses (host:port on the loopback interface) in
// slot order: the first serves slots 0-5460, the second 5461-10922, the last
// 10923-16383.
//
// The servers are containers of Image on the host's network: a cluster node
// announces the address it is reached at, and clients follow those addresses
// in CLUSTER SLOTS and MOVED replies, so the nodes must listen on the very
// loopback addresses the test dials. With published ports they would
// announce addresses private to the container network instead. Containers
// rather than plain processes keep one way of running Redis in every test,
// with the same lifecycle and the same skip rule when Docker is missing.
func Cluster(t testing.TB) []string {
	t.Helper()
	requireDocker(t)
	ports, err := freePortPairs(3)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	addrs := make([]string, len(ports))
	errs := make([]error, len(ports))
	var wg sync.WaitGroup
	for i, port := range ports {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		wg.Go(func() { errs[i] = startNode(t, port) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("redistest: start cluster nodes: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := formCluster(ctx, ports); err != nil {
		t.Fatalf("redistest: form cluster: %v", err)
	}
	return addrs
}

// startNode runs one cluster-enabled server on 127.0.0.1:port (and its
// cluster bus on port+10000) in the host's network.
func startNode(t testing.TB, port int) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	p := strconv.Itoa(port)
	c, err := testcontainers.Run(ctx, Image,
		testcontainers.WithLogger(testLogger{t}),
		testcontainers.WithCmd("--port", p, "--bind", "127.0.0.1", "--protected-mode", "no",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+p+".conf",
			"--dir", "/tmp", "--save", "", "--appendonly", "no"),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
		testcontainers.WithWaitStrategy(wait.ForLog("Ready to accept connections")),
	)
	testcontainers.CleanupContainer(t, c)
	if err != nil {
		return fmt.Errorf("node on port %d: %w", port, err)
	}
	return nil
}

// freePortPairs finds n loopback ports p that are free together with their
// cluster bus ports p+10000. Another process may take one before the server
// binds it; in a range few services use this is rare, and the test then
// fails with the server's bind error rather than hanging.
func freePortPairs(n int) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p := 20000 + rand.IntN(10000)
		if seen[p] || seen[p+10000] || seen[p-10000] {
			continue
		}
		if free(p) && free(p+10000) {
			ports = append(ports, p)
			seen[p] = true
		}
	}
	if len(ports) < n {
		return nil, errors.New("no free loopback ports between 20000 and 39999")
	}
	return ports, nil
}

func free(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// formCluster gives each node its slot range, introduces the nodes to each
// other, and waits until every node sees all three and all slots served.
func formCluster(ctx context.Context, ports []int) error {
	clients := make([]rueidis.Client, len(ports))
	for i, port := range ports {
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:       []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(port))},
			ForceSingleClient: true,
			DisableCache:      true,
		})
		if err != nil {
			return fmt.Errorf("connect to node %d: %w", port, err)
		}
		defer c.Close()
		clients[i] = c
	}
	for i, c := range clients {
		r := slotRanges[i]
		if err := c.Do(ctx, c.B().Arbitrary("CLUSTER", "ADDSLOTSRANGE").Args(strconv.Itoa(r[0]), strconv.Itoa(r[1])).Build()).Error(); err != nil {
			return fmt.Errorf("node %d: CLUSTER ADDSLOTSRANGE %d %d: %w", ports[i], r[0], r[1], err)
		}
	}
	for _, port := range ports[1:] {
		c := clients[0]
		if err := c.Do(ctx, c.B().ClusterMeet().Ip("127.0.0.1").Port(int64(port)).Build()).Error(); err != nil {
			return fmt.Errorf("CLUSTER MEET 127.0.0.1 %d: %w", port, err)
		}
	}
	for {
		pending := ""
		for i, c := range clients {
			info, err := c.Do(ctx, c.B().ClusterInfo().Build()).ToString()
			if err != nil {
				return fmt.Errorf("node %d: CLUSTER INFO: %w", ports[i], err)
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", len(ports))) {
				pending = fmt.Sprintf("node %d: %s", ports[i], strings.ReplaceAll(strings.TrimSpace(info), "\r\n", " "))
				break
			}
		}
		if pending == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not ready after %s: %s", clusterTimeout, pending)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
