package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
)

// benchLimiter is the limiter every HTTP run acquires from: a limit no run
// can exhaust, so that every answer takes the full grant path and writes.
const (
	benchLimiter = "bench"
	benchSpec    = `{"limit":1000000000,"period":"1s"}`
	acquireBody  = `{"permits":1}`
	keyPrefix    = "ratelimiter:" // the service's default
)

// batchSize is the number of acquisitions in each benchmarked batch.
const batchSize = 100

// batchBody is an acquireBatch body of n acquisitions of 1 permit from
// benchLimiter.
func batchBody(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = `{"limiter":"` + benchLimiter + `"}`
	}
	return `{"acquisitions":[` + strings.Join(items, ",") + `]}`
}

// redisRig is one Redis server and the service twice, on the Redis backend
// and on the memory backend, all on loopback.
type redisRig struct {
	redis, svcRedis, svcMemory *proc
	client                     rueidis.Client
	// The EVALSHA the service sends for one acquisition from benchLimiter,
	// as redis-benchmark's arguments.
	evalsha []string
	// The service's decision counts as of the last degradedSince.
	degraded, decisions int64
}

func startRedisRig(cfg config) (*redisRig, error) {
	r := &redisRig{}
	ok := false
	defer func() {
		if !ok {
			r.stop()
		}
	}()
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := strings.Cut(addr, ":")
	// No persistence, as a rate limiter's Redis usually runs, and the
	// eviction policy the README asks for.
	r.redis, err = start("redis-server", addr, nil, "redis-server", "--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction")
	if err != nil {
		return nil, err
	}
	for _, s := range []struct {
		p    **proc
		name string
		args []string
	}{
		{&r.svcRedis, "ratelimiter (Redis backend)", []string{"--backend", "redis", "--redis-addrs", addr, "--redis-timeout", redisTimeout}},
		{&r.svcMemory, "ratelimiter (memory backend)", nil},
	} {
		listen, err := freeAddr()
		if err != nil {
			return nil, err
		}
		// Per-IP tenants with a limit no run reaches, for the random-key
		// runs. No gRPC port: both would take the default one (the gRPC
		// comparison starts services of its own).
		args := append([]string{"--listen", listen, "--grpc-listen", "", "--log-level", "warn", "--tenant-limit", "1000000000"}, s.args...)
		*s.p, err = start(s.name, listen, nil, cfg.service, args...)
		if err != nil {
			return nil, err
		}
		if err := ready(*s.p); err != nil {
			return nil, err
		}
		if _, err := call("PUT", (*s.p).url("/v1/limiters/"+benchLimiter), benchSpec); err != nil {
			return nil, err
		}
	}
	r.client, err = rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return nil, err
	}
	script, keys, args := limiterredis.AcquireCall(keyPrefix, benchLimiter, 1)
	sha, err := r.client.Do(context.Background(), r.client.B().ScriptLoad().Script(script).Build()).ToString()
	if err != nil {
		return nil, fmt.Errorf("SCRIPT LOAD: %w", err)
	}
	r.evalsha = append(append([]string{"EVALSHA", sha, strconv.Itoa(len(keys))}, keys...), args...)
	ok = true
	return r, nil
}

func (r *redisRig) stop() {
	if r.client != nil {
		r.client.Close()
	}
	for _, p := range []*proc{r.svcRedis, r.svcMemory, r.redis} {
		if p != nil {
			p.stop()
		}
	}
}

func (p *proc) url(path string) string { return "http://" + p.addr + path }

// ready waits until the service answers /readyz with 200 (on the Redis
// backend: once it has connected).
func ready(p *proc) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := call("GET", p.url("/readyz"), "")
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not ready after 15s: %v\n%s", p.name, err, p.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redisTimeout is the service's longest wait for Redis to answer a
// decision in these runs: its default.
const redisTimeout = "50ms"

// maxDegraded is the share of the Redis backend's decisions that may be
// degraded (not answered by Redis within the service's timeout, so decided
// by its failure mode) in a stretch of runs that still counts. Under a
// saturating load on shared cores a rare decision waits past the timeout;
// more than this means the load is more than this Redis answers in time.
const maxDegraded = 1e-4

// decisionCounts is how many decisions the service made, and how many of
// them without its backend, from its own metrics.
func decisionCounts(p *proc) (degraded, total int64, err error) {
	b, err := call("GET", p.url("/metrics"), "")
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "ratelimiter_decisions_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, 0, fmt.Errorf("metrics line %q: %w", line, err)
		}
		total += int64(v)
		if strings.Contains(line, `degraded="true"`) {
			degraded += int64(v)
		}
	}
	return degraded, total, sc.Err()
}

// degradedSince is how many of the decisions the service on Redis made
// since the last call were degraded, out of how many, written as a
// sentence; it fails when more than maxDegraded of them were.
func (r *redisRig) degradedSince() (string, error) {
	degraded, total, err := decisionCounts(r.svcRedis)
	if err != nil {
		return "", err
	}
	n, of := degraded-r.degraded, total-r.decisions
	r.degraded, r.decisions = degraded, total
	if of > 0 && float64(n)/float64(of) > maxDegraded {
		return "", fmt.Errorf("the service on Redis made %d of %d decisions without Redis (past its timeout), more than %g of them: the load is more than this Redis answers in time", n, of, maxDegraded)
	}
	return fmt.Sprintf("Degraded decisions (not answered by Redis within the service's %s timeout, so denied by its fail-closed mode; a run with more than %g of them would not count): %d of %d on the Redis backend.", redisTimeout, maxDegraded, n, of), nil
}

// redisThroughput compares, in interleaved rounds, redis-benchmark running
// the service's own acquire script (-P 1 and -P 16) with HTTP acquisitions
// through the service on the Redis backend and on the memory backend.
func redisThroughput(cfg config, rig *redisRig, rep *report) error {
	w, err := newWrk(cfg.dir, "acquire", acquireBody, cfg.wrkThreads, cfg.conns)
	if err != nil {
		return err
	}
	// Batches keep fewer requests in flight: 100 decisions each already
	// fill Redis's queue, and more would only wait past the timeout.
	wb, err := newWrk(cfg.dir, "batch", batchBody(batchSize), cfg.wrkThreads, cfg.batchConns)
	if err != nil {
		return err
	}
	acquire := "/v1/limiters/" + benchLimiter + "/acquire"
	// redis-benchmark runs a number of commands, not a duration: size each
	// run from a first one so that it lasts about as long as wrk's.
	sizes := map[int]int{}
	for _, pipeline := range []int{1, 16} {
		s, err := redisBenchmark(rig.redis, cfg.conns, pipeline, 20000, rig.evalsha...)
		if err != nil {
			return err
		}
		sizes[pipeline] = max(int(s.rps*cfg.duration.Seconds()), 1000)
	}
	type system struct {
		name string
		run  func() (sample, error)
	}
	systems := []system{
		{"redis-benchmark -P 1 (EVALSHA, the service's script)", func() (sample, error) {
			return redisBenchmark(rig.redis, cfg.conns, 1, sizes[1], rig.evalsha...)
		}},
		{"redis-benchmark -P 16 (EVALSHA, the service's script)", func() (sample, error) {
			return redisBenchmark(rig.redis, cfg.conns, 16, sizes[16], rig.evalsha...)
		}},
		{"ratelimiter, Redis backend (HTTP acquire)", func() (sample, error) {
			return w.run(rig.svcRedis.url(acquire), cfg.duration, rig.svcRedis, rig.redis)
		}},
		{"ratelimiter, memory backend (HTTP acquire)", func() (sample, error) {
			return w.run(rig.svcMemory.url(acquire), cfg.duration, rig.svcMemory)
		}},
		{fmt.Sprintf("ratelimiter, Redis backend (HTTP batches of %d)", batchSize), func() (sample, error) {
			return perDecision(wb.run(rig.svcRedis.url("/v1/acquire"), cfg.duration, rig.svcRedis, rig.redis))
		}},
		{fmt.Sprintf("ratelimiter, memory backend (HTTP batches of %d)", batchSize), func() (sample, error) {
			return perDecision(wb.run(rig.svcMemory.url("/v1/acquire"), cfg.duration, rig.svcMemory))
		}},
	}
	// Warm the services up once.
	for _, s := range systems[2:] {
		if _, err := s.run(); err != nil {
			return err
		}
	}
	results := make([][]sample, len(systems))
	var ratio, ratioP1, batchRatio []float64
	if _, err := rig.degradedSince(); err != nil { // the warm-up's
		return err
	}
	for round := range cfg.rounds {
		for i, s := range systems {
			x, err := s.run()
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			results[i] = append(results[i], x)
			cfg.progress("round %d  %-56s %9.0f/s  p50 %6.0f µs  p99 %6.0f µs  server CPU %5.1f µs  load CPU %5.1f µs", round+1, s.name, x.rps, x.p50, x.p99, x.serverCPU, x.loadCPU)
		}
		n := len(results[2]) - 1
		ratio = append(ratio, results[2][n].rps/results[1][n].rps)
		ratioP1 = append(ratioP1, results[2][n].rps/results[0][n].rps)
		batchRatio = append(batchRatio, results[4][n].rps/results[1][n].rps)
	}
	degradedNote, err := rig.degradedSince()
	if err != nil {
		return err
	}
	sec := rep.section("Redis backend: decisions per second against Redis's own ceiling")
	sec.printf("One Redis %s on loopback (no persistence). redis-benchmark sends the very EVALSHA the service sends for one acquisition (the script, keys and arguments of `AcquireCall`), from %d clients, unpipelined and 16 commands per pipeline; the service is loaded by %s over HTTP/1.1 keep-alive, each request one acquisition of 1 permit from one limiter (GCRA, a limit never reached, so every answer writes). The service's CPU on the Redis backend includes Redis's. %d interleaved rounds of about %s; median (min–max).\n\n",
		cfg.redisVersion, cfg.conns, w, cfg.rounds, cfg.duration)
	sec.printf("Batches are `POST /v1/acquire` with %d acquisitions of 1 permit from the same limiter, sent by %s: their figures are per decision, their latency per request.\n\n", batchSize, wb)
	names := make([]string, len(systems))
	for i, s := range systems {
		names[i] = s.name
	}
	sec.chart("redis-decisions", "Redis backend: decisions per second against redis-benchmark (higher is better)", "decisions/s").
		add("decisions/s", names, column(results, func(x sample) float64 { return x.rps }))
	sec.sampleTable("decision", names, results)
	sec.printf("\nThrough the service on Redis, decisions per second ÷ redis-benchmark's -P 16, per round: **%s with batches of %d** (target ≥ 60%%: %s); %s with one acquisition per request (%s of -P 1).\n",
		pct(batchRatio), batchSize, verdict(median(batchRatio) >= 0.6), pct(ratio), pct(ratioP1))
	memBatch := make([]float64, len(results[5]))
	for i, x := range results[5] {
		memBatch[i] = x.rps
	}
	rep.facts = append(rep.facts,
		fmt.Sprintf("Redis backend, decisions/s through the service ÷ redis-benchmark -P 16 running the same script: %s with batches of %d (target ≥ 60%%: %s), %s with one acquisition per request", pct(batchRatio), batchSize, verdict(median(batchRatio) >= 0.6), pct(ratio)),
		fmt.Sprintf("Memory backend, batches of %d: %s decisions/s (target ≥ 1,000,000: %s)", batchSize, stat(memBatch, "%.0f"), verdict(median(memBatch) >= 1e6)))
	sec.printf("\nMemory backend, batches of %d: %s decisions/s (target ≥ 1,000,000: %s).\n", batchSize, stat(memBatch, "%.0f"), verdict(median(memBatch) >= 1e6))
	sec.printf("\n%s\n", degradedNote)
	return nil
}

// redisLatency measures, at one moderate fixed rate, what answering from
// Redis adds to an acquisition's latency, against the memory backend.
func redisLatency(cfg config, rig *redisRig, rep *report) error {
	acquire := "/v1/limiters/" + benchLimiter + "/acquire"
	targets := []*proc{rig.svcMemory, rig.svcRedis}
	names := []string{"ratelimiter, memory backend", "ratelimiter, Redis backend"}
	results := make([][]sample, len(targets))
	var added50, added99, added999 []float64
	for round := range cfg.rounds {
		for i, p := range targets {
			servers := []*proc{p}
			if p == rig.svcRedis {
				servers = append(servers, rig.redis)
			}
			x, err := openLoop(p.url(acquire), acquireBody, cfg.rate, cfg.duration, servers...)
			if err != nil {
				return fmt.Errorf("%s: %w", names[i], err)
			}
			results[i] = append(results[i], x)
			cfg.progress("round %d  %-56s %9.0f/s  p50 %6.0f µs  p99 %6.0f µs", round+1, names[i]+" at a fixed rate", x.rps, x.p50, x.p99)
		}
		n := len(results[0]) - 1
		added50 = append(added50, results[1][n].p50-results[0][n].p50)
		added99 = append(added99, results[1][n].p99-results[0][n].p99)
		added999 = append(added999, results[1][n].p999-results[0][n].p999)
	}
	degradedNote, err := rig.degradedSince()
	if err != nil {
		return err
	}
	sec := rep.section("Redis backend: latency added by Redis")
	sec.printf("An open-loop load of %d acquisitions per second (a moderate load: a fraction of either backend's capacity here), sent on schedule whether or not earlier ones were answered, each timed from when it was sent until its answer was read. %d interleaved rounds of %s; median (min–max).\n\n",
		cfg.rate, cfg.rounds, cfg.duration)
	sec.sampleTable("decision", names, results)
	sec.printf("\nAdded by Redis (Redis backend − memory backend, per round): **p50 %s µs, p99 %s µs**, p99.9 %s µs.\n",
		stat(added50, "%.0f"), stat(added99, "%.0f"), stat(added999, "%.0f"))
	sec.printf("\n%s\n", degradedNote)
	return nil
}
