package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"
)

func TestChartSave(t *testing.T) {
	names := []string{
		"ratelimiter, memory backend",
		"ratelimiter, Redis backend",
		"gubernator v2.13.0 (token bucket)",
		"envoy ratelimit (fixed window, same Redis)",
		"trivial net/http + encoding/json handler (the ceiling)",
	}
	c := &chart{name: "test", title: "HTTP: requests per second, one acquisition each (higher is better)", axis: "requests/s"}
	c.add("one hot key", names, [][]float64{{61000, 65000, 58000}, {24000, 25000, 26000}, {9000, 9500, 9900}, {8000, 8200, 7000}, {90000, 95000, 99000}})
	c.add("100000 random keys", names, [][]float64{{51000, 55000, 48000}, {14000, 15000, 16000}, {7000, 7500, 7900}, {6000, 6200, 6000}, {80000, 85000, 89000}})
	path := filepath.Join(t.TempDir(), "test.png")
	if err := c.save(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := img.Bounds().Dx(), int(chartWidth/vg.Inch*chartDPI); got != want {
		t.Errorf("got a chart %d pixels wide, want %d", got, want)
	}
}

func TestChartSaveNoData(t *testing.T) {
	c := &chart{name: "empty", title: "empty", axis: "x"}
	if err := c.save(filepath.Join(t.TempDir(), "empty.png")); err == nil {
		t.Error("got no error for a chart without data, want one")
	}
}

func TestShort(t *testing.T) {
	for _, tt := range []struct {
		v    float64
		want string
	}{
		{0, "0"}, {1.234, "1.23"}, {19.46, "19.5"}, {134.2, "134"}, {9812, "9.8k"}, {164200, "164k"}, {1393483, "1.39M"},
	} {
		if got := short(tt.v); got != tt.want {
			t.Errorf("short(%v): got %q, want %q", tt.v, got, tt.want)
		}
	}
}

func TestReportWriteCharts(t *testing.T) {
	rep := &report{}
	sec := rep.section("Section")
	sec.printf("Intro.\n")
	c := sec.chart("c", "A chart", "things/s")
	sec.printf("\n### table\n")
	c.add("load", []string{"a", "b"}, [][]float64{{1, 2, 3}, {4, 5, 6}})
	dir := t.TempDir()
	if err := rep.write(filepath.Join(dir, "out.md"), config{}, time.Now()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "out.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "\n## Section\n\nIntro.\n\n![A chart](out-c.png)\n\n### table\n"; !strings.HasSuffix(string(b), want) {
		t.Errorf("got a report ending\n%s\nwant it to end\n%s", b[max(0, len(b)-len(want)-20):], want)
	}
	if fi, err := os.Stat(filepath.Join(dir, "out-c.png")); err != nil || fi.Size() == 0 {
		t.Errorf("got chart file %v, %v; want a non-empty file", fi, err)
	}

	rep.section("Empty").chart("empty", "Nothing", "x")
	if err := rep.write(filepath.Join(dir, "out.md"), config{}, time.Now()); err == nil {
		t.Error("got no error for a chart without data, want one")
	}
}
