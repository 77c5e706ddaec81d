package heapfloor

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

// goal is what Go's pacer makes of GOGC p after a cycle that found live
// bytes live and scan bytes to scan.
func goal(p int, live, scan uint64) uint64 {
	return max(live+scan*uint64(p)/100, Min*uint64(p)/100)
}

// Percent never collects sooner than Go's default, never lets the goal
// pass the floor unless the default goal does, and reaches the floor
// within the rounding of a percent.
func TestPercent(t *testing.T) {
	floors := []uint64{Min, 5 << 20, 32 << 20, 1 << 30, Max}
	for _, floor := range floors {
		for live := uint64(0); live <= 2*floor; live += floor/97 + 1 {
			for _, extra := range []uint64{0, 1, 4096, 300 << 10, 3 << 20, floor / 3} {
				scan := live + extra
				p := Percent(floor, live, scan)
				def := goal(100, live, scan)
				got := goal(p, live, scan)
				switch {
				case p < 100:
					t.Fatalf("Percent(%d, %d, %d) = %d, below 100", floor, live, scan, p)
				case got > max(floor, def):
					t.Fatalf("Percent(%d, %d, %d) = %d: goal %d past the floor and the default goal %d", floor, live, scan, p, got, def)
				case def < floor && scan > 0 && got+scan/100+Min/100 < floor:
					t.Fatalf("Percent(%d, %d, %d) = %d: goal %d short of the floor", floor, live, scan, p, got)
				}
			}
		}
	}
	if got := Percent(32<<20, 0, 0); got != 100 {
		t.Errorf("Percent with nothing to scan = %d, want 100", got)
	}
}

func read(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// waitFor runs collections until ok holds, or fails after a few seconds:
// the floor is adjusted after a cycle, by a cleanup the runtime runs
// shortly after it.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s: %s: GOGC %d, heap goal %d, live heap %d", what,
				read("/gc/gogc:percent"), read("/gc/heap/goal:bytes"), read("/gc/heap/live:bytes"))
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}

// In the running process: a small heap's goal rises to the floor, a live
// heap past half the floor gets Go's own pacing back, and stop restores
// GOGC.
func TestStart(t *testing.T) {
	const floor = 64 << 20
	stop := Start(floor)
	defer stop()
	waitFor(t, "the goal of a small heap reaches the floor", func() bool {
		g := read("/gc/heap/goal:bytes")
		return read("/gc/gogc:percent") > 100 && g >= floor*99/100 && g <= floor
	})

	held := make([][]byte, 0, 48)
	for range cap(held) {
		held = append(held, make([]byte, 1<<20))
	}
	waitFor(t, "a live heap of 48 MiB is paced by GOGC=100", func() bool {
		return read("/gc/gogc:percent") == 100 && read("/gc/heap/goal:bytes") > 90<<20
	})
	runtime.KeepAlive(held)
	held = nil

	waitFor(t, "the floor holds again once the heap is small", func() bool {
		return read("/gc/gogc:percent") > 100
	})
	stop()
	if got := read("/gc/gogc:percent"); got != 100 {
		t.Errorf("after stop: GOGC %d, want 100", got)
	}
	// A stopped floor arms nothing more.
	runtime.GC()
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	if got := read("/gc/gogc:percent"); got != 100 {
		t.Errorf("cycles after stop: GOGC %d, want 100", got)
	}
}

// A later Start replaces the floor, and only its stop ends it.
func TestStartReplaces(t *testing.T) {
	first := Start(8 << 20)
	second := Start(64 << 20)
	first()
	waitFor(t, "the second floor is in force", func() bool {
		g := read("/gc/heap/goal:bytes")
		return g >= 60<<20 && g <= 64<<20
	})
	second()
	if got := read("/gc/gogc:percent"); got != 100 {
		t.Errorf("after the latest stop: GOGC %d, want 100", got)
	}
}
