package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/rueidis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// denyLimit is the limit of the deny comparison's one rule, per second: far
// below what the Redis backend answers without the denial cache, so that
// most answers are denials. On a machine of 2 cores it answered 9,400/s
// (18.8× a limit of 500): this limit leaves room for denyMinOverload there.
const denyLimit = 250

// denyMinOverload is the least load a run of the deny comparison must
// offer, as a multiple of denyLimit, to count (not checked in a smoke run).
const denyMinOverload = 20

// denyConfig is the configuration of the deny comparison: one rule,
// counting per value of the hot key.
var denyConfig = fmt.Sprintf(`domain: bench
descriptors:
  - key: hot
    rate_limit: {unit: second, requests_per_unit: %d}
`, denyLimit)

// denyRequest is every request of the deny comparison: one hit on the one
// value of the hot key.
var denyRequest = &rlsv3.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{{
	Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "hot", Value: "h"}},
}}}

// denyRun is one run of the deny comparison: what every load measures
// (rps counting every answer), and what this one adds.
type denyRun struct {
	sample
	ok       float64       // OK answers
	elapsed  time.Duration // from the first call sent to the last answered
	allowed  float64       // OK answers per second
	scripts  float64       // scripts Redis ran per second (EVAL, EVALSHA and their read-only forms)
	commands float64       // commands Redis processed per second (total_commands_processed)
	redisCPU float64       // redis-server's CPU per answer, µs: part of serverCPU
}

// denyComparison loads the service on the Redis backend, with and without
// its denial cache, with ShouldRateLimit calls on one key far over its
// limit, in interleaved rounds, and counts the commands each sends Redis.
func denyComparison(cfg config, rig *redisRig, rep *report) error {
	dir := filepath.Join(cfg.dir, "deny")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "rls.yaml")
	if err := os.WriteFile(path, []byte(denyConfig), 0o644); err != nil {
		return err
	}
	redisArgs := []string{"--backend", "redis", "--redis-addrs", rig.redis.addr, "--redis-timeout", redisTimeout}
	// A key prefix each, so that neither decides on the other's state.
	svcOff, offAddr, err := startGRPCService(cfg, "ratelimiter (Redis backend, gRPC, no denial cache)", path,
		slices.Concat(redisArgs, []string{"--redis-key-prefix", "denyoff:", "--redis-deny-cache", "0"})...)
	if err != nil {
		return err
	}
	defer svcOff.stop()
	svcOn, onAddr, err := startGRPCService(cfg, "ratelimiter (Redis backend, gRPC, denial cache)", path,
		slices.Concat(redisArgs, []string{"--redis-key-prefix", "denyon:"})...)
	if err != nil {
		return err
	}
	defer svcOn.stop()
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var systems []grpcSystem
	for _, t := range []struct {
		name, addr string
		svc        *proc
	}{
		{"ratelimiter, Redis backend, without the denial cache (--redis-deny-cache 0)", offAddr, svcOff},
		{"ratelimiter, Redis backend, with the denial cache (its default)", onAddr, svcOn},
	} {
		s := grpcSystem{name: t.name, servers: []*proc{t.svc, rig.redis}}
		for range grpcConns {
			c, err := grpc.NewClient(t.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			conns = append(conns, c)
			s.clients = append(s.clients, rlsv3.NewRateLimitServiceClient(c))
		}
		for _, client := range s.clients {
			if err := checkDecision(client); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
		systems = append(systems, s)
	}
	load := grpcLoad{workers: cfg.conns}
	if cfg.smoke {
		// As in the gRPC comparison: a light load on a machine that may be
		// busy with other tests.
		load.workers = min(load.workers, 8)
	}
	// Redis also serves, all along, what the idle services send it (their
	// health checks and the like): measured once, with no load.
	idle, err := idleRedis(rig.client, cfg.duration)
	if err != nil {
		return err
	}
	cfg.progress("idle Redis: %.1f scripts/s, %.1f commands/s", idle.scripts, idle.commands)
	names := make([]string, len(systems))
	for i, s := range systems {
		names[i] = s.name
	}
	runs := make([][]denyRun, len(systems))
	var scriptRatio, rpsRatio, commandRatio []float64
	worst := 0.0 // the largest share of the admission bound a run reached
	for round := range cfg.rounds {
		for i, s := range systems {
			x, err := load.runOver(s.clients, denyRequest, cfg.duration, rig, s.servers...)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			cfg.progress("round %d  %-76s %8.0f/s  allowed %6.0f/s  Redis %8.0f scripts/s %8.0f commands/s  p99 %6.0f µs  server CPU %5.1f µs",
				round+1, s.name, x.rps, x.allowed, x.scripts, x.commands, x.p99, x.serverCPU)
			// GCRA admits at most its burst (the limit, for a unit of a
			// second) plus the limit per second of any stretch of time.
			bound := denyLimit*x.elapsed.Seconds() + denyLimit
			if x.ok > bound {
				return fmt.Errorf("%s: %.0f answers OK in %s, more than the %.0f a limit of %d per second admits", s.name, x.ok, x.elapsed, bound, denyLimit)
			}
			worst = max(worst, x.ok/bound)
			if over := x.rps / denyLimit; over < denyMinOverload && !cfg.smoke {
				return fmt.Errorf("%s: the load offered %.1f× the limit, less than %d×: the run does not count", s.name, over, denyMinOverload)
			}
			runs[i] = append(runs[i], x)
		}
		off, on := runs[0][round], runs[1][round]
		scriptRatio = append(scriptRatio, off.scripts/on.scripts)
		commandRatio = append(commandRatio, off.commands/on.commands)
		rpsRatio = append(rpsRatio, on.rps/off.rps)
	}
	results := make([][]sample, len(runs))
	for i, rs := range runs {
		for _, x := range rs {
			results[i] = append(results[i], x.sample)
		}
	}
	of := func(i int, f func(denyRun) float64) []float64 {
		xs := make([]float64, len(runs[i]))
		for r, x := range runs[i] {
			xs[r] = f(x)
		}
		return xs
	}
	sec := rep.section(fmt.Sprintf("Denials without a round trip: a hot key at %d× its limit or more, on Redis", denyMinOverload))
	sec.printf("With `--redis-deny-cache` on (its default), the service on the Redis backend remembers, per limiter and key, what Redis's last answer proved (no permit fits for a while), and answers a decision Redis would deny without asking Redis. This compares two services on the same Redis %s, one with `--redis-deny-cache 0` and one with the default, each under a key prefix of its own, one loaded at a time.\n\n", cfg.redisVersion)
	sec.printf("Each request is one `ShouldRateLimit` call of domain `bench` with one descriptor `hot=h`, hits_addend 1, under one rule of %d per second (`--envoy-config`). The load is %s: closed loop, so the load offered is what the system answers, which must be at least %d× the limit for a run to count (not checked in a smoke run). Answers are OK or OVER_LIMIT; an error, or any other code, fails the run, and so does a run whose OK answers exceed what the limit admits: %d × its length in seconds + %d (the burst of a one-second unit). %d interleaved rounds of %s; median (min–max).\n\n",
		denyLimit, load, denyMinOverload, denyLimit, denyLimit, cfg.rounds, cfg.duration)
	sec.printf("Redis's work is read from its `INFO commandstats` (scripts run: EVAL, EVALSHA and their read-only forms) and `INFO stats` (total_commands_processed, which counts the commands the scripts call as well) before and after each run. Only one service is loaded at a time, so what changed over a run is that run's, with what the idle services send meanwhile: measured with no load over %s, %.1f scripts/s and %.1f commands/s. Server CPU is the service's and redis-server's. The table's decisions are all answers, OK and OVER_LIMIT.\n\n",
		cfg.duration, idle.scripts, idle.commands)
	sec.printf("The targets: with the cache, Redis runs at most a tenth of the scripts per second it runs without (≥ 10× fewer), and the service answers at least 3× the decisions per second. The ratios are per round, judged by their median.\n\n")
	c := sec.chart("deny", "A hot key over its limit on Redis: per second, with and without the denial cache (higher is more)", "per second")
	c.add("decisions/s", names, column(results, func(x sample) float64 { return x.rps }))
	c.add("Redis scripts/s", names, [][]float64{of(0, scriptsOf), of(1, scriptsOf)})
	sec.sampleTable("decision", names, results)
	sec.printf("\n| system | allowed (OK)/s | load offered ÷ limit | Redis scripts/s | Redis commands/s | of the server CPU, redis-server's µs/decision |\n|---|---|---|---|---|---|\n")
	for i, name := range names {
		sec.printf("| %s | %s | %s | %s | %s | %s |\n", name,
			stat(of(i, func(x denyRun) float64 { return x.allowed }), "%.0f"),
			stat(of(i, func(x denyRun) float64 { return x.rps / denyLimit }), "%.1f×"),
			stat(of(i, scriptsOf), "%.0f"),
			stat(of(i, func(x denyRun) float64 { return x.commands }), "%.0f"),
			stat(of(i, func(x denyRun) float64 { return x.redisCPU }), "%.1f"))
	}
	sec.printf("\nAllowed per second counts the burst: over a run of %s, the most the limit admits is %.1f/s.\n", cfg.duration, denyLimit+denyLimit/cfg.duration.Seconds())
	sec.printf("Over-admission: none. No run answered OK more often than the limit admits; the most OK answers of a run were %.2f%% of what it admits (%d × its length + %d). That the cache never denies what Redis would grant is checked decision by decision, against Redis at the same instant, by TestDenialsAgainstRedis in internal/limiter/redis.\n\n", worst*100, denyLimit, denyLimit)
	ratios := []struct {
		text   string
		xs     []float64
		target string
		met    bool
	}{
		{"Redis scripts/s without the cache ÷ with it", scriptRatio, "≥ 10×", median(scriptRatio) >= 10},
		{"decisions/s with the cache ÷ without it", rpsRatio, "≥ 3×", median(rpsRatio) >= 3},
		{"Redis commands/s (all) without the cache ÷ with it", commandRatio, "", false},
	}
	for _, r := range ratios {
		v := fmt.Sprintf("%s: %s", r.text, stat(r.xs, "%.2f×"))
		if r.target != "" {
			v += fmt.Sprintf(" (target %s: %s)", r.target, verdict(r.met))
			rep.facts = append(rep.facts, fmt.Sprintf("Denial cache, a hot key at %d× its limit or more on Redis (gRPC ShouldRateLimit), %s", denyMinOverload, v))
		}
		sec.printf("- %s\n", v)
	}
	return nil
}

func scriptsOf(x denyRun) float64 { return x.scripts }

// checkDecision sends denyRequest once, waiting for the connection to be
// up, and fails unless the answer is OK or OVER_LIMIT with one status
// under a limit of denyLimit.
func checkDecision(client rlsv3.RateLimitServiceClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, denyRequest, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	decided := resp.OverallCode == rlsv3.RateLimitResponse_OK || resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT
	if !decided || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != denyLimit {
		return fmt.Errorf("a decision answered %v, want OK or OVER_LIMIT with one status under a limit of %d", resp, denyLimit)
	}
	return nil
}

// runOver is run for a load over the limit: it sends req through clients
// for d, counting the answers OK and OVER_LIMIT apart, and measures the
// servers' CPU and what the rig's Redis did meanwhile. Any error, and any
// other answer, fails the run.
func (g grpcLoad) runOver(clients []rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, d time.Duration, rig *redisRig, servers ...*proc) (denyRun, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	var (
		stop        atomic.Bool
		wg          sync.WaitGroup
		lat         = make([][]time.Duration, g.workers)
		ok, over    atomic.Int64
		failed      atomic.Int64 // errors and other answers
		unavailable atomic.Int64 // UNAVAILABLE: decisions past the service's Redis timeout
		errOnce     sync.Once
		firstErr    error
	)
	scripts0, commands0, err := redisCounts(rig.client)
	if err != nil {
		return denyRun{}, err
	}
	measure, measureRedis := cpuOf(servers), cpuOf([]*proc{rig.redis})
	self := selfCPU()
	start := time.Now()
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	for w := range g.workers {
		wg.Go(func() {
			client := clients[w%len(clients)]
			for !stop.Load() {
				sent := time.Now()
				resp, err := client.ShouldRateLimit(ctx, req)
				lat[w] = append(lat[w], time.Since(sent))
				switch {
				case status.Code(err) == codes.Unavailable:
					// Past the service's Redis timeout: allowed as rarely
					// as the other comparisons on Redis allow it.
					unavailable.Add(1)
				case err != nil:
					failed.Add(1)
					errOnce.Do(func() { firstErr = err })
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
				default:
					failed.Add(1)
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
		return denyRun{}, err
	}
	redisCPU, err := measureRedis()
	if err != nil {
		return denyRun{}, err
	}
	scripts1, commands1, err := redisCounts(rig.client)
	if err != nil {
		return denyRun{}, err
	}
	all := slices.Concat(lat...)
	total := float64(len(all))
	if n := failed.Load(); n > 0 {
		return denyRun{}, fmt.Errorf("%d errors or answers neither OK nor OVER_LIMIT in %.0f requests; the first: %v", n, total, firstErr)
	}
	if n := unavailable.Load(); float64(n) > maxDegraded*total {
		return denyRun{}, fmt.Errorf("%d of %.0f decisions answered UNAVAILABLE (past the service's Redis timeout), more than %g of them: the load is more than this Redis answers in time", n, total, maxDegraded)
	}
	if len(all) == 0 {
		return denyRun{}, fmt.Errorf("no call was answered in %s", d)
	}
	slices.Sort(all)
	at := func(p float64) float64 {
		return float64(all[int(p/100*float64(len(all)-1))].Nanoseconds()) / 1e3
	}
	s := elapsed.Seconds()
	return denyRun{
		sample: sample{
			requests: total, rps: total / s,
			p50: at(50), p99: at(99), p999: at(99.9),
			serverCPU: perRequest(serverCPU, total), loadCPU: perRequest(loadCPU, total),
			rss: rssOf(servers),
		},
		ok: float64(ok.Load()), elapsed: elapsed, allowed: float64(ok.Load()) / s,
		scripts: float64(scripts1-scripts0) / s, commands: float64(commands1-commands0) / s,
		redisCPU: perRequest(redisCPU, total),
	}, nil
}

// idleRedis is what Redis does, per second, over d with no load.
func idleRedis(redis rueidis.Client, d time.Duration) (denyRun, error) {
	scripts0, commands0, err := redisCounts(redis)
	if err != nil {
		return denyRun{}, err
	}
	start := time.Now()
	time.Sleep(d)
	scripts1, commands1, err := redisCounts(redis)
	if err != nil {
		return denyRun{}, err
	}
	s := time.Since(start).Seconds()
	return denyRun{scripts: float64(scripts1-scripts0) / s, commands: float64(commands1-commands0) / s}, nil
}

// redisCounts is how many scripts Redis has run (EVAL, EVALSHA and their
// read-only forms), from INFO commandstats, and how many commands it has
// processed, from INFO stats.
func redisCounts(redis rueidis.Client) (scripts, commands int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stats, err := redis.Do(ctx, redis.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		return 0, 0, fmt.Errorf("INFO commandstats: %w", err)
	}
	for line := range strings.Lines(stats) {
		name, fields, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch name {
		case "cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro":
			calls, _, _ := strings.Cut(strings.TrimPrefix(fields, "calls="), ",")
			n, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("INFO commandstats line %q: %w", line, err)
			}
			scripts += n
		}
	}
	info, err := redis.Do(ctx, redis.B().Info().Section("stats").Build()).ToString()
	if err != nil {
		return 0, 0, fmt.Errorf("INFO stats: %w", err)
	}
	for line := range strings.Lines(info) {
		if v, found := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); found {
			n, err := strconv.ParseInt(v, 10, 64)
			return scripts, n, err
		}
	}
	return 0, 0, fmt.Errorf("INFO stats has no total_commands_processed:\n%s", info)
}
