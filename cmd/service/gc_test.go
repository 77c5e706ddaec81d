package main

import (
	"bufio"
	"bytes"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// goMetrics reads the Go runtime's GOGC and heap goal from the service's
// /metrics.
func goMetrics(t *testing.T, base string) (gogc, goal float64) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	status, body, err := do(req)
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET /metrics: %d, %v", status, err)
	}
	found := map[string]float64{}
	for sc := bufio.NewScanner(bytes.NewReader(body)); sc.Scan(); {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && (name == "go_gc_gogc_percent" || name == "go_memstats_next_gc_bytes") {
			if found[name], err = strconv.ParseFloat(value, 64); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}
	if len(found) != 2 {
		t.Fatalf("/metrics has %v of go_gc_gogc_percent and go_memstats_next_gc_bytes", found)
	}
	return found["go_gc_gogc_percent"], found["go_memstats_next_gc_bytes"]
}

// A process of the service keeps its heap goal at --gc-min-heap while its
// heap is small, leaves Go's pacing alone with 0, and leaves a GOGC set in
// its environment in force.
func TestGCMinHeap(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	for _, c := range []struct {
		name      string
		env, args []string
		floor     float64 // 0: Go's own pacing
		gogc      float64 // when floor is 0
	}{
		// An empty GOGC, as if unset, whatever the tests run under.
		{name: "default", env: []string{"GOGC="}, floor: 32 * mib},
		{name: "64MiB", env: []string{"GOGC="}, args: []string{"--gc-min-heap", "64MiB"}, floor: 64 * mib},
		{name: "off", env: []string{"GOGC="}, args: []string{"--gc-min-heap", "0"}, gogc: 100},
		{name: "GOGC set", env: []string{"GOGC=200"}, gogc: 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			svc := startChildEnv(t, c.env, c.args...)
			gogc, goal := goMetrics(t, svc.base)
			switch {
			case c.floor > 0 && (gogc <= 100 || goal < c.floor*0.99 || goal > c.floor):
				t.Errorf("GOGC %v and heap goal %v, want GOGC above 100 and the goal within 1%% below %v", gogc, goal, c.floor)
			case c.floor == 0 && (gogc != c.gogc || goal >= 16*mib):
				t.Errorf("GOGC %v and heap goal %v, want GOGC %v and the goal of a small heap", gogc, goal, c.gogc)
			}
			skipped := slices.Contains(svc.logs.messages(), "GOGC is set, so --gc-min-heap does not apply")
			if want := c.name == "GOGC set"; skipped != want {
				t.Errorf("logged that --gc-min-heap does not apply: %v, want %v; logs %q", skipped, want, svc.logs.messages())
			}
		})
	}
}
