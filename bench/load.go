package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sample is what one load run measured. Latencies are in microseconds, CPU
// times in microseconds per request.
type sample struct {
	requests       float64
	rps            float64
	p50, p99, p999 float64
	serverCPU      float64 // of the server under load (or servers, summed)
	loadCPU        float64 // of the load generator
	rss            float64 // the servers' resident memory after the run, MiB
}

// wrkLua makes wrk POST body and print its own summary (wrkDone).
const wrkLua = `wrk.method = "POST"
wrk.body = %q
wrk.headers["Content-Type"] = "application/json"
` + wrkDone

// wrkRandomLua makes wrk POST to keys drawn uniformly from 1 to %[2]d, each
// thread from its own seed: the Lua function body %[1]s turns key k into
// the request's path and body. wrkDone prints the summary.
const wrkRandomLua = `wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local threads = 0
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
function init(args) math.randomseed(7919 * (tid or 1)) end
local function target(k)
%[1]s
end
function request()
  local path, body = target(math.random(1, %[2]d))
  return wrk.format(nil, path, nil, body)
end
` + wrkDone

// wrkDone prints wrk's summary on one line, with the 99.9th percentile its
// --latency table leaves out. Latencies are microseconds.
const wrkDone = `done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH %%d %%d %%d %%d %%d %%d %%d\n", summary.requests, summary.duration,
    e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
`

var wrkSummary = regexp.MustCompile(`(?m)^BENCH (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)$`)

// wrk is a closed-loop HTTP load: wrk's threads and connections, each
// connection sending the next request when the last is answered.
type wrk struct {
	threads, conns int
	script         string // file written by newWrk
}

func newWrk(dir, name, body string, threads, conns int) (*wrk, error) {
	return newWrkScript(dir, name, fmt.Sprintf(wrkLua, body), threads, conns)
}

// newWrkRandom is a wrk whose requests go to random keys; see wrkRandomLua.
func newWrkRandom(dir, name, target string, keys, threads, conns int) (*wrk, error) {
	return newWrkScript(dir, name, fmt.Sprintf(wrkRandomLua, target, keys), threads, conns)
}

func newWrkScript(dir, name, lua string, threads, conns int) (*wrk, error) {
	script := filepath.Join(dir, name+".lua")
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		return nil, err
	}
	return &wrk{threads: threads, conns: conns, script: script}, nil
}

func (w *wrk) String() string {
	return fmt.Sprintf("wrk -t%d -c%d", w.threads, w.conns)
}

// run loads url for d and measures the servers' CPU around it. Any answer
// but a 2xx, and any socket error, fails the run.
func (w *wrk) run(url string, d time.Duration, servers ...*proc) (sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	measure := cpuOf(servers)
	out, loadCPU, err := childCPU(ctx, "wrk", "-t"+strconv.Itoa(w.threads), "-c"+strconv.Itoa(w.conns),
		"-d"+strconv.Itoa(int(d.Seconds()))+"s", "-s", w.script, url)
	if err != nil {
		return sample{}, err
	}
	serverCPU, err := measure()
	if err != nil {
		return sample{}, err
	}
	m := wrkSummary.FindSubmatch(out)
	if m == nil {
		return sample{}, fmt.Errorf("wrk printed no summary:\n%s", out)
	}
	var v [7]float64
	for i := range v {
		v[i], _ = strconv.ParseFloat(string(m[i+1]), 64)
	}
	if v[2] > 0 || v[3] > 0 {
		return sample{}, fmt.Errorf("%s: %.0f non-2xx answers and %.0f socket errors in %.0f requests", url, v[2], v[3], v[0])
	}
	return sample{
		requests: v[0], rps: v[0] / (v[1] / 1e6),
		p50: v[4], p99: v[5], p999: v[6],
		serverCPU: perRequest(serverCPU, v[0]), loadCPU: perRequest(loadCPU, v[0]),
		rss: rssOf(servers),
	}, nil
}

// cpuOf reads the servers' CPU time now; the function it returns reads it
// again and gives the difference, summed.
func cpuOf(servers []*proc) func() (time.Duration, error) {
	read := func() (time.Duration, error) {
		var sum time.Duration
		for _, s := range servers {
			c, err := s.cpu()
			if err != nil {
				return 0, fmt.Errorf("CPU time of %s: %w", s.name, err)
			}
			sum += c
		}
		return sum, nil
	}
	before, err := read()
	return func() (time.Duration, error) {
		if err != nil {
			return 0, err
		}
		after, err := read()
		return after - before, err
	}
}

func perRequest(cpu time.Duration, requests float64) float64 {
	return float64(cpu.Microseconds()) / requests
}

// redisBenchmark runs redis-benchmark's one command, args, against the
// Redis server at addr: conns clients, each pipelining pipeline commands.
func redisBenchmark(redis *proc, conns, pipeline, n int, args ...string) (sample, error) {
	host, port, _ := strings.Cut(redis.addr, ":")
	cmd := append([]string{"-h", host, "-p", port, "-c", strconv.Itoa(conns), "-P", strconv.Itoa(pipeline),
		"-n", strconv.Itoa(n), "--csv"}, args...)
	measure := cpuOf([]*proc{redis})
	out, loadCPU, err := childCPU(context.Background(), "redis-benchmark", cmd...)
	if err != nil {
		return sample{}, err
	}
	serverCPU, err := measure()
	if err != nil {
		return sample{}, err
	}
	// "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",
	// "p95_latency_ms","p99_latency_ms","max_latency_ms"
	rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil || len(rows) != 2 || len(rows[1]) != 8 {
		return sample{}, fmt.Errorf("redis-benchmark printed no CSV result (%v):\n%s", err, out)
	}
	f := func(i int) float64 {
		v, _ := strconv.ParseFloat(rows[1][i], 64)
		return v
	}
	return sample{
		requests: float64(n), rps: f(1),
		p50: f(4) * 1000, p99: f(6) * 1000, p999: -1, // not reported
		serverCPU: perRequest(serverCPU, float64(n)), loadCPU: perRequest(loadCPU, float64(n)),
	}, nil
}

// openLoop sends POST body (a GET when body is empty) to url at a fixed
// rate for d, whether or not earlier requests were answered: 256 workers
// take the requests as they fall due, so a slow answer does not hold back
// the next ones. Each
// latency runs from the instant its request was sent, not from when it was
// due: a sleeping goroutine here wakes up to a millisecond late, which
// would count against the server. It fails on any answer but a 2xx.
func openLoop(url, body string, rate int, d time.Duration, servers ...*proc) (sample, error) {
	const workers = 256
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	total := int(float64(rate) * d.Seconds())
	interval := time.Second / time.Duration(rate)
	due := make(chan time.Time, total)
	lat := make([][]time.Duration, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for at := range due {
				if wait := time.Until(at); wait > 0 {
					time.Sleep(wait)
				}
				sent := time.Now()
				var req *http.Request
				if body == "" {
					req, _ = http.NewRequest(http.MethodGet, url, nil)
				} else {
					req, _ = http.NewRequest(http.MethodPost, url, strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
				}
				resp, err := client.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode/100 != 2 {
						err = fmt.Errorf("%s: %s", url, resp.Status)
					}
				}
				if err != nil && errs[w] == nil {
					errs[w] = err
				}
				lat[w] = append(lat[w], time.Since(sent))
			}
		})
	}
	measure := cpuOf(servers)
	self := selfCPU()
	start := time.Now().Add(10 * time.Millisecond)
	for i := range total {
		due <- start.Add(time.Duration(i) * interval)
	}
	close(due)
	wg.Wait()
	loadCPU := selfCPU() - self
	serverCPU, err := measure()
	if err != nil {
		return sample{}, err
	}
	for _, err := range errs {
		if err != nil {
			return sample{}, err
		}
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[int(p/100*float64(len(all)-1))].Nanoseconds()) / 1e3
	}
	return sample{
		requests: float64(total), rps: float64(total) / time.Since(start).Seconds(),
		p50: pct(50), p99: pct(99), p999: pct(99.9),
		serverCPU: perRequest(serverCPU, float64(total)), loadCPU: perRequest(loadCPU, float64(total)),
	}, nil
}
