package main

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// report is the Markdown the harness writes: what it ran on, then one
// section per comparison.
type report struct {
	sections []*section
	facts    []string
}

type section struct {
	title  string
	body   strings.Builder
	charts []placedChart
}

// placedChart is a chart and where in its section's body its image goes.
type placedChart struct {
	c  *chart
	at int
}

func (r *report) section(title string) *section {
	s := &section{title: title}
	r.sections = append(r.sections, s)
	return s
}

func (s *section) printf(format string, args ...any) { fmt.Fprintf(&s.body, format, args...) }

// chart places, at this point of the section, the image of a chart the
// caller fills in afterwards; report.write renders it next to the Markdown,
// as <report name>-<name>.png.
func (s *section) chart(name, title, axis string) *chart {
	c := &chart{name: name, title: title, axis: axis}
	s.charts = append(s.charts, placedChart{c: c, at: s.body.Len()})
	return c
}

// sampleTable writes one row per system: its samples' medians with min–max,
// per unit ("decision", or "request" where a request is not one decision).
// A figure a tool does not report (redis-benchmark's p99.9) is a dash.
func (s *section) sampleTable(unit string, names []string, results [][]sample) {
	s.printf("| system | %[1]ss/s | p50 µs | p99 µs | p99.9 µs | server CPU µs/%[1]s | load generator CPU µs/%[1]s |\n|---|---|---|---|---|---|---|\n", unit)
	for i, name := range names {
		col := func(f func(sample) float64, format string) string {
			xs := make([]float64, 0, len(results[i]))
			for _, x := range results[i] {
				if v := f(x); v >= 0 {
					xs = append(xs, v)
				}
			}
			if len(xs) == 0 {
				return "–"
			}
			return stat(xs, format)
		}
		s.printf("| %s | %s | %s | %s | %s | %s | %s |\n", name,
			col(func(x sample) float64 { return x.rps }, "%.0f"),
			col(func(x sample) float64 { return x.p50 }, "%.0f"),
			col(func(x sample) float64 { return x.p99 }, "%.0f"),
			col(func(x sample) float64 { return x.p999 }, "%.0f"),
			col(func(x sample) float64 { return x.serverCPU }, "%.1f"),
			col(func(x sample) float64 { return x.loadCPU }, "%.1f"))
	}
}

// write renders the report into path, and its charts into PNG files next to
// it. It fails if a chart has no data or its file came out empty.
func (r *report) write(path string, cfg config, started time.Time) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\n")
	fmt.Fprintf(&b, "Written by `%s`, a run started %s that took %s. Every figure below comes from that one run on one machine, with the systems compared measured in interleaved rounds (A B A B …) so that the machine's noise falls on all of them alike; each is a median with its min–max over the rounds. All traffic is on loopback, and the load generators share the machine's cores with the servers: their own CPU is reported.\n\n",
		cfg.command, started.UTC().Format("2006-01-02 15:04 MST"), time.Since(started).Round(time.Second))
	fmt.Fprintf(&b, "## Machine\n\n")
	for _, line := range machine(cfg) {
		fmt.Fprintf(&b, "- %s\n", line)
	}
	if len(r.facts) > 0 {
		fmt.Fprintf(&b, "\n## Summary\n\n")
		for _, f := range r.facts {
			fmt.Fprintf(&b, "- %s\n", f)
		}
	}
	stem := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	for _, s := range r.sections {
		fmt.Fprintf(&b, "\n## %s\n\n", s.title)
		body, last := s.body.String(), 0
		for _, pc := range s.charts {
			file := stem + "-" + pc.c.name + ".png"
			png := filepath.Join(filepath.Dir(path), file)
			if err := pc.c.save(png); err != nil {
				return fmt.Errorf("chart %s: %w", png, err)
			}
			if fi, err := os.Stat(png); err != nil {
				return fmt.Errorf("chart %s: %w", png, err)
			} else if fi.Size() == 0 {
				return fmt.Errorf("chart %s is empty", png)
			}
			// The image is a paragraph of its own.
			if last < pc.at {
				if text := strings.TrimRight(body[last:pc.at], "\n"); text != "" {
					b.WriteString(text + "\n\n")
				}
				last = pc.at
			}
			fmt.Fprintf(&b, "![%s](%s)\n\n", pc.c.title, file)
			for last < len(body) && body[last] == '\n' {
				last++
			}
		}
		b.WriteString(body[last:])
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// machine describes what the run ran on.
func machine(cfg config) []string {
	model, cores := "unknown CPU", 0
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), ":")
			switch strings.TrimSpace(k) {
			case "model name":
				model = strings.TrimSpace(v)
			case "processor":
				cores++
			}
		}
		f.Close()
	}
	kernel, _ := exec.Command("uname", "-sr").Output()
	lines := []string{
		fmt.Sprintf("CPU: %s, %d logical cores (GOMAXPROCS %d)", model, cores, runtime.GOMAXPROCS(0)),
		fmt.Sprintf("Memory: %s", memTotal()),
		fmt.Sprintf("Kernel: %s", strings.TrimSpace(string(kernel))),
		fmt.Sprintf("Go: %s", runtime.Version()),
	}
	return append(lines, cfg.tools...)
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kb int64
			fmt.Sscan(v, &kb)
			return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
		}
	}
	return "unknown"
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.SortFunc(s, cmp.Compare)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// stat is the median of xs with its min–max.
func stat(xs []float64, format string) string {
	return fmt.Sprintf(format+" ("+format+"–"+format+")", median(xs), slices.Min(xs), slices.Max(xs))
}

// pct is stat for ratios, as percentages.
func pct(xs []float64) string {
	ys := make([]float64, len(xs))
	for i, x := range xs {
		ys[i] = x * 100
	}
	return stat(ys, "%.0f%%")
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "**missed**"
}
