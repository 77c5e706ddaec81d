// Package heapfloor keeps the garbage collector from running while the
// heap is small, by raising its heap goal to a floor.
//
// Go's collector starts a cycle when the heap reaches its goal: by default
// (GOGC=100) twice what the last cycle found live, and no less than 4 MiB.
// A service whose live heap is a few megabytes and that allocates for
// every request therefore collects tens of times a second under load, and
// each cycle costs what does not shrink with the heap: scanning every
// goroutine's stack, and the write barrier and assists while it marks.
// With a floor the goal is at least that many bytes, so the same load is
// collected that much less often, for memory the operator has budgeted
// anyway. Once the live heap is half the floor or more, the goal is Go's
// own again.
//
// After each cycle the floor sets GOGC to what makes the goal the floor,
// from the cycle's live heap, stacks and globals; never below 100, so it
// never collects sooner than Go would.
package heapfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// Min is the smallest floor, Go's own least heap goal at GOGC=100, Max
// the largest, and Default the service's (--gc-min-heap).
const (
	Min     = 4 << 20
	Max     = 1 << 40
	Default = 32 << 20
)

var (
	mu sync.Mutex
	// floor is the floor in force, 0 for none.
	floor uint64
	// epoch counts Starts and stops; a cycle's callback armed under an
	// older one does nothing and arms no other.
	epoch uint64
	// base is GOGC from before the first Start, restored by its stop.
	base = -1
	// percent is GOGC as last set here.
	percent int
	// samples are read after each cycle.
	samples = []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/gc/scan/stack:bytes"},
		{Name: "/gc/scan/globals:bytes"},
	}
)

// Start keeps the heap goal at least floorBytes (within Min and Max) until stop
// is called, which gives GOGC back its value from before. The floor is the
// process's: a later Start replaces it, and only the latest Start's stop
// ends it.
func Start(floorBytes uint64) (stop func()) {
	mu.Lock()
	defer mu.Unlock()
	epoch++
	floor = min(max(floorBytes, Min), Max)
	if base < 0 {
		base = debug.SetGCPercent(100)
	}
	adjust()
	arm(epoch)
	mine := epoch
	return func() {
		mu.Lock()
		defer mu.Unlock()
		if epoch != mine {
			return
		}
		epoch++
		floor, percent = 0, 0
		debug.SetGCPercent(base)
		base = -1
	}
}

// arm has adjust run after the next cycle, and again after each one, until
// the epoch changes.
func arm(e uint64) {
	// Not a tiny allocation, which may share its block with a reachable
	// one and so never be collected.
	sentinel := new([32]byte)
	runtime.AddCleanup(sentinel, func(e uint64) {
		mu.Lock()
		defer mu.Unlock()
		if e != epoch {
			return
		}
		adjust()
		arm(e)
	}, e)
}

// adjust sets GOGC for the floor from the last cycle's figures. mu is held.
func adjust() {
	metrics.Read(samples)
	live, stacks, globals := samples[0].Value.Uint64(), samples[1].Value.Uint64(), samples[2].Value.Uint64()
	if p := Percent(floor, live, live+stacks+globals); p != percent {
		debug.SetGCPercent(p)
		percent = p
	}
}

// Percent is the GOGC that makes Go's heap goal floor, at least 100: after
// a cycle that found live bytes live on the heap and scan bytes to scan
// (the live heap, stacks and globals), the goal is live + scan×GOGC/100,
// and no less than 4 MiB×GOGC/100, which it keeps within floor (at most
// Max).
func Percent(floor, live, scan uint64) int {
	if scan == 0 || live+scan >= floor {
		return 100
	}
	p := (floor - live) * 100 / scan
	p = min(p, floor*100/Min)
	return int(max(p, 100))
}
