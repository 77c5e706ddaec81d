package main

import (
	"fmt"
	"strings"
)

// decideGroups is how many groups of three limiters the decide comparison
// spreads its requests over (fewer in a smoke run), so that no limiter is
// hot: a hot limiter's single acquisitions go to Redis a few dozen to a
// script run, which joint decisions never do.
const decideGroups = 1000

// decideComparison sets a joint decision of three limiters of one group
// (POST /v1/decide) beside a single acquisition (POST
// /v1/limiters/{name}/acquire) on each backend, on random groups, in
// interleaved rounds: a three-limit decision is still one request, one
// round trip to Redis and one script run. On each backend it adds a keyed
// acquisition (one key of a per-user limiter) and a decision of a per-IP
// key, a per-user key and a global limit, on random keys.
func decideComparison(cfg config, rig *redisRig, rep *report) error {
	groups, conns := decideGroups, cfg.conns
	if cfg.smoke {
		// A smoke run checks the harness, on a machine that may be busy
		// with other tests: a light load keeps the Redis backend within
		// its timeout there.
		groups, conns = 50, min(conns, 8)
	}
	name := func(g, j int) string { return fmt.Sprintf("dec-%d-%d", g, j) }
	for _, p := range []*proc{rig.svcMemory, rig.svcRedis} {
		for g := range groups {
			for j := range 3 {
				spec := fmt.Sprintf(`{"limit":1000000000,"period":"1m","group":"dec-%d"}`, g)
				if _, err := call("PUT", p.url("/v1/limiters/"+name(g, j)), spec); err != nil {
					return err
				}
			}
		}
	}
	for name, spec := range map[string]string{
		"kdec-ip":     `{"limit":1000000000,"period":"1m","group":"kdec","keyed":true}`,
		"kdec-user":   `{"limit":1000000000,"period":"1m","group":"kdec","keyed":true}`,
		"kdec-global": `{"limit":1000000000,"period":"1m","group":"kdec"}`,
	} {
		for _, p := range []*proc{rig.svcMemory, rig.svcRedis} {
			if _, err := call("PUT", p.url("/v1/limiters/"+name), spec); err != nil {
				return err
			}
		}
	}
	type system struct {
		name    string
		target  *proc
		servers []*proc
		lua     string // the body of wrk's target(k)
		check   string // a request to check before measuring
		path    string
		granted int // grants in the checked answer
	}
	single := `  return "/v1/limiters/dec-" .. (k - 1) .. "-0/acquire", '{"permits":1}'`
	joint := `  local g = k - 1
  return "/v1/decide", string.format('{"items":[{"limiter":"dec-%d-0"},{"limiter":"dec-%d-1"},{"limiter":"dec-%d-2"}]}', g, g, g)`
	body3 := `{"items":[{"limiter":"dec-0-0"},{"limiter":"dec-0-1"},{"limiter":"dec-0-2"}]}`
	backends := []struct {
		name    string
		p       *proc
		servers []*proc
	}{
		{"memory", rig.svcMemory, []*proc{rig.svcMemory}},
		{"Redis", rig.svcRedis, []*proc{rig.svcRedis, rig.redis}},
	}
	var systems []system
	for _, b := range backends {
		systems = append(systems,
			system{fmt.Sprintf("%s backend, single acquisition", b.name), b.p, b.servers, single, acquireBody, "/v1/limiters/dec-0-0/acquire", 1},
			system{fmt.Sprintf("%s backend, decide 3 limiters", b.name), b.p, b.servers, joint, body3, "/v1/decide", 1})
	}
	keyedSingle := `  return "/v1/limiters/kdec-user/acquire", string.format('{"key":"user-%d","permits":1}', k - 1)`
	keyedJoint := `  local g = k - 1
  return "/v1/decide", string.format('{"items":[{"limiter":"kdec-ip","key":"10.0.%d.%d"},{"limiter":"kdec-user","key":"user-%d"},{"limiter":"kdec-global"}]}', math.floor(g / 256), g % 256, g)`
	keyedBody3 := `{"items":[{"limiter":"kdec-ip","key":"10.0.0.0"},{"limiter":"kdec-user","key":"user-0"},{"limiter":"kdec-global"}]}`
	for _, b := range backends {
		systems = append(systems,
			system{b.name + " backend, keyed acquisition", b.p, b.servers, keyedSingle, `{"key":"user-0","permits":1}`, "/v1/limiters/kdec-user/acquire", 1},
			system{b.name + " backend, decide 2 keys and 1 limiter", b.p, b.servers, keyedJoint, keyedBody3, "/v1/decide", 1})
	}
	loads := make([]*wrk, len(systems))
	for i, s := range systems {
		b, err := call("POST", s.target.url(s.path), s.check)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if !strings.HasPrefix(string(b), `{"allowed":true`) {
			return fmt.Errorf("%s: the answer is not a grant:\n%.600s", s.name, b)
		}
		if loads[i], err = newWrkRandom(cfg.dir, fmt.Sprintf("decide-%d", i), s.lua, groups, cfg.wrkThreads, conns); err != nil {
			return err
		}
	}
	results := make([][]sample, len(systems))
	for round := range cfg.rounds {
		for i, s := range systems {
			x, err := loads[i].run(s.target.url("/"), cfg.duration, s.servers...)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			results[i] = append(results[i], x)
			cfg.progress("round %d  %-44s %9.0f requests/s  p99 %6.0f µs  server CPU %5.2f µs/request", round+1, s.name, x.rps, x.p99, x.serverCPU)
		}
	}
	degradedNote, err := rig.degradedSince()
	if err != nil {
		return err
	}
	names := make([]string, len(systems))
	for i, s := range systems {
		names[i] = s.name
	}
	sec := rep.section("Several limits in one decision")
	sec.printf("A joint decision of three limiters of one group (`POST /v1/decide`, all or nothing) beside a single acquisition (`POST /v1/limiters/{name}/acquire`), each request on a random one of %d groups of three limiters, sent by %s over HTTP/1.1 keep-alive. Every figure is per request: one request decides three limits, or one. Both are validated and answered by the service's hand-written fast path. %d interleaved rounds of %s; median (min–max).\n\n",
		groups, loads[0], cfg.rounds, cfg.duration)
	sec.chart("decide-requests", "Three limits in one decision: requests per second (higher is better)", "requests/s").
		add("requests/s", names, column(results, func(x sample) float64 { return x.rps }))
	sec.sampleTable("request", names, results)
	sec.printf("\n")
	for _, b := range []struct {
		name string
		i    int
	}{{"memory", 0}, {"Redis", 2}, {"memory", 4}, {"Redis", 6}} {
		thr := make([]float64, cfg.rounds)
		cpu := make([]float64, cfg.rounds)
		p99 := make([]float64, cfg.rounds)
		for r := range cfg.rounds {
			one, three := results[b.i][r], results[b.i+1][r]
			thr[r] = one.rps / three.rps
			cpu[r] = three.serverCPU / one.serverCPU
			p99[r] = three.p99 / one.p99
		}
		v := fmt.Sprintf("%s backend, a 3-limit decision ÷ a single acquisition: time per request (inverse throughput) %s, server CPU per request %s, p99 %s",
			b.name, stat(thr, "%.2f×"), stat(cpu, "%.2f×"), stat(p99, "%.2f×"))
		if b.i >= 4 {
			v = fmt.Sprintf("%s backend, keyed: a decision of 2 keys and 1 limiter ÷ a keyed acquisition: time per request (inverse throughput) %s, server CPU per request %s, p99 %s",
				b.name, stat(thr, "%.2f×"), stat(cpu, "%.2f×"), stat(p99, "%.2f×"))
		}
		sec.printf("- %s\n", v)
		rep.facts = append(rep.facts, "Several limits, "+v)
	}
	sec.printf("\n%s\n", degradedNote)
	return nil
}
