package main

import (
	"fmt"
	"path/filepath"
	"strings"
)

// randomKeys is the number of keys the random-key runs spread over.
const randomKeys = 100_000

// httpSystem is one server of the HTTP comparison and the requests that
// acquire 1 permit from it.
type httpSystem struct {
	name    string
	target  *proc   // the server wrk loads
	servers []*proc // whose CPU and memory count: target, and its Redis
	// hotPath and hotBody acquire from one key; randomTarget is the body of
	// a Lua function of key k returning the path and body of an acquisition
	// from key k (see wrkRandomLua).
	hotPath, hotBody string
	randomTarget     string
	// granted is what a grant's answer holds, checked before measuring:
	// some peers answer 200 when they could not decide.
	granted []string
}

// ipOfKey is the Lua expression of a distinct IPv4 address for key k.
const ipOfKey = `string.format("10.%d.%d.%d", math.floor(k / 65536), math.floor(k / 256) % 256, k % 256)`

// httpSystems lists the servers compared: this service on both backends,
// the peers when they run, and the trivial handler, the ceiling.
func httpSystems(rig *redisRig, guber, envoy, trivial *proc) []httpSystem {
	ours := func(name string, p *proc, servers ...*proc) httpSystem {
		return httpSystem{
			name: name, target: p, servers: append([]*proc{p}, servers...),
			hotPath: "/v1/limiters/" + benchLimiter + "/acquire", hotBody: acquireBody,
			randomTarget: `  return "/v1/tenants/" .. ` + ipOfKey + ` .. "/acquire", '{"permits":1}'`,
			granted:      []string{`"allowed":true`},
		}
	}
	systems := []httpSystem{
		ours("ratelimiter, memory backend", rig.svcMemory),
		ours("ratelimiter, Redis backend", rig.svcRedis, rig.redis),
	}
	if guber != nil {
		body := `{"requests":[{"name":"bench","unique_key":"%s","hits":1,"limit":1000000000,"duration":60000,"algorithm":"TOKEN_BUCKET"}]}`
		systems = append(systems, httpSystem{
			name: "gubernator v2.13.0 (token bucket)", target: guber, servers: []*proc{guber},
			hotPath: "/v1/GetRateLimits", hotBody: fmt.Sprintf(body, "hot"),
			randomTarget: `  return "/v1/GetRateLimits", string.format('` + fmt.Sprintf(body, "k%d") + `', k)`,
			granted:      []string{`"status":"UNDER_LIMIT"`, `"error":""`},
		})
	}
	if envoy != nil {
		systems = append(systems, httpSystem{
			name: "envoy ratelimit (fixed window, same Redis)", target: envoy, servers: []*proc{envoy, rig.redis},
			hotPath: "/json", hotBody: `{"domain":"bench","descriptors":[{"entries":[{"key":"hot","value":"h"}]}],"hits_addend":1}`,
			randomTarget: `  return "/json", string.format('{"domain":"bench","descriptors":[{"entries":[{"key":"k","value":"v%d"}]}],"hits_addend":1}', k)`,
			granted:      []string{`"overallCode":"OK"`},
		})
	}
	return append(systems, httpSystem{
		name: "trivial net/http + encoding/json handler (the ceiling)", target: trivial, servers: []*proc{trivial},
		hotPath: "/v1/limiters/" + benchLimiter + "/acquire", hotBody: acquireBody,
		randomTarget: `  return "/v1/limiters/k" .. k .. "/acquire", '{"permits":1}'`,
		granted:      []string{`"allowed":true`},
	})
}

// httpComparison loads every system with one acquisition per request, on
// one hot key and on random keys, in interleaved rounds.
func httpComparison(cfg config, rig *redisRig, rep *report) error {
	var guber, envoy *proc
	var err error
	if !cfg.smoke {
		if guber, err = startGubernator(cfg.dir); err != nil {
			return err
		}
		defer guber.stop()
		if envoy, err = startEnvoy(cfg.dir, rig.redis.addr); err != nil {
			return err
		}
		defer envoy.stop()
	}
	trivial, err := startTrivial(cfg)
	if err != nil {
		return err
	}
	defer trivial.stop()

	systems := httpSystems(rig, guber, envoy, trivial)
	type load struct {
		mode string
		wrk  []*wrk // per system
		path func(httpSystem) string
	}
	loads := []load{{mode: "one hot key"}, {mode: fmt.Sprintf("%d random keys", randomKeys)}}
	for i, s := range systems {
		// Check that a grant looks like one before counting any.
		b, err := call("POST", s.target.url(s.hotPath), s.hotBody)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		for _, want := range s.granted {
			if !strings.Contains(string(b), want) {
				return fmt.Errorf("%s: a grant answered %s, want it to hold %s", s.name, b, want)
			}
		}
		hot, err := newWrk(cfg.dir, fmt.Sprintf("http-hot-%d", i), s.hotBody, cfg.wrkThreads, cfg.conns)
		if err != nil {
			return err
		}
		random, err := newWrkRandom(cfg.dir, fmt.Sprintf("http-random-%d", i), s.randomTarget, randomKeys, cfg.wrkThreads, cfg.conns)
		if err != nil {
			return err
		}
		loads[0].wrk = append(loads[0].wrk, hot)
		loads[1].wrk = append(loads[1].wrk, random)
	}
	loads[0].path = func(s httpSystem) string { return s.hotPath }
	loads[1].path = func(s httpSystem) string { return "/" } // the script sets it

	sec := rep.section("HTTP: one acquisition per request, against the peers")
	sec.printf("Each request asks for 1 permit of a limit no run reaches, over HTTP/1.1 keep-alive, loaded by %s; the random-key runs spread over %d keys drawn uniformly (this service: per-IP tenants; gubernator: unique keys; envoy: descriptor values; all created on first use). Server CPU and memory include the Redis of the systems that use one. %d interleaved rounds of %s; median (min–max).\n\n",
		loads[0].wrk[0], randomKeys, cfg.rounds, cfg.duration)
	sec.printf("Semantics differ, and are compared as they are: this service answers from GCRA (a token bucket, exact); gubernator's token bucket refills all at once at the end of its duration; envoy ratelimit counts a fixed window aligned to the clock, in Redis, and counts denied requests too.\n")
	rpsChart := sec.chart("http-requests", "HTTP: requests per second, one acquisition each (higher is better)", "requests/s")
	cpuChart := sec.chart("http-cpu", "HTTP: server CPU per request, with its Redis if any (lower is better)", "server CPU µs/request")
	names := make([]string, len(systems))
	for i, s := range systems {
		names[i] = s.name
	}
	for li, l := range loads {
		results := make([][]sample, len(systems))
		for round := range cfg.rounds {
			for i, s := range systems {
				x, err := l.wrk[i].run(s.target.url(l.path(s)), cfg.duration, s.servers...)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", s.name, l.mode, err)
				}
				results[i] = append(results[i], x)
				cfg.progress("round %d  %-16s %-56s %8.0f/s  p99 %6.0f µs  server CPU %5.1f µs  RSS %4.0f MiB", round+1, l.mode, s.name, x.rps, x.p99, x.serverCPU, x.rss)
			}
		}
		degradedNote, err := rig.degradedSince()
		if err != nil {
			return err
		}
		rpsChart.add(l.mode, names, column(results, func(x sample) float64 { return x.rps }))
		cpuChart.add(l.mode, names, column(results, func(x sample) float64 { return x.serverCPU }))
		sec.printf("\n### %s\n\n", l.mode)
		sec.sampleTable("decision", names, results)
		sec.printf("\n| system | server memory after the run, MiB |\n|---|---|\n")
		for i, name := range names {
			rss := make([]float64, len(results[i]))
			for j, x := range results[i] {
				rss[j] = x.rss
			}
			sec.printf("| %s | %s |\n", name, stat(rss, "%.0f"))
		}
		sec.printf("\n%s\n\n", degradedNote)
		httpRatios(sec, rep, systems, results, l.mode, li == 0)
	}
	if err := equalRate(cfg, systems, sec, rep); err != nil {
		return err
	}
	degradedNote, err := rig.degradedSince()
	if err != nil {
		return err
	}
	sec.printf("\n%s\n", degradedNote)
	return exactness(cfg, exactRuns(rig, guber, envoy), sec)
}

// equalRate compares latencies at one open-loop rate that every system
// sustains: under wrk's saturating closed loop, a server that answers more
// requests also queues more of them, which weighs on its percentiles.
func equalRate(cfg config, systems []httpSystem, sec *section, rep *report) error {
	results := make([][]sample, len(systems))
	for round := range cfg.rounds {
		for i, s := range systems {
			x, err := openLoop(s.target.url(s.hotPath), s.hotBody, cfg.httpRate, cfg.duration, s.servers...)
			if err != nil {
				return fmt.Errorf("%s at %d/s: %w", s.name, cfg.httpRate, err)
			}
			results[i] = append(results[i], x)
			cfg.progress("round %d  equal rate       %-56s %8.0f/s  p50 %6.0f µs  p99 %6.0f µs", round+1, s.name, x.rps, x.p50, x.p99)
		}
	}
	names := make([]string, len(systems))
	for i, s := range systems {
		names[i] = s.name
	}
	sec.printf("\n### Latency at an equal rate\n\nOne hot key, an open-loop load of %d requests per second for every system (this harness's own generator: requests sent on schedule whether or not earlier ones were answered, each timed from when it was sent), so that each is judged at the same offered load rather than at its own saturation. %d interleaved rounds of %s; median (min–max).\n\n", cfg.httpRate, cfg.rounds, cfg.duration)
	sec.sampleTable("decision", names, results)
	sec.printf("\n")
	index := func(prefix string) int {
		for i, s := range systems {
			if strings.HasPrefix(s.name, prefix) {
				return i
			}
		}
		return -1
	}
	mem := index("ratelimiter, memory")
	for _, peer := range []string{"envoy", "gubernator"} {
		j := index(peer)
		if j < 0 {
			continue
		}
		xs := make([]float64, len(results[mem]))
		for r := range xs {
			xs[r] = results[mem][r].p99 / results[j][r].p99
		}
		v := fmt.Sprintf("memory backend ÷ %s, p99 at %d requests/s: %s (target < 1×: %s)", systems[j].name, cfg.httpRate, stat(xs, "%.2f×"), verdict(median(xs) < 1))
		sec.printf("- %s\n", v)
		rep.facts = append(rep.facts, "HTTP, "+v)
	}
	return nil
}

// httpRatios writes the ratios the targets are about, per round.
func httpRatios(sec *section, rep *report, systems []httpSystem, results [][]sample, mode string, summary bool) {
	index := func(prefix string) int {
		for i, s := range systems {
			if strings.HasPrefix(s.name, prefix) {
				return i
			}
		}
		return -1
	}
	ratio := func(a, b int, f func(sample) float64) []float64 {
		xs := make([]float64, len(results[a]))
		for r := range xs {
			xs[r] = f(results[a][r]) / f(results[b][r])
		}
		return xs
	}
	rps := func(x sample) float64 { return x.rps }
	cpu := func(x sample) float64 { return x.serverCPU }
	p99 := func(x sample) float64 { return x.p99 }
	mem, red, guber, envoy, triv := index("ratelimiter, memory"), index("ratelimiter, Redis"), index("gubernator"), index("envoy"), index("trivial")
	line := func(text string, xs []float64, format string, met bool, target string) {
		v := fmt.Sprintf("%s: %s", text, stat(xs, format))
		if target != "" {
			v += fmt.Sprintf(" (target %s: %s)", target, verdict(met))
		}
		sec.printf("- %s\n", v)
		if summary {
			rep.facts = append(rep.facts, "HTTP, "+mode+", "+v)
		}
	}
	if envoy >= 0 {
		xs := ratio(mem, envoy, rps)
		line("memory backend ÷ envoy ratelimit, requests/s", xs, "%.2f×", median(xs) >= 2.5, "≥ 2.5×")
		xs = ratio(red, envoy, rps)
		line("Redis backend ÷ envoy ratelimit on the same Redis, requests/s", xs, "%.2f×", median(xs) >= 2, "≥ 2×")
		xs = ratio(mem, envoy, p99)
		line("memory backend ÷ envoy ratelimit, p99 latency", xs, "%.2f×", median(xs) < 1, "< 1×")
	}
	if guber >= 0 {
		xs := ratio(mem, guber, rps)
		line("memory backend ÷ gubernator, requests/s", xs, "%.2f×", median(xs) >= 3, "≥ 3×")
		xs = ratio(mem, guber, p99)
		line("memory backend ÷ gubernator, p99 latency", xs, "%.2f×", median(xs) < 1, "< 1×")
	}
	xs := ratio(mem, triv, cpu)
	line("memory backend ÷ trivial handler, server CPU per request", xs, "%.2f×", median(xs) <= 1.5, "≤ 1.5×")
}

// trivialPage is what the trivial server answers GET / with: the page of
// the upstream behind a proxy.
const trivialPage = "ok\n"

// startTrivial builds and starts the trivial server (./trivial), with
// args after its HTTP address.
func startTrivial(cfg config, args ...string) (*proc, error) {
	bin := filepath.Join(cfg.dir, "trivial")
	if err := goBuild(".", "./trivial", bin); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return start("trivial", addr, []string{"GOMAXPROCS=2"}, bin, append([]string{addr}, args...)...)
}
