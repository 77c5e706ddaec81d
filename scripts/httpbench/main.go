// Command httpbench measures what the service costs per HTTP acquire, side
// by side with a trivial net/http handler, on loopback with wrk.
//
//	go run ./scripts/httpbench [-rounds 8] [-duration 8s] [-connections 50]
//
// It builds both servers, then runs wrk against each in interleaved rounds
// (A B A B …) so that noise from the shared machine hits both alike, and
// reads each server's CPU time from /proc around every round. It prints a
// Markdown table of medians with min–max: requests/s, latency p50/p99, and
// server CPU µs per request, plus the per-round CPU ratio to the trivial
// handler. The load generator shares the machine's cores, so the CPU per
// request, not the throughput, is the figure to compare.
package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "httpbench:", err)
		os.Exit(1)
	}
}

type target struct {
	name string
	cmd  *exec.Cmd
	url  string
}

type sample struct {
	rps, p50, p99, cpuPerReq float64 // req/s, ms, ms, µs
}

func run() error {
	rounds := flag.Int("rounds", 8, "interleaved rounds per target")
	duration := flag.Duration("duration", 8*time.Second, "length of each wrk run")
	conns := flag.Int("connections", 50, "wrk connections")
	threads := flag.Int("threads", 2, "wrk threads")
	flag.Parse()
	if _, err := exec.LookPath("wrk"); err != nil {
		return errors.New("wrk not found on PATH (Debian: apt-get install wrk)")
	}
	dir, err := os.MkdirTemp("", "httpbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, b := range [][2]string{{"ratelimiter", "./cmd/service"}, {"trivial", "./scripts/httpbench/trivial"}} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, b[0]), b[1]).CombinedOutput()
		if err != nil {
			return fmt.Errorf("build %s: %v\n%s", b[1], err, out)
		}
	}
	script := filepath.Join(dir, "acquire.lua")
	lua := `wrk.method = "POST"
wrk.body = '{"permits":1}'
wrk.headers["Content-Type"] = "application/json"
`
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		return err
	}

	svcAddr, err1 := freeAddr()
	trivAddr, err2 := freeAddr()
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	targets := []*target{
		{name: "ratelimiter (memory backend, validation + metrics on, tracing default)",
			cmd: exec.Command(filepath.Join(dir, "ratelimiter"), "--listen", svcAddr, "--log-level", "warn"),
			url: "http://" + svcAddr + "/v1/limiters/bench/acquire"},
		{name: "trivial net/http + encoding/json",
			cmd: exec.Command(filepath.Join(dir, "trivial"), trivAddr),
			url: "http://" + trivAddr + "/v1/limiters/bench/acquire"},
	}
	for _, t := range targets {
		t.cmd.Stdout, t.cmd.Stderr = os.Stderr, os.Stderr
		t.cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
		if err := t.cmd.Start(); err != nil {
			return err
		}
		defer func() { t.cmd.Process.Kill(); t.cmd.Wait() }()
	}
	for _, addr := range []string{svcAddr, trivAddr} {
		if err := waitListening(addr); err != nil {
			return err
		}
	}
	// A limit no benchmark can exhaust, so every answer takes the full
	// grant path.
	req, _ := http.NewRequest(http.MethodPut, "http://"+svcAddr+"/v1/limiters/bench",
		strings.NewReader(`{"limit":1000000000,"period":"1s"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("create limiter: %s %s", resp.Status, body)
	}

	// Warm both up once, then measure.
	for _, t := range targets {
		if _, err := measure(t, script, *threads, *conns, 2*time.Second); err != nil {
			return err
		}
	}
	results := make([][]sample, len(targets))
	var ratios []float64
	for r := range *rounds {
		var cpu [2]float64
		for i, t := range targets {
			s, err := measure(t, script, *threads, *conns, *duration)
			if err != nil {
				return err
			}
			results[i] = append(results[i], s)
			cpu[i] = s.cpuPerReq
			fmt.Fprintf(os.Stderr, "round %d %-12s %8.0f req/s  p50 %.2f ms  p99 %.2f ms  %.1f µs CPU/req\n", r+1, strings.Fields(t.name)[0], s.rps, s.p50, s.p99, s.cpuPerReq)
		}
		ratios = append(ratios, cpu[0]/cpu[1])
	}

	fmt.Printf("wrk -t%d -c%d -d%s, %d interleaved rounds; median (min–max)\n\n", *threads, *conns, *duration, *rounds)
	fmt.Println("| server | requests/s | p50 ms | p99 ms | server CPU µs/req |")
	fmt.Println("|---|---|---|---|---|")
	for i, t := range targets {
		col := func(f func(sample) float64, format string) string {
			var xs []float64
			for _, s := range results[i] {
				xs = append(xs, f(s))
			}
			return stat(xs, format)
		}
		fmt.Printf("| %s | %s | %s | %s | %s |\n", t.name,
			col(func(s sample) float64 { return s.rps }, "%.0f"),
			col(func(s sample) float64 { return s.p50 }, "%.2f"),
			col(func(s sample) float64 { return s.p99 }, "%.2f"),
			col(func(s sample) float64 { return s.cpuPerReq }, "%.1f"))
	}
	fmt.Printf("\nCPU per request, ratelimiter ÷ trivial, per round: %s\n", stat(ratios, "%.2f×"))
	return nil
}

// measure runs wrk once against t and reads the server's CPU time around it.
func measure(t *target, script string, threads, conns int, d time.Duration) (sample, error) {
	before, err := cpuTime(t.cmd.Process.Pid)
	if err != nil {
		return sample{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "wrk", "-t"+strconv.Itoa(threads), "-c"+strconv.Itoa(conns),
		"-d"+strconv.Itoa(int(d.Seconds()))+"s", "--latency", "-s", script, t.url).CombinedOutput()
	if err != nil {
		return sample{}, fmt.Errorf("wrk: %v\n%s", err, out)
	}
	after, err := cpuTime(t.cmd.Process.Pid)
	if err != nil {
		return sample{}, err
	}
	if m := regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`).FindSubmatch(out); m != nil {
		return sample{}, fmt.Errorf("%s answered %s non-2xx responses:\n%s", t.name, m[1], out)
	}
	requests, err := firstFloat(out, `(\d+) requests in`)
	if err != nil {
		return sample{}, err
	}
	rps, err := firstFloat(out, `Requests/sec:\s+([\d.]+)`)
	if err != nil {
		return sample{}, err
	}
	p50, err := latency(out, "50%")
	if err != nil {
		return sample{}, err
	}
	p99, err := latency(out, "99%")
	if err != nil {
		return sample{}, err
	}
	return sample{rps: rps, p50: p50, p99: p99, cpuPerReq: (after - before).Seconds() * 1e6 / requests}, nil
}

// cpuTime is the user+system CPU time of a process, from /proc/PID/stat.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th fields of the whole line.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond, nil
}

func firstFloat(out []byte, re string) (float64, error) {
	m := regexp.MustCompile(re).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("wrk output has no %q:\n%s", re, out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// latency reads one percentile of wrk's --latency table, in milliseconds.
func latency(out []byte, pct string) (float64, error) {
	m := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(pct) + `\s+([\d.]+)(us|ms|s)\s*$`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("wrk output has no %s latency:\n%s", pct, out)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	switch string(m[2]) {
	case "us":
		v /= 1000
	case "s":
		v *= 1000
	}
	return v, err
}

func stat(xs []float64, format string) string {
	s := slices.Clone(xs)
	slices.SortFunc(s, cmp.Compare)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", med, s[0], s[len(s)-1])
}

// freeAddr returns a loopback address with a port nothing listens on.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func waitListening(addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s after 10s", addr)
}
