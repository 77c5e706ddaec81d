package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The peers, built from the Go module proxy at pinned versions.
const (
	gubernatorModule = "github.com/gubernator-io/gubernator/v2/cmd/gubernator@v2.13.0"
	envoyModule      = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"
)

// goInstall builds module@version into dir/bin and returns the binary.
func goInstall(dir, module, binary string) (string, error) {
	bin := filepath.Join(dir, "bin")
	cmd := exec.Command("go", "install", module)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %w\n%s", module, err, out)
	}
	return filepath.Join(bin, binary), nil
}

// startGubernator runs gubernator as one node: member-list discovery that
// finds only itself (with discovery "none" its peer pool is empty and every
// answer carries an error), no tracing (its OTLP exporter otherwise retries
// a collector that is not there, and hangs on SIGTERM).
func startGubernator(dir string) (*proc, error) {
	bin, err := goInstall(dir, gubernatorModule, "gubernator")
	if err != nil {
		return nil, err
	}
	var addrs [3]string
	for i := range addrs {
		if addrs[i], err = freeAddr(); err != nil {
			return nil, err
		}
	}
	httpAddr, grpcAddr, memberlist := addrs[0], addrs[1], addrs[2]
	p, err := start("gubernator", httpAddr, []string{
		"GUBER_HTTP_ADDRESS=" + httpAddr,
		"GUBER_GRPC_ADDRESS=" + grpcAddr,
		"GUBER_ADVERTISE_ADDRESS=" + grpcAddr,
		"GUBER_PEER_DISCOVERY_TYPE=member-list",
		"GUBER_MEMBERLIST_ADDRESS=" + memberlist,
		"GUBER_MEMBERLIST_BIND_ADDRESS=" + memberlist,
		"GUBER_MEMBERLIST_KNOWN_NODES=" + memberlist,
		"GUBER_LOG_LEVEL=warn",
		"OTEL_TRACES_EXPORTER=none",
	}, bin)
	if err != nil {
		return nil, err
	}
	// It answers 200 with an error inside until it has found itself.
	if err := waitFor(p, "/v1/HealthCheck", "", `"status":"healthy"`); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// envoyConfig is envoy ratelimit's configuration: the hot key, and one
// counter per value of "k", both with limits no run reaches, and one
// counter of 100 per minute per value of "exact" (exactLimit).
const envoyConfig = `domain: bench
descriptors:
  - key: hot
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
  - key: exact
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// startEnvoy runs envoy ratelimit against the Redis at redisAddr, with
// statistics off and the harness's configuration.
func startEnvoy(dir, redisAddr string) (*proc, error) {
	p, _, err := startEnvoyWith(dir, redisAddr, envoyConfig, "bench.hot")
	return p, err
}

// startEnvoyWith runs envoy ratelimit against the Redis at redisAddr, with
// statistics off and the configuration config, which it has loaded once
// its /rlconfig lists loaded. It returns the server, whose addr is its
// HTTP port, and the address of its gRPC port.
func startEnvoyWith(dir, redisAddr, config, loaded string) (*proc, string, error) {
	bin, err := goInstall(dir, envoyModule, "service_cmd")
	if err != nil {
		return nil, "", err
	}
	runtime := filepath.Join(dir, "envoy-runtime")
	conf := filepath.Join(runtime, "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(filepath.Join(conf, "bench.yaml"), []byte(config), 0o644); err != nil {
		return nil, "", err
	}
	var addrs [3]string
	for i := range addrs {
		if addrs[i], err = freeAddr(); err != nil {
			return nil, "", err
		}
	}
	port := func(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }
	p, err := start("envoy ratelimit", addrs[0], []string{
		"HOST=127.0.0.1", "PORT=" + port(addrs[0]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port(addrs[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + port(addrs[2]),
		"LOG_LEVEL=warn", "USE_STATSD=false", "DISABLE_STATS=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=" + runtime, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
	}, bin)
	if err != nil {
		return nil, "", err
	}
	// Without its configuration it answers OK to everything: make sure it
	// loaded it.
	debug := &proc{name: "envoy ratelimit debug", addr: addrs[2]}
	if err := waitFor(debug, "/rlconfig", "", loaded); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, addrs[1], nil
}

// waitFor polls p until a request to path (GET, or POST of body) answers
// with a body holding want.
func waitFor(p *proc, path, body, want string) error {
	method := "GET"
	if body != "" {
		method = "POST"
	}
	var last string
	for range 300 {
		b, err := call(method, p.url(path), body)
		if err == nil && strings.Contains(string(b), want) {
			return nil
		}
		last = fmt.Sprint(string(b), err)
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s: %s never answered %q (last: %s)\n%s", p.name, path, want, last, p.log.String())
}
