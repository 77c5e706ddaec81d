package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	"github.com/ratelimiter/ratelimiter/internal/limiter/storetest"
)

// TestScale creates RATELIMITER_SCALE limiters (a multiple of 100,000) in
// random name order, then deletes them in another, and logs the time per
// operation for each slice of 100,000 and the live heap and resident
// memory after a collection, before, at the peak and after the deletions.
// The test command runs it at 20,000 limiters; a measurement asks for more:
//
//	RATELIMITER_SCALE=1000000 go test -run '^TestScale$' -v ./internal/limiter/memory/
//
// It asserts only what cannot flake: every operation succeeds and the
// store ends empty.
func TestScale(t *testing.T) {
	n := storetest.EnvInt(t, "RATELIMITER_SCALE", 20_000)
	const slice = 100_000
	ctx := context.Background()
	names := make([]string, n)
	for i, v := range rand.New(rand.NewPCG(1, 2)).Perm(n) {
		names[i] = fmt.Sprintf("limiter-%07d", v)
	}
	memStats(t, "before (the names alone)")
	s := memory.New(nil, n)
	p := limiter.Policy{Limit: 100, Period: time.Minute}
	// The machine may be shared: the process's CPU time per operation
	// (garbage collection included) says more than wall time then.
	run := func(op string, order []string, do func(string) error) {
		start, cpu := time.Now(), cpuTime()
		for i, name := range order {
			if err := do(name); err != nil {
				t.Fatalf("%s %q: %v", op, name, err)
			}
			if (i+1)%slice == 0 {
				t.Logf("%-6s %7d..%7d: %5.0f ns/op wall, %5.0f ns/op CPU", op, i+1-slice, i+1,
					float64(time.Since(start))/slice, float64(cpuTime()-cpu)/slice)
				start, cpu = time.Now(), cpuTime()
			}
		}
	}
	run("put", names, func(name string) error {
		_, err := s.Put(ctx, limiter.Definition{Name: name, Policy: p})
		return err
	})
	memStats(t, fmt.Sprintf("after %d puts", n))
	rand.New(rand.NewPCG(3, 4)).Shuffle(n, func(i, j int) { names[i], names[j] = names[j], names[i] })
	run("delete", names, func(name string) error { return s.Delete(ctx, name) })
	if defs, err := s.List(ctx, "", 10); err != nil || len(defs) != 0 {
		t.Fatalf("List after deleting everything: got %d, %v, want none", len(defs), err)
	}
	memStats(t, fmt.Sprintf("after %d deletes", n))
	runtime.KeepAlive(s)
	runtime.KeepAlive(names)
}

// memStats logs the live heap after a collection, and the resident set
// then and once the runtime has returned the free heap to the system
// (which it otherwise does gradually).
func memStats(t *testing.T, when string) {
	t.Helper()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	rss := vmRSS()
	debug.FreeOSMemory()
	t.Logf("%s: live heap %.1f MB, RSS %s, RSS once free memory is returned %s", when, float64(m.HeapAlloc)/1e6, rss, vmRSS())
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func vmRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
