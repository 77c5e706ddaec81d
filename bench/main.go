// Command bench measures the service side by side with what it is compared
// to, on loopback, and writes the results as Markdown.
//
//	go -C bench run .                 # every comparison; writes ../docs/benchmarks.md
//	go -C bench run . -smoke          # one short round of each, checks the harness works
//	go -C bench run . -only clients   # some comparisons (http, redis, latency, clients, batch, inproc, decide, grpc, deny, proxy)
//
// It builds the service from this checkout and the peers it is compared with
// (gubernator, envoy ratelimit) from the Go module proxy at pinned versions,
// starts every server it measures itself (redis-server, the service on each
// backend, the peers, a trivial net/http handler), and loads them with wrk,
// redis-benchmark or its own generators (open-loop HTTP, closed-loop gRPC).
// It needs wrk, redis-server, redis-benchmark and nginx on PATH (Debian:
// apt-get install wrk redis-server redis-tools nginx) and fails when one is
// missing.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// config is what every comparison reads.
type config struct {
	dir          string // scratch directory
	root         string // the service's checkout
	service      string // the service's binary
	rounds       int
	duration     time.Duration
	conns        int
	batchConns   int
	wrkThreads   int
	rate         int
	httpRate     int
	redisVersion string
	tools        []string // versions of the tools used, for the report
	command      string
	verbose      bool
	smoke        bool // short runs, no peers
}

// progress reports a measurement as it is made, on stderr.
func (c config) progress(format string, args ...any) {
	if c.verbose {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}

type comparison struct {
	name string
	run  func(config, *redisRig, *report) error
}

var comparisons = []comparison{
	{"http", httpComparison},
	{"redis", redisThroughput},
	{"latency", redisLatency},
	{"clients", redisClients},
	{"batch", batchComparison},
	{"inproc", inprocComparison},
	{"decide", decideComparison},
	{"grpc", grpcComparison},
	{"deny", denyComparison},
	{"proxy", proxyComparison},
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := config{verbose: true}
	flag.IntVar(&cfg.rounds, "rounds", 5, "interleaved rounds of each comparison")
	flag.DurationVar(&cfg.duration, "duration", 8*time.Second, "length of each measured run")
	flag.IntVar(&cfg.conns, "connections", 50, "connections of the closed-loop loads (wrk, redis-benchmark)")
	flag.IntVar(&cfg.batchConns, "batch-connections", 4, "connections of the closed-loop batch loads")
	flag.IntVar(&cfg.wrkThreads, "threads", 2, "wrk threads")
	flag.IntVar(&cfg.rate, "rate", 2000, "requests per second of the fixed-rate Redis and gRPC latency runs")
	flag.IntVar(&cfg.httpRate, "http-rate", 5000, "requests per second of the fixed-rate HTTP latency runs against the peers")
	out := flag.String("out", "../docs/benchmarks.md", "Markdown file to write")
	root := flag.String("root", "..", "the service's checkout")
	only := flag.String("only", "", "comma-separated comparisons to run, of: "+names())
	smoke := flag.Bool("smoke", false, "one short round of each comparison, without the peers, written to a scratch file: checks the harness, measures nothing worth reading")
	flag.Parse()
	cfg.command = "go -C bench run . " + strings.Join(os.Args[1:], " ")
	cfg.root = *root
	if *smoke {
		cfg.rounds, cfg.duration, cfg.rate, cfg.httpRate, cfg.smoke = 1, time.Second, 200, 200, true
	}
	selected := comparisons
	if *only != "" {
		selected = nil
		for _, name := range strings.Split(*only, ",") {
			i := slices.IndexFunc(comparisons, func(c comparison) bool { return c.name == name })
			if i < 0 {
				return fmt.Errorf("-only: no comparison %q (there are: %s)", name, names())
			}
			selected = append(selected, comparisons[i])
		}
	}
	if err := checkTools(&cfg); err != nil {
		return err
	}

	started := time.Now()
	var err error
	if cfg.dir, err = os.MkdirTemp("", "ratelimiter-bench"); err != nil {
		return err
	}
	defer os.RemoveAll(cfg.dir)
	if *smoke {
		*out = filepath.Join(cfg.dir, "benchmarks.md")
	}
	if cfg.service, err = buildService(*root, cfg.dir); err != nil {
		return err
	}
	rig, err := startRedisRig(cfg)
	if err != nil {
		return err
	}
	defer rig.stop()
	rep := &report{}
	for _, c := range selected {
		fmt.Fprintf(os.Stderr, "== %s\n", c.name)
		if err := c.run(cfg, rig, rep); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	if err := rep.write(*out, cfg, started); err != nil {
		return err
	}
	if *smoke {
		// Every comparison must have measured something and written it.
		b, err := os.ReadFile(*out)
		if err != nil {
			return err
		}
		for _, s := range rep.sections {
			if !strings.Contains(string(b), "## "+s.title+"\n") || !strings.Contains(s.body.String(), "|---|") {
				return fmt.Errorf("smoke: section %q is missing from the report or has no table:\n%s", s.title, b)
			}
		}
		if len(rep.sections) < len(selected) {
			return fmt.Errorf("smoke: %d comparisons wrote %d sections:\n%s", len(selected), len(rep.sections), b)
		}
		fmt.Fprintf(os.Stderr, "smoke: %d comparisons ran and wrote %d sections (%d bytes)\n", len(selected), len(rep.sections), len(b))
		return nil
	}
	fmt.Fprintf(os.Stderr, "wrote %s\n", *out)
	return nil
}

func names() string {
	var ns []string
	for _, c := range comparisons {
		ns = append(ns, c.name)
	}
	return strings.Join(ns, ", ")
}

// checkTools fails, naming what to install, unless every program the
// comparisons run is on PATH, and records their versions.
func checkTools(cfg *config) error {
	var missing []string
	for _, t := range []struct{ name, version string }{
		{"wrk", "-v"}, {"redis-server", "--version"}, {"redis-benchmark", "--version"}, {"nginx", "-v"},
	} {
		if _, err := exec.LookPath(t.name); err != nil {
			missing = append(missing, t.name)
			continue
		}
		// wrk -v prints its version and exits 1.
		v, _ := exec.Command(t.name, t.version).CombinedOutput()
		line, _, _ := strings.Cut(strings.TrimSpace(string(v)), "\n")
		cfg.tools = append(cfg.tools, fmt.Sprintf("%s: %s", t.name, strings.TrimSpace(line)))
		if t.name == "redis-server" {
			cfg.redisVersion = strings.TrimPrefix(strings.Fields(line)[2], "v=") // "Redis server v=7.0.15 ..."
		}
	}
	if len(missing) > 0 {
		return errors.New("not on PATH: " + strings.Join(missing, ", ") + " (Debian: apt-get install wrk redis-server redis-tools nginx)")
	}
	return nil
}
