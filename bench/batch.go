package main

import (
	"fmt"
	"strings"
)

// batchComparison compares batches of batchSize acquisitions from one key
// in one HTTP request: this service's POST /v1/acquire on both backends
// against gubernator's GetRateLimits (which takes up to 1,000 requests per
// call), in interleaved rounds.
func batchComparison(cfg config, rig *redisRig, rep *report) error {
	type system struct {
		name    string
		target  *proc
		servers []*proc
		path    string
		body    string
		granted string // in every decision of a grant's answer
	}
	ours := batchBody(batchSize)
	systems := []system{
		{"ratelimiter, memory backend (POST /v1/acquire)", rig.svcMemory, []*proc{rig.svcMemory}, "/v1/acquire", ours, `"allowed":true`},
		{"ratelimiter, Redis backend (POST /v1/acquire)", rig.svcRedis, []*proc{rig.svcRedis, rig.redis}, "/v1/acquire", ours, `"allowed":true`},
	}
	if !cfg.smoke {
		guber, err := startGubernator(cfg.dir)
		if err != nil {
			return err
		}
		defer guber.stop()
		item := `{"name":"bench","unique_key":"batch","hits":1,"limit":1000000000,"duration":60000,"algorithm":"TOKEN_BUCKET"}`
		body := `{"requests":[` + strings.TrimSuffix(strings.Repeat(item+",", batchSize), ",") + `]}`
		systems = append(systems, system{"gubernator v2.13.0 (GetRateLimits, token bucket)", guber, []*proc{guber}, "/v1/GetRateLimits", body, `"status":"UNDER_LIMIT"`})
	}
	loads := make([]*wrk, len(systems))
	for i, s := range systems {
		// Check that an answer holds batchSize grants before counting any.
		b, err := call("POST", s.target.url(s.path), s.body)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if n := strings.Count(string(b), s.granted); n != batchSize {
			return fmt.Errorf("%s: a batch's answer holds %d grants (%s), want %d:\n%.600s", s.name, n, s.granted, batchSize, b)
		}
		if strings.Contains(string(b), `"error":"`) && !strings.Contains(string(b), `"error":""`) {
			return fmt.Errorf("%s: a batch's answer holds an error:\n%.600s", s.name, b)
		}
		if loads[i], err = newWrk(cfg.dir, fmt.Sprintf("batch-%d", i), s.body, cfg.wrkThreads, cfg.batchConns); err != nil {
			return err
		}
	}
	results := make([][]sample, len(systems))
	for round := range cfg.rounds {
		for i, s := range systems {
			x, err := perDecision(loads[i].run(s.target.url(s.path), cfg.duration, s.servers...))
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			results[i] = append(results[i], x)
			cfg.progress("round %d  %-56s %9.0f decisions/s  p99 %6.0f µs  server CPU %5.2f µs/decision", round+1, s.name, x.rps, x.p99, x.serverCPU)
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
	sec := rep.section("Batches: many decisions per request, against gubernator")
	sec.printf("Each request carries %d acquisitions of 1 permit from one key (a limit no run reaches), sent by %s over HTTP/1.1 keep-alive: this service's `POST /v1/acquire` and gubernator's `GetRateLimits`, which takes up to 1,000 rate-limit requests per call. Figures are per decision (decisions/s, CPU per decision); latencies are per request. A batch is not atomic in either system. This service decides a batch's acquisitions on one limiter in the order given, on Redis a few dozen to each script run. %d interleaved rounds of %s; median (min–max).\n\n",
		batchSize, loads[0], cfg.rounds, cfg.duration)
	sec.chart("batch-decisions", "Batches of 100: decisions per second (higher is better)", "decisions/s").
		add("decisions/s", names, column(results, func(x sample) float64 { return x.rps }))
	sec.sampleTable("decision", names, results)
	sec.printf("\n")
	if len(systems) > 2 {
		for i := range 2 {
			ys := make([]float64, len(results[i]))
			for r := range ys {
				ys[r] = results[i][r].rps / results[2][r].rps
			}
			v := fmt.Sprintf("%s ÷ gubernator GetRateLimits, decisions/s in batches of %d: %s", strings.TrimSuffix(systems[i].name, " (POST /v1/acquire)"), batchSize, stat(ys, "%.1f×"))
			sec.printf("- %s\n", v)
			rep.facts = append(rep.facts, "Batches, "+v)
		}
	}
	sec.printf("\n%s\n", degradedNote)
	return nil
}

// perDecision turns a sample of batch requests into figures per decision;
// latencies stay per request.
func perDecision(x sample, err error) (sample, error) {
	x.rps *= batchSize
	x.serverCPU /= batchSize
	x.loadCPU /= batchSize
	return x, err
}
