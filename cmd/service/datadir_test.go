package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// childEnv makes the test binary run the service instead of its tests, so
// that a test can kill a real process of it.
const childEnv = "RATELIMITER_TEST_RUN_SERVICE"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// child is the service running as a process of its own.
type child struct {
	cmd    *exec.Cmd
	base   string
	logs   *logs
	exited chan error
}

// startChild runs the service as a process with args and returns once it
// listens.
func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	return startChildEnv(t, nil, args...)
}

// startChildEnv is startChild with env added to the process's environment.
func startChildEnv(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	args = append([]string{"--listen", "127.0.0.1:0", "--grpc-listen", ""}, args...)
	c := &child{cmd: exec.Command(os.Args[0], args...), logs: newLogs(), exited: make(chan error, 1)}
	c.cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	c.cmd.Stderr = c.logs
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.exited <- c.cmd.Wait() }()
	t.Cleanup(func() { c.cmd.Process.Kill(); <-c.exited; c.exited <- nil })
	select {
	case addr := <-c.logs.addr:
		c.base = "http://" + addr
	case err := <-c.exited:
		t.Fatalf("the service exited before listening: %v; it logged %v", err, c.logs.messages())
	case <-time.After(30 * time.Second):
		t.Fatal("the service did not log a listening address within 30s")
	}
	return c
}

// kill stops the process with SIGKILL: no shutdown runs.
func (c *child) kill(t *testing.T) {
	t.Helper()
	c.cmd.Process.Signal(syscall.SIGKILL)
	err := <-c.exited
	c.exited <- err
}

// stop stops the process with SIGTERM and waits for it to exit cleanly.
func (c *child) stop(t *testing.T) {
	t.Helper()
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.exited:
		c.exited <- err
		if err != nil {
			t.Fatalf("the service exited with %v after SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the service did not exit within 30s of SIGTERM")
	}
}

// definitions lists the limiters the service holds: name -> limit.
func definitions(t *testing.T, base string) map[string]int64 {
	t.Helper()
	got := make(map[string]int64)
	token := ""
	for {
		url := base + "/v1/limiters?page_size=1000"
		if token != "" {
			url += "&page_token=" + token
		}
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Items []struct {
				Name  string `json:"name"`
				Limit int64  `json:"limit"`
			} `json:"items"`
			Next string `json:"next_page_token"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("list limiters: %s, %v", resp.Status, err)
		}
		for _, it := range page.Items {
			got[it.Name] = it.Limit
		}
		if page.Next == "" {
			return got
		}
		token = page.Next
	}
}

func putLimiter(ctx context.Context, base, name string, limit int64) (int, []byte, error) {
	body := fmt.Sprintf(`{"limit":%d,"period":"1h"}`, limit)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, base+"/v1/limiters/"+name, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return do(req)
}

func deleteLimiter(ctx context.Context, base, name string) (int, []byte, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, base+"/v1/limiters/"+name, nil)
	return do(req)
}

func do(req *http.Request) (int, []byte, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// killCycles is how many times the kill tests kill the service: 10, or
// RATELIMITER_KILL_CYCLES for a long run.
func killCycles(t *testing.T) int {
	t.Helper()
	v := os.Getenv("RATELIMITER_KILL_CYCLES")
	if v == "" {
		return 10
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("RATELIMITER_KILL_CYCLES=%q: want a positive count", v)
	}
	return n
}

// TestDataDirKeepsDefinitions restarts the service gracefully on its data
// directory: the limiters created, replaced and deleted through the API
// are as they were, those of the config file too. A second process started
// on the directory meanwhile waits for the first to stop.
func TestDataDirKeepsDefinitions(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("limiters:\n  - {name: declared, limit: 3, period: 1m}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	c := startChild(t, "--data-dir", data, "--config", cfg)
	ctx := t.Context()
	for name, limit := range map[string]int64{"a": 1, "b": 2, "c": 3} {
		if code, body, err := putLimiter(ctx, c.base, name, limit); err != nil || code != http.StatusCreated {
			t.Fatalf("create %s: %d %s %v", name, code, body, err)
		}
	}
	if code, body, err := putLimiter(ctx, c.base, "b", 20); err != nil || code != http.StatusOK {
		t.Fatalf("replace b: %d %s %v", code, body, err)
	}
	if code, body, err := deleteLimiter(ctx, c.base, "c"); err != nil || code != http.StatusNoContent {
		t.Fatalf("delete c: %d %s %v", code, body, err)
	}
	want := map[string]int64{"a": 1, "b": 20, "declared": 3}
	if got := definitions(t, c.base); !mapsEqual(got, want) {
		t.Fatalf("before the restart: got %v, want %v", got, want)
	}
	c.stop(t)
	c = startChild(t, "--data-dir", data, "--config", cfg)
	if got := definitions(t, c.base); !mapsEqual(got, want) {
		t.Errorf("after the restart: got %v, want %v", got, want)
	}
	// A second process on the same directory waits for the first to let
	// go of it, as a replacement pod does for the one it replaces, and
	// then serves the same limiters.
	second := exec.Command(os.Args[0], "--listen", "127.0.0.1:0", "--grpc-listen", "", "--data-dir", data, "--config", cfg)
	second.Env = append(os.Environ(), childEnv+"=1")
	secondLogs := newLogs()
	second.Stderr = secondLogs
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Process.Kill(); second.Wait() })
	for deadline := time.Now().Add(30 * time.Second); !slices.Contains(secondLogs.messages(), "waiting for another process to let go of the data file (the instance this one replaces, still shutting down?)"); {
		if time.Now().After(deadline) {
			t.Fatalf("the second process did not say it waits for the data file; it logged %v", secondLogs.messages())
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.stop(t)
	select {
	case addr := <-secondLogs.addr:
		if got := definitions(t, "http://"+addr); !mapsEqual(got, want) {
			t.Errorf("the second process: got %v, want %v", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the second process did not start once the first stopped; it logged %v", secondLogs.messages())
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestDataDirSurvivesKill kills the service with SIGKILL at random
// instants while limiters are created, replaced and deleted, and restarts
// it on the same data directory: every change acknowledged before the
// kill is there, and a change in flight at the kill is either there or
// not, whole. RATELIMITER_KILL_CYCLES sets the number of cycles (10 by
// default; the long run is 1000).
func TestDataDirSurvivesKill(t *testing.T) {
	cycles := killCycles(t)
	const (
		workers = 4
		names   = 64 // per worker, so that no two changes to one name are in flight at once
		absent  = int64(0)
	)
	data := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	// acked[name] is the limit last acknowledged (absent: deleted or never
	// created); inflight[name], when set, is the change under way at the
	// kill: the name holds either.
	acked := make(map[string]int64)
	inflight := make(map[string]int64)
	var acks, changes int
	for cycle := range cycles {
		c := startChild(t, "--data-dir", data)
		got := definitions(t, c.base)
		for w := range workers {
			for i := range names {
				name := fmt.Sprintf("w%d-%02d", w, i)
				have, ok := got[name]
				if !ok {
					have = absent
				}
				want, pending := acked[name], false
				if v, ok := inflight[name]; ok {
					pending = have == v
				}
				if have != want && !pending {
					t.Fatalf("cycle %d: %s holds limit %d (0: absent), want %d as acknowledged (in flight at the kill: %v)",
						cycle, name, have, want, inflight[name])
				}
				acked[name] = have
			}
		}
		clear(inflight)
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func(w int, seed uint64) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(w)))
				for ctx.Err() == nil {
					name := fmt.Sprintf("w%d-%02d", w, rng.IntN(names))
					next := absent
					if rng.IntN(3) > 0 {
						next = 1 + rng.Int64N(1000)
					}
					mu.Lock()
					inflight[name] = next
					changes++
					mu.Unlock()
					var code int
					var err error
					if next == absent {
						code, _, err = deleteLimiter(ctx, c.base, name)
					} else {
						code, _, err = putLimiter(ctx, c.base, name, next)
					}
					if err != nil {
						// Killed: this change stays in flight, and
						// this worker sends no other.
						return
					}
					ok := (code == http.StatusOK || code == http.StatusCreated ||
						code == http.StatusNoContent || next == absent && code == http.StatusNotFound)
					if !ok {
						t.Errorf("cycle %d: change %s to %d: status %d", cycle, name, next, code)
					}
					mu.Lock()
					if ok {
						acked[name] = next
						delete(inflight, name)
						acks++
					}
					mu.Unlock()
				}
			}(w, rng.Uint64())
		}
		time.Sleep(time.Duration(10+rng.IntN(150)) * time.Millisecond)
		c.kill(t)
		cancel()
		wg.Wait()
	}
	c := startChild(t, "--data-dir", data)
	got := definitions(t, c.base)
	for name, want := range acked {
		have := got[name]
		if v, ok := inflight[name]; have != want && !(ok && have == v) {
			t.Errorf("after the last kill: %s holds %d, want %d", name, have, want)
		}
	}
	t.Logf("%d kills; %d changes sent, %d acknowledged, every acknowledged one kept", cycles, changes, acks)
}

// loadTarget is one bucket the kill test drives: an acquire URL path, its
// JSON body, and the policy its grants are held to.
type loadTarget struct {
	name, path, body string
	policy           limiter.Policy
}

// timedGrant is a grant seen by a client: the service made it at some
// instant between sent and received, on the wall clock.
type timedGrant struct{ sent, received int64 }

// TestKillUnderLoadNeverOverAdmits kills the service with SIGKILL at
// random instants while clients acquire from a GCRA limiter, a sliding
// log, two keys of a keyed limiter and a tenant, and restarts it on the
// same data directory each time (a graceful stop now and then). No bucket
// ever exceeds its contract across the restarts: a set of grants that
// surely fell within one window (the first sent and the last answered
// within it) never holds more than the contract allows. Cycles as
// TestDataDirSurvivesKill.
func TestKillUnderLoadNeverOverAdmits(t *testing.T) {
	cycles := killCycles(t)
	gcra := limiter.Policy{Limit: 20, Period: time.Second, Burst: 5}
	log := limiter.Policy{Limit: 15, Period: time.Second, Algorithm: limiter.SlidingLog}
	keyed := limiter.Policy{Limit: 10, Period: time.Second}
	tenants := limiter.Policy{Limit: 12, Period: time.Second, Algorithm: limiter.SlidingLog}
	targets := []loadTarget{
		{"gcra", "/v1/limiters/gcra/acquire", `{"permits":1}`, gcra},
		{"log", "/v1/limiters/log/acquire", `{"permits":1}`, log},
		{"keyed/alice", "/v1/limiters/keyed/acquire", `{"permits":1,"key":"alice"}`, keyed},
		{"keyed/bob", "/v1/limiters/keyed/acquire", `{"permits":1,"key":"bob"}`, keyed},
		{"tenant", "/v1/tenants/198.51.100.7/acquire", `{"permits":1}`, tenants},
	}
	args := []string{"--data-dir", t.TempDir(), "--tenant-limit", "12", "--tenant-period", "1s", "--tenant-algorithm", "sliding_log"}
	c := startChild(t, args...)
	for _, def := range []string{
		`gcra {"limit":20,"period":"1s","burst":5}`,
		`log {"limit":15,"period":"1s","algorithm":"sliding_log"}`,
		`keyed {"limit":10,"period":"1s","keyed":true}`,
	} {
		name, body, _ := strings.Cut(def, " ")
		req, _ := http.NewRequest(http.MethodPut, c.base+"/v1/limiters/"+name, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if code, b, err := do(req); err != nil || code != http.StatusCreated {
			t.Fatalf("create %s: %d %s %v", name, code, b, err)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	grants := make([][]timedGrant, len(targets))
	var mu sync.Mutex
	var sent, kills, stops int
	for cycle := range cycles {
		if cycle > 0 {
			c = startChild(t, args...)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Add(1)
			go func(seed uint64) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, 0))
				client := &http.Client{}
				for ctx.Err() == nil {
					i := rng.IntN(len(targets))
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.base+targets[i].path, strings.NewReader(targets[i].body))
					req.Header.Set("Content-Type", "application/json")
					before := time.Now().UnixNano()
					resp, err := client.Do(req)
					if err != nil {
						return // the service is gone
					}
					var d struct {
						Allowed bool `json:"allowed"`
					}
					err = json.NewDecoder(resp.Body).Decode(&d)
					resp.Body.Close()
					after := time.Now().UnixNano()
					mu.Lock()
					sent++
					if err == nil && resp.StatusCode == http.StatusOK && d.Allowed {
						grants[i] = append(grants[i], timedGrant{before, after})
					}
					mu.Unlock()
				}
			}(rng.Uint64() + uint64(w))
		}
		time.Sleep(time.Duration(30+rng.IntN(300)) * time.Millisecond)
		if rng.IntN(5) == 0 {
			c.stop(t)
			stops++
		} else {
			c.kill(t)
			kills++
		}
		cancel()
		wg.Wait()
	}
	allowed := 0
	for i, tg := range targets {
		allowed += len(grants[i])
		if err := sureViolation(tg.policy, grants[i]); err != nil {
			t.Errorf("%s: %v", tg.name, err)
		}
	}
	t.Logf("%d kills and %d graceful stops; %d acquisitions sent, %d allowed", kills, stops, sent, allowed)
}

// sureViolation reports a set of grants that surely fell within one
// interval of length w (the first sent and the last answered within it)
// and holds more than p's contract allows in w: Limit within a Period for
// the sliding log, Burst + ⌊w·Limit/Period⌋ for GCRA, with w up to five
// periods.
func sureViolation(p limiter.Policy, gs []timedGrant) error {
	p = p.Normalize()
	slices.SortFunc(gs, func(a, b timedGrant) int { return cmp.Compare(a.sent, b.sent) })
	period := int64(p.Period)
	for i := range gs {
		// The grants sent from gs[i] on, answered by end, surely fell
		// within [gs[i].sent, end].
		var answered []int64
		for _, g := range gs[i:] {
			if g.sent-gs[i].sent > 5*period {
				break
			}
			answered = append(answered, g.received)
		}
		slices.Sort(answered)
		for k, end := range answered {
			w := end - gs[i].sent
			bound := p.Burst + w*p.Limit/period
			if p.Algorithm == limiter.SlidingLog {
				if w >= period {
					break
				}
				bound = p.Limit
			}
			if int64(k+1) > bound {
				return fmt.Errorf("%d grants surely within %v, from %v on; the contract allows %d", k+1, time.Duration(w), time.Unix(0, gs[i].sent).UTC().Format(time.RFC3339Nano), bound)
			}
		}
	}
	return nil
}

// available reads what the limiter at path (…/available) could grant now.
func available(t *testing.T, url string) int64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var av struct {
		Remaining int64 `json:"remaining"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&av); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return av.Remaining
}

// TestDataDirRestartKeepsCounts takes permits from daily limits (a plain
// limiter of each algorithm, a key and a tenant), restarts the service
// gracefully, and finds exactly what was left before; then kills it and
// finds every one of them exhausted, a key never seen included.
func TestDataDirRestartKeepsCounts(t *testing.T) {
	args := []string{"--data-dir", t.TempDir(), "--tenant-limit", "100", "--tenant-period", "24h"}
	c := startChild(t, args...)
	ctx := t.Context()
	for _, def := range []string{
		`daily {"limit":100,"period":"24h"}`,
		`daily-log {"limit":100,"period":"24h","algorithm":"sliding_log"}`,
		`per-user {"limit":100,"period":"24h","keyed":true}`,
	} {
		name, body, _ := strings.Cut(def, " ")
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, c.base+"/v1/limiters/"+name, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if code, b, err := do(req); err != nil || code != http.StatusCreated {
			t.Fatalf("create %s: %d %s %v", name, code, b, err)
		}
	}
	take := map[string]string{
		"/v1/limiters/daily":              `{"permits":37}`,
		"/v1/limiters/daily-log":          `{"permits":41}`,
		"/v1/limiters/per-user":           `{"permits":43,"key":"alice"}`,
		"/v1/tenants/203.0.113.9":         `{"permits":47}`,
		"/v1/limiters/per-user?key=never": "",
	}
	url := func(path string) string {
		p, q, _ := strings.Cut(path, "?")
		if q == "" && strings.HasPrefix(p, "/v1/limiters/per-user") {
			q = "key=alice"
		}
		return c.base + p + "/available?" + q
	}
	for path, body := range take {
		if body == "" {
			continue
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path+"/acquire", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if code, b, err := do(req); err != nil || code != http.StatusOK || !bytes.Contains(b, []byte(`"allowed":true`)) {
			t.Fatalf("acquire %s: %d %s %v", path, code, b, err)
		}
	}
	before := make(map[string]int64)
	for path := range take {
		before[path] = available(t, url(path))
	}
	c.stop(t)
	c = startChild(t, args...)
	for path := range take {
		if got := available(t, url(path)); got != before[path] {
			t.Errorf("%s after a graceful restart: %d left, want %d as before it", path, got, before[path])
		}
	}
	c.kill(t)
	c = startChild(t, args...)
	for path := range take {
		if got := available(t, url(path)); got != 0 {
			t.Errorf("%s after SIGKILL: %d left, want 0 (exhausted at the restart)", path, got)
		}
	}
}

// refusedStart runs the service with args, expecting it to refuse to
// start: it returns what the service wrote to stderr once it exited with
// status 1, and fails if it listened instead.
func refusedStart(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	args = append([]string{"--listen", "127.0.0.1:0", "--grpc-listen", ""}, args...)
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for sc := bufio.NewScanner(pipe); sc.Scan(); {
		out.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), `"msg":"listening"`) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the service started; it logged\n%s", out.String())
		}
	}
	err = cmd.Wait()
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("the service exited with %v, want exit status 1; it logged\n%s", err, out.String())
	}
	return out.String()
}

// TestDataDirRefusesDamagedFile starts the service on a data file that
// changed after it was written, a bit flipped in a definition or in the
// saved state, or cut short: it refuses to start, exits with status 1
// and says which file, which record and why, and leaves the file as it
// was.
func TestDataDirRefusesDamagedFile(t *testing.T) {
	data := t.TempDir()
	c := startChild(t, "--data-dir", data)
	ctx := t.Context()
	for i := range 40 {
		if code, body, err := putLimiter(ctx, c.base, fmt.Sprintf("limiter-%02d", i), int64(100+i)); err != nil || code != http.StatusCreated {
			t.Fatalf("create: %d %s %v", code, body, err)
		}
	}
	if code, body, err := putLimiter(ctx, c.base, "api", 5); err != nil || code != http.StatusCreated {
		t.Fatalf("create api: %d %s %v", code, body, err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/limiters/api/acquire", strings.NewReader(`{"permits":5}`))
	req.Header.Set("Content-Type", "application/json")
	if code, b, err := do(req); err != nil || code != http.StatusOK || !bytes.Contains(b, []byte(`"allowed":true`)) {
		t.Fatalf("acquire: %d %s %v", code, b, err)
	}
	c.stop(t)
	path := filepath.Join(data, "ratelimiter.db")
	written, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var state []byte // the limiters' saved state
	var used int64   // the bytes the file's pages take
	leaf := 0        // a leaf page in use
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	page := db.Info().PageSize
	db.View(func(tx *bbolt.Tx) error {
		used = tx.Size()
		for id := 2; leaf == 0; id++ {
			if info, err := tx.Page(id); err != nil || info == nil {
				break
			} else if info.Type == "leaf" {
				leaf = id
			}
		}
		if b := tx.Bucket([]byte("state")); b != nil && b.Bucket([]byte("limiters")) != nil {
			_, v := b.Bucket([]byte("limiters")).Cursor().First()
			state = bytes.Clone(v)
		}
		return nil
	})
	db.Close()
	if len(state) < 100 || used > int64(len(written)) || leaf == 0 {
		t.Fatalf("the file: %d bytes of saved state, pages taking %d of its %d bytes, leaf page %d", len(state), used, len(written), leaf)
	}
	damaged := bytes.Clone(written)
	damaged[leaf*page] ^= 0x55 // the page's number, in its header
	// The saved state deleted whole: every record left has its checksum.
	if err := os.WriteFile(path, written, 0o600); err != nil {
		t.Fatal(err)
	}
	if db, err = bbolt.Open(path, 0o600, nil); err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error { return tx.DeleteBucket([]byte("state")) })
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	stateless, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// flipped flips bit in the file, at offset i of every copy of v.
	flipped := func(v []byte, i int, bit byte) []byte {
		b := bytes.Clone(written)
		n := 0
		for off := 0; ; n++ {
			j := bytes.Index(b[off:], v)
			if j < 0 {
				break
			}
			b[off+j+i] ^= bit
			off += j + len(v)
		}
		if n == 0 {
			t.Fatalf("%q is not in the file", v)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		file []byte
		want []string
	}{
		{"a limit of 5 made 7", flipped([]byte(`"limit":5,`), len(`"limit":`), 0x02), []string{path, `record limiters/"api": checksum mismatch`}},
		{"a bit of the saved state", flipped(state, len(state)/2, 0x10), []string{path, "record state/limiters/0: checksum mismatch"}},
		{"cut inside a page", written[:used-100], []string{path, "truncated: "}},
		{"cut at a page boundary", written[:used-int64(page)], []string{path, "truncated: "}},
		{"a page header damaged", damaged, []string{path, fmt.Sprintf("page %d: its header says page", leaf)}},
		{"the saved state deleted", stateless, []string{path, "do not add up to its contents record: the state header is missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, tc.file, 0o600); err != nil {
				t.Fatal(err)
			}
			logged := refusedStart(t, "--data-dir", data)
			for _, want := range tc.want {
				if !strings.Contains(logged, want) {
					t.Errorf("the service logged\n%s\nwant it to say %s", logged, want)
				}
			}
			for _, leak := range []string{"runtime error", "nil pointer", "fault", "panic", "assertion"} {
				if strings.Contains(logged, leak) {
					t.Errorf("the service logged\n%s\nwhich says %q", logged, leak)
				}
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, tc.file) {
				t.Error("the refused file was changed")
			}
		})
	}
}
