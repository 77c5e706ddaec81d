package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// grpcLimit is the limit of every rule of grpcConfig, per second: no run
// reaches it, so that every answer is OK and every hit is counted.
const grpcLimit = 1_000_000_000

// grpcConfig is the configuration the service and envoy ratelimit both
// decide by in the gRPC comparison: one rule per descriptor key, each
// counting per value.
var grpcConfig = fmt.Sprintf(`domain: bench
descriptors:
  - key: hot
    rate_limit: {unit: second, requests_per_unit: %[1]d}
  - key: k
    rate_limit: {unit: second, requests_per_unit: %[1]d}
  - key: a
    rate_limit: {unit: second, requests_per_unit: %[1]d}
  - key: b
    rate_limit: {unit: second, requests_per_unit: %[1]d}
  - key: c
    rate_limit: {unit: second, requests_per_unit: %[1]d}
`, grpcLimit)

// grpcCeiling is the name of the comparison's ceiling: a grpc-go server
// that answers OK without deciding anything (./trivial).
const grpcCeiling = "trivial grpc-go server that decides nothing (the ceiling)"

// The systems of the gRPC comparison, in its order; envoy ratelimit runs
// only outside a smoke run.
const (
	rlsMemory = iota
	rlsRedis
	rlsCeiling
	rlsMemoryGoGC
	rlsEnvoy
)

// grpcGoGC names the service on the memory backend without its heap floor:
// Go's own pacing of the garbage collector, as without --gc-min-heap.
const grpcGoGC = "ratelimiter, memory backend, --gc-min-heap 0 (Go's own GC pacing)"

// grpcConns is how many client connections the generator spreads its
// workers over, round-robin: as a few Envoy workers would hold.
const grpcConns = 4

// grpcCase is one kind of ShouldRateLimit request: a descriptor of one
// entry per key, all with one value, "h" for the hot key or a random one
// of randomKeys.
type grpcCase struct {
	mode   string
	keys   []string
	random bool
}

var grpcCases = []grpcCase{
	{"1 descriptor, one hot key", []string{"hot"}, false},
	{"3 descriptors, one hot key", []string{"a", "b", "c"}, false},
	{fmt.Sprintf("1 descriptor, %d random keys", randomKeys), []string{"k"}, true},
	{fmt.Sprintf("3 descriptors, %d random keys", randomKeys), []string{"a", "b", "c"}, true},
}

// request is the case's request of value for every descriptor.
func (c grpcCase) request(value string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "bench", HitsAddend: 1}
	for _, k := range c.keys {
		req.Descriptors = append(req.Descriptors, &commonv3.RateLimitDescriptor{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: k, Value: value}},
		})
	}
	return req
}

// next returns what makes the requests of the case's runs: the same one,
// or one of a value drawn uniformly from randomKeys each time.
func (c grpcCase) next(values []string) func(*rand.Rand) *rlsv3.RateLimitRequest {
	if !c.random {
		hot := c.request("h")
		return func(*rand.Rand) *rlsv3.RateLimitRequest { return hot }
	}
	return func(r *rand.Rand) *rlsv3.RateLimitRequest { return c.request(values[r.IntN(len(values))]) }
}

// grpcSystem is one server of the gRPC comparison.
type grpcSystem struct {
	name    string
	servers []*proc // whose CPU counts: the server, and its Redis
	clients []rlsv3.RateLimitServiceClient
}

// grpcComparison loads the service on both backends and envoy ratelimit
// (not in a smoke run) with ShouldRateLimit calls of 1 and 3 descriptors,
// on one hot key and on random keys, in interleaved rounds.
func grpcComparison(cfg config, rig *redisRig, rep *report) error {
	// A directory of its own: startEnvoyWith writes its configuration into
	// dir/envoy-runtime, where the HTTP comparison's envoy ratelimit has
	// its own.
	dir := filepath.Join(cfg.dir, "grpc")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "rls.yaml")
	if err := os.WriteFile(path, []byte(grpcConfig), 0o644); err != nil {
		return err
	}
	svcMemory, memAddr, err := startGRPCService(cfg, "ratelimiter (memory backend, gRPC)", path)
	if err != nil {
		return err
	}
	defer svcMemory.stop()
	svcGoGC, goGCAddr, err := startGRPCService(cfg, "ratelimiter (memory backend, gRPC, --gc-min-heap 0)", path, "--gc-min-heap", "0")
	if err != nil {
		return err
	}
	defer svcGoGC.stop()
	svcRedis, redisAddr, err := startGRPCService(cfg, "ratelimiter (Redis backend, gRPC)", path,
		"--backend", "redis", "--redis-addrs", rig.redis.addr, "--redis-timeout", redisTimeout)
	if err != nil {
		return err
	}
	defer svcRedis.stop()
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	system := func(name, addr string, servers ...*proc) (grpcSystem, error) {
		s := grpcSystem{name: name, servers: servers}
		for range grpcConns {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return s, err
			}
			conns = append(conns, c)
			s.clients = append(s.clients, rlsv3.NewRateLimitServiceClient(c))
		}
		return s, nil
	}
	type target struct {
		name, addr string
		servers    []*proc
	}
	ceilingAddr, err := freeAddr()
	if err != nil {
		return err
	}
	ceiling, err := startTrivial(cfg, ceilingAddr, fmt.Sprint(grpcLimit))
	if err != nil {
		return err
	}
	defer ceiling.stop()
	targets := []target{
		{"ratelimiter, memory backend", memAddr, []*proc{svcMemory}},
		{"ratelimiter, Redis backend", redisAddr, []*proc{svcRedis, rig.redis}},
		{grpcCeiling, ceilingAddr, []*proc{ceiling}},
		{grpcGoGC, goGCAddr, []*proc{svcGoGC}},
	}
	if !cfg.smoke {
		envoy, envoyAddr, err := startEnvoyWith(dir, rig.redis.addr, grpcConfig, "bench.c")
		if err != nil {
			return err
		}
		defer envoy.stop()
		targets = append(targets, target{"envoy ratelimit (fixed window, same Redis)", envoyAddr, []*proc{envoy, rig.redis}})
	}
	var systems []grpcSystem
	for _, t := range targets {
		s, err := system(t.name, t.addr, t.servers...)
		if err != nil {
			return err
		}
		systems = append(systems, s)
	}
	// Check that every connection is up and that a grant looks like one
	// before counting any: envoy ratelimit answers OK, without a limit, to
	// descriptors it has no rule for.
	for _, s := range systems {
		for _, c := range grpcCases {
			for _, client := range s.clients {
				if err := checkGrant(client, c.request("v0"), len(c.keys)); err != nil {
					return fmt.Errorf("%s, %s: %w", s.name, c.mode, err)
				}
			}
		}
	}
	load := grpcLoad{workers: cfg.conns}
	if cfg.smoke {
		// A smoke run checks the harness, on a machine that may be busy
		// with other tests: a light load keeps the Redis backend within
		// its timeout there.
		load.workers = min(load.workers, 8)
	}
	values := make([]string, randomKeys)
	for i := range values {
		values[i] = fmt.Sprintf("v%d", i)
	}
	names := make([]string, len(systems))
	for i, s := range systems {
		names[i] = s.name
	}
	sec := rep.section("gRPC: Envoy's rate limit service (ShouldRateLimit), against envoy ratelimit")
	sec.printf("Each request is one `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` call of domain `bench` with 1 or 3 descriptors of one entry each, hits_addend 1, under rules that count per value with a limit of %s per second that no run reaches; both servers read the same configuration file (the service through `--envoy-config`). The random-key runs draw each request's value uniformly from %d (the same value for the 3 descriptors). The load is %s: closed loop, each worker sending its next call as soon as the last is answered. Every answer must be OK: one error or one answer not OK fails the run, and a decision the service on Redis could not make within its %s timeout is an error (UNAVAILABLE: it fails closed, its default). %d interleaved rounds of %s; median (min–max).\n\n",
		thousands(grpcLimit), randomKeys, load, redisTimeout, cfg.rounds, cfg.duration)
	sec.printf("Server CPU is that of the server's process, plus redis-server's for the systems on Redis: the service alone on the memory backend; the service and Redis on the Redis backend; envoy ratelimit and Redis (the same Redis); the ceiling alone. The ceiling is the least a grpc-go server can do with these calls: it decodes each request with go-control-plane's types and answers OK with a status per descriptor, deciding nothing and keeping no state, so what it answers per second is what grpc-go's server, as the service runs it (with the service's heap floor and stream workers), leaves room for on this machine with this load generator. The service also runs on the memory backend with `--gc-min-heap 0`, Go's own pacing of its garbage collector (GOGC=100), to show what the heap floor it keeps by default is worth. Semantics differ, and are compared as they are: the service decides the descriptors of a request together, all or nothing, in one decision (on Redis, one script run), by GCRA; envoy ratelimit counts each descriptor in its own fixed window aligned to the clock, and counts denied hits too.\n\n")
	sec.printf("The targets: the service on the memory backend answers at least 3× envoy ratelimit's requests per second, on the Redis backend at least 2×, and uses at most 0.5× envoy ratelimit's server CPU per request, each with its Redis. The ratios are per round, judged by their median.\n")
	rpsChart := sec.chart("grpc-requests", "gRPC ShouldRateLimit: requests per second (higher is better)", "requests/s")
	cpuChart := sec.chart("grpc-cpu", "gRPC ShouldRateLimit: server CPU per request, with its Redis if any (lower is better)", "server CPU µs/request")
	var summed [][]grpcRatio // by case
	for _, c := range grpcCases {
		next := c.next(values)
		results := make([][]sample, len(systems))
		for round := range cfg.rounds {
			for i, s := range systems {
				x, err := load.run(s.clients, next, cfg.duration, s.servers...)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", s.name, c.mode, err)
				}
				results[i] = append(results[i], x)
				cfg.progress("round %d  %-34s %-44s %8.0f/s  p99 %6.0f µs  server CPU %5.1f µs  load CPU %5.1f µs", round+1, c.mode, s.name, x.rps, x.p99, x.serverCPU, x.loadCPU)
			}
		}
		rpsChart.add(c.mode, names, column(results, func(x sample) float64 { return x.rps }))
		cpuChart.add(c.mode, names, column(results, func(x sample) float64 { return x.serverCPU }))
		sec.printf("\n### %s\n\n", c.mode)
		sec.sampleTable("request", names, results)
		sec.printf("\n")
		summed = append(summed, grpcRatios(sec, results))
	}
	rep.facts = append(rep.facts, grpcFacts(summed)...)
	return grpcLatency(cfg, sec, systems, names, values, rep)
}

// grpcLatency measures the systems' latency at one open-loop rate that
// each of them sustains, on the first and the last case, in interleaved
// rounds. The target: the service's p99 below envoy ratelimit's.
func grpcLatency(cfg config, sec *section, systems []grpcSystem, names, values []string, rep *report) error {
	open := grpcOpenLoad{rate: cfg.rate}
	sec.printf("\n### Latency at an equal open-loop rate\n\n")
	sec.printf("The same requests at a fixed rate that every system sustains: %s. The target: the service's p99 below envoy ratelimit's on each backend. %d interleaved rounds of %s; median (min–max).\n", open, cfg.rounds, cfg.duration)
	for _, c := range []grpcCase{grpcCases[0], grpcCases[len(grpcCases)-1]} {
		next := c.next(values)
		results := make([][]sample, len(systems))
		for round := range cfg.rounds {
			for i, s := range systems {
				x, err := open.run(s.clients, next, cfg.duration, s.servers...)
				if err != nil {
					return fmt.Errorf("%s, %s at %d/s: %w", s.name, c.mode, cfg.rate, err)
				}
				results[i] = append(results[i], x)
				cfg.progress("round %d  %-34s %-44s at %d/s  p50 %6.0f µs  p99 %6.0f µs  server CPU %5.1f µs", round+1, c.mode, s.name, cfg.rate, x.p50, x.p99, x.serverCPU)
			}
		}
		sec.printf("\n#### %s, %d calls per second\n\n", c.mode, cfg.rate)
		sec.sampleTable("request", names, results)
		sec.printf("\n")
		const envoy = rlsEnvoy
		if len(results) <= envoy {
			sec.printf("No ratios: envoy ratelimit does not run in a smoke run.\n")
			continue
		}
		for i, backend := range []string{"memory", "Redis"} {
			xs := make([]float64, len(results[i]))
			for r := range xs {
				xs[r] = results[i][r].p99 / results[envoy][r].p99
			}
			met := median(xs) < 1
			sec.printf("- %s backend ÷ envoy ratelimit, p99 at %d/s: %s (target below 1×: %s)\n", backend, cfg.rate, stat(xs, "%.2f×"), verdict(met))
			rep.facts = append(rep.facts, fmt.Sprintf("gRPC ShouldRateLimit, %s, %s backend ÷ envoy ratelimit, p99 at an equal open-loop %d/s (target below 1×): %s, %s", c.mode, backend, cfg.rate, stat(xs, "%.2f×"), verdict(met)))
		}
	}
	return nil
}

// startGRPCService runs the service with the rules of the file path on a
// gRPC port of its own, and args, until it is ready; it returns the server
// and its gRPC address.
func startGRPCService(cfg config, name, path string, args ...string) (*proc, string, error) {
	var addrs [2]string
	var err error
	for i := range addrs {
		if addrs[i], err = freeAddr(); err != nil {
			return nil, "", err
		}
	}
	p, err := start(name, addrs[0], nil, cfg.service, append([]string{"--listen", addrs[0], "--grpc-listen", addrs[1],
		"--envoy-config", path, "--log-level", "warn"}, args...)...)
	if err != nil {
		return nil, "", err
	}
	if err := ready(p); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, addrs[1], nil
}

// checkGrant sends req once, waiting for the connection to be up, and
// fails unless the answer is OK with n statuses, each OK under a limit of
// grpcLimit.
func checkGrant(client rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	ok := resp.OverallCode == rlsv3.RateLimitResponse_OK && len(resp.Statuses) == n
	for _, s := range resp.Statuses {
		ok = ok && s.Code == rlsv3.RateLimitResponse_OK && s.CurrentLimit.GetRequestsPerUnit() == grpcLimit
	}
	if !ok {
		return fmt.Errorf("a grant answered %v, want OK with %d statuses OK under a limit of %d", resp, n, grpcLimit)
	}
	return nil
}

// grpcLoad is a closed-loop load of ShouldRateLimit calls: workers
// goroutines of this process, spread round-robin over the connections
// given to run, each sending its next call as soon as the last is
// answered.
type grpcLoad struct {
	workers int
}

func (g grpcLoad) String() string {
	return fmt.Sprintf("this harness's own generator, %d workers over %d gRPC connections", g.workers, grpcConns)
}

// run calls ShouldRateLimit with the requests next makes, through clients,
// for d, and measures the servers' CPU around it. Any error, and any
// answer but OK, fails the run.
func (g grpcLoad) run(clients []rlsv3.RateLimitServiceClient, next func(*rand.Rand) *rlsv3.RateLimitRequest, d time.Duration, servers ...*proc) (sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		lat      = make([][]time.Duration, g.workers)
		failed   atomic.Int64 // errors
		notOK    atomic.Int64
		errOnce  sync.Once
		firstErr error
	)
	measure := cpuOf(servers)
	self := selfCPU()
	start := time.Now()
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	for w := range g.workers {
		wg.Go(func() {
			client := clients[w%len(clients)]
			r := rand.New(rand.NewPCG(7919, uint64(w)))
			for !stop.Load() {
				req := next(r)
				sent := time.Now()
				resp, err := client.ShouldRateLimit(ctx, req)
				lat[w] = append(lat[w], time.Since(sent))
				switch {
				case err != nil:
					failed.Add(1)
					errOnce.Do(func() { firstErr = err })
				case resp.OverallCode != rlsv3.RateLimitResponse_OK:
					notOK.Add(1)
					errOnce.Do(func() { firstErr = fmt.Errorf("answered %v", resp) })
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	loadCPU := selfCPU() - self
	serverCPU, err := measure()
	if err != nil {
		return sample{}, err
	}
	all := slices.Concat(lat...)
	total := float64(len(all))
	if e, n := failed.Load(), notOK.Load(); e > 0 || n > 0 {
		return sample{}, fmt.Errorf("%d errors and %d answers not OK in %.0f requests; the first: %v", e, n, total, firstErr)
	}
	if len(all) == 0 {
		return sample{}, fmt.Errorf("no call was answered in %s", d)
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[int(p/100*float64(len(all)-1))].Nanoseconds()) / 1e3
	}
	return sample{
		requests: total, rps: total / elapsed.Seconds(),
		p50: pct(50), p99: pct(99), p999: pct(99.9),
		serverCPU: perRequest(serverCPU, total), loadCPU: perRequest(loadCPU, total),
		rss: rssOf(servers),
	}, nil
}

// grpcRatio is a ratio of the service to envoy ratelimit, per round, and
// its target if it has one.
type grpcRatio struct {
	text   string
	xs     []float64
	target string // "" for none
	met    bool   // by the median
	// summary puts a ratio without a target in the report's summary too.
	summary bool
}

// grpcRatios writes, for one case, the ratios of the service on each
// backend to envoy ratelimit, per round (systems in grpcComparison's
// order), to the ceiling, and the ceiling's to envoy ratelimit; it
// returns those for the summary, each with its target if it has one, and
// none when envoy ratelimit did not run.
func grpcRatios(sec *section, results [][]sample) []grpcRatio {
	const mem, red, ceiling, goGC, envoy = rlsMemory, rlsRedis, rlsCeiling, rlsMemoryGoGC, rlsEnvoy
	if len(results) <= envoy {
		sec.printf("No ratios: envoy ratelimit does not run in a smoke run.\n")
		return nil
	}
	ratio := func(a, b int, v func(sample) float64) []float64 {
		xs := make([]float64, len(results[a]))
		for r := range xs {
			xs[r] = v(results[a][r]) / v(results[b][r])
		}
		return xs
	}
	rps := func(x sample) float64 { return x.rps }
	p99 := func(x sample) float64 { return x.p99 }
	cpu := func(x sample) float64 { return x.serverCPU }
	memRPS, redRPS, redCPU := ratio(mem, envoy, rps), ratio(red, envoy, rps), ratio(red, envoy, cpu)
	all := []grpcRatio{
		{"memory backend ÷ envoy ratelimit, requests/s", memRPS, "≥ 3×", median(memRPS) >= 3, false},
		{"Redis backend ÷ envoy ratelimit on the same Redis, requests/s", redRPS, "≥ 2×", median(redRPS) >= 2, false},
		{"memory backend ÷ envoy ratelimit, p99 latency", ratio(mem, envoy, p99), "", false, false},
		{"Redis backend ÷ envoy ratelimit, p99 latency", ratio(red, envoy, p99), "", false, false},
		{"Redis backend ÷ envoy ratelimit, server CPU per request, each with its Redis", redCPU, "≤ 0.5×", median(redCPU) <= 0.5, false},
		{"memory backend (the service alone) ÷ envoy ratelimit with its Redis, server CPU per request", ratio(mem, envoy, cpu), "", false, false},
		{"the ceiling (a grpc-go server deciding nothing) ÷ envoy ratelimit, requests/s", ratio(ceiling, envoy, rps), "", false, true},
		{"memory backend ÷ the ceiling, requests/s", ratio(mem, ceiling, rps), "", false, true},
		{"memory backend ÷ the ceiling, server CPU per request", ratio(mem, ceiling, cpu), "", false, false},
		{"memory backend ÷ the same with --gc-min-heap 0, server CPU per request", ratio(mem, goGC, cpu), "", false, true},
		{"memory backend with --gc-min-heap 0 ÷ envoy ratelimit, requests/s", ratio(goGC, envoy, rps), "", false, true},
	}
	var summed []grpcRatio
	for _, r := range all {
		v := fmt.Sprintf("%s: %s", r.text, stat(r.xs, "%.2f×"))
		if r.target != "" {
			v += fmt.Sprintf(" (target %s: %s)", r.target, verdict(r.met))
		}
		if r.target != "" || r.summary {
			summed = append(summed, r)
		}
		sec.printf("- %s\n", v)
	}
	return summed
}

// grpcFacts are the summary's lines of grpcRatios' ratios: one per
// ratio, with its figure in every case, and its verdict if it has a
// target.
func grpcFacts(byCase [][]grpcRatio) []string {
	if len(byCase) == 0 || len(byCase[0]) == 0 {
		return nil
	}
	var facts []string
	for j, r := range byCase[0] {
		var cases []string
		for i, rs := range byCase {
			c := fmt.Sprintf("%s %s", grpcCases[i].mode, stat(rs[j].xs, "%.2f×"))
			if r.target != "" {
				c += ", " + verdict(rs[j].met)
			}
			cases = append(cases, c)
		}
		text := r.text
		if r.target != "" {
			text += fmt.Sprintf(" (target %s)", r.target)
		}
		facts = append(facts, fmt.Sprintf("gRPC ShouldRateLimit, %s: %s", text, strings.Join(cases, "; ")))
	}
	return facts
}
