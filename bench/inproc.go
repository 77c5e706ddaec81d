package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	"golang.org/x/time/rate"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// The acquisitions' policy: a limit no run reaches, so that every call
// takes the grant path. Before the many-key runs every key takes
// inprocPrefill permits (1%), which keeps its bucket partly used for
// 36 s: no tenant is forgotten by the registry while it is measured, and
// the hottest Zipf key stays far from its limit.
const (
	inprocLimit   = 1_000_000_000
	inprocPeriod  = time.Hour
	inprocPrefill = 10_000_000
	// The Lowest runs use a small limit and permits from 1 to 100 per
	// tenant, so that the permits left spread and tie.
	lowestLimit = 1000
)

var (
	errDenied = errors.New("denied")
	// errGaveUp is throttled's error when other callers kept changing the
	// key's state: it gives up after 10 compare-and-swap attempts by
	// default. It is counted, not fatal: it is what its users get.
	errGaveUp = errors.New("gave up")
)

// inprocRun is what one timed run measured; failed is the fraction of calls
// that ended with errGaveUp.
type inprocRun struct{ nsPerOp, allocsPerOp, failed float64 }

// oneKeySystem is an in-process limiter on a single key. open returns a
// fresh instance's acquire (safe for concurrent use) and its release.
type oneKeySystem struct {
	name string
	open func() (acquire func() (bool, error), close func(), err error)
}

// keyedSystem keeps one limiter per key.
type keyedSystem struct {
	name string
	open func() (keyed, error)
}

// keyed is an instance of a keyedSystem. acquire must be safe for
// concurrent use; tenants, when set, counts the keys remembered.
type keyed struct {
	acquire func(key string, permits int64) (bool, error)
	tenants func() int
	close   func()
}

// inprocComparison measures this project's limiters against the usual Go
// libraries inside this process: one key, many keys, memory per key, and
// the lowest-10 query against a full scan.
func inprocComparison(cfg config, _ *redisRig, rep *report) error {
	d, nKeys, seqLen, lowestNs := cfg.duration/8, 1_000_000, 1<<22, []int{10_000, 100_000, 1_000_000}
	if cfg.smoke {
		nKeys, seqLen, lowestNs = 10_000, 1<<16, []int{1_000, 10_000}
	}
	sec := rep.section("In process: limiter libraries, one key and many keys")
	procs := runtime.GOMAXPROCS(0)
	sec.printf("Each system runs inside the harness's process, called through the same closure from 1 goroutine (serial) or from GOMAXPROCS = %d goroutines (parallel), each run lasting %s; a fresh instance of every system per round, %d interleaved rounds (A B C … A B C …), median (min–max). ns/op is wall time per call (in parallel runs, with all goroutines busy); allocs/op counts every allocation of the process during the run. A garbage collection runs before every timed run. Every call reads the clock: ratelimiter's limiter and tenant registry through `limiter.Clock`, as the service does (one monotonic read), the others with `time.Now()` (throttled reads it in its store, go-limiter reads it itself with a cheaper `time.now` linkname), and every call is checked to be granted: a single denial or error fails the comparison, with one exception: throttled gives up on a call with an error after 10 compare-and-swap attempts (its default) when other callers keep changing the same key, and those calls are counted and shown as *failed* beside its ns/op.\n\n",
		procs, d, cfg.rounds)
	sec.printf("Systems: this project's `internal/limiter` (GCRA) and `internal/tenant` registry, from this checkout; golang.org/x/time/rate %s; github.com/sethvargo/go-limiter %s (memorystore, whose buckets refill once per interval); github.com/throttled/throttled/v2 %s (GCRA limiter on memstore without a key bound: a plain map under a sync.RWMutex, its fastest form). Policy, for all of them: %s permits per %s, burst %s, a limit no run reaches.\n\n",
		modVersion("golang.org/x/time"), modVersion("github.com/sethvargo/go-limiter"), modVersion("github.com/throttled/throttled/v2"),
		thousands(inprocLimit), limiter.FormatPeriod(inprocPeriod), thousands(inprocLimit))

	if err := oneKey(cfg, sec, rep, d); err != nil {
		return fmt.Errorf("one key: %w", err)
	}
	if err := manyKeys(cfg, sec, rep, d, nKeys, seqLen); err != nil {
		return fmt.Errorf("many keys: %w", err)
	}
	if err := lowestVsScan(cfg, sec, rep, d, lowestNs); err != nil {
		return fmt.Errorf("lowest: %w", err)
	}
	return nil
}

// modVersion is the version of module path this binary was built with.
func modVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				return m.Version
			}
		}
	}
	return "(version unknown)"
}

func oneKey(cfg config, sec *section, rep *report, d time.Duration) error {
	const key = "203.0.113.7"
	ctx := context.Background()
	systems := []oneKeySystem{
		{"ratelimiter `limiter.Limiter.Acquire`", func() (func() (bool, error), func(), error) {
			l, err := limiter.New(limiter.Policy{Limit: inprocLimit, Period: inprocPeriod})
			if err != nil {
				return nil, nil, err
			}
			clock := limiter.NewClock()
			return func() (bool, error) {
				dec, err := l.Acquire(clock.Now(), 1)
				return dec.Allowed, err
			}, func() {}, nil
		}},
		{"x/time/rate `Limiter.AllowN`", func() (func() (bool, error), func(), error) {
			l := newRateLimiter()
			return func() (bool, error) { return l.AllowN(time.Now(), 1), nil }, func() {}, nil
		}},
		{"go-limiter memorystore `Take`", func() (func() (bool, error), func(), error) {
			st, err := newGoLimiter()
			if err != nil {
				return nil, nil, err
			}
			return func() (bool, error) {
				_, _, _, ok, err := st.Take(ctx, key)
				return ok, err
			}, func() { st.Close(ctx) }, nil
		}},
		{"throttled GCRA `RateLimitCtx`", func() (func() (bool, error), func(), error) {
			rl, err := newThrottled()
			if err != nil {
				return nil, nil, err
			}
			return func() (bool, error) {
				limited, _, err := rl.RateLimitCtx(ctx, key, 1)
				return !limited, throttledErr(err)
			}, func() {}, nil
		}},
		{"reference: `time.Now()` alone", func() (func() (bool, error), func(), error) {
			return func() (bool, error) { return !time.Now().IsZero(), nil }, func() {}, nil
		}},
	}
	modes := []int{1, runtime.GOMAXPROCS(0)}
	runs := make([][][]inprocRun, len(systems)) // system, mode, round
	for i := range runs {
		runs[i] = make([][]inprocRun, len(modes))
	}
	for round := range cfg.rounds {
		for i, s := range systems {
			acquire, release, err := s.open()
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			for m, g := range modes {
				r, err := inprocDrive(g, 256, d, func(int) error { return granted(acquire()) })
				if err != nil {
					release()
					return fmt.Errorf("%s, %d goroutines: %w", s.name, g, err)
				}
				runs[i][m] = append(runs[i][m], r)
				cfg.progress("round %d  one key  %-40s G=%d %8.1f ns/op %5.2f allocs/op", round+1, s.name, g, r.nsPerOp, r.allocsPerOp)
			}
			release()
		}
	}
	sec.printf("### One key\n\nOne key, acquired one permit at a time. The `time.Now()` row is the clock every call reads, and a check on the machine: its parallel ns/op is about half its serial one only when both cores were free for the harness.\n\n")
	sec.printf("| system | serial ns/op | parallel ns/op | allocs/op (serial) |\n|---|---|---|---|\n")
	for i, s := range systems {
		sec.printf("| %s | %s | %s | %s |\n", s.name,
			nsCell(runs[i][0], "%.1f"), nsCell(runs[i][1], "%.1f"), stat(runField(runs[i][0], allocsOf), "%.2f"))
	}
	sec.printf("\n")
	for m, mode := range []string{"serial", "parallel"} {
		xs := ratios(runs[1][m], runs[0][m])
		inprocLine(sec, rep, fmt.Sprintf("one key, %s: ratelimiter ÷ x/time/rate, calls/s", mode), xs, "%.2f×", median(xs) >= 1, "≥ 1×")
	}
	sec.printf("\n")
	return nil
}

func newRateLimiter() *rate.Limiter {
	return rate.NewLimiter(rate.Every(inprocPeriod/inprocLimit), inprocLimit)
}

func newGoLimiter() (golimiter.Store, error) {
	return memorystore.New(&memorystore.Config{Tokens: inprocLimit, Interval: inprocPeriod})
}

func newThrottled() (*throttled.GCRARateLimiterCtx, error) {
	st, err := memstore.NewCtx(0)
	if err != nil {
		return nil, err
	}
	return throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerDuration(inprocLimit, inprocPeriod), MaxBurst: inprocLimit - 1})
}

// throttledErr marks throttled's compare-and-swap exhaustion, which it
// reports with an unexported error type.
func throttledErr(err error) error {
	if err != nil && strings.HasPrefix(err.Error(), "Failed to store updated rate limit data") {
		return fmt.Errorf("%w: %v", errGaveUp, err)
	}
	return err
}

// granted turns a denial into errDenied.
func granted(ok bool, err error) error {
	if err != nil {
		return err
	}
	if !ok {
		return errDenied
	}
	return nil
}

func manyKeys(cfg config, sec *section, rep *report, d time.Duration, n, seqLen int) error {
	ctx := context.Background()
	keys := inprocKeys(n)
	rng := rand.New(rand.NewPCG(1, 2))
	uniform, zipf := make([]uint32, seqLen), make([]uint32, seqLen)
	z := rand.NewZipf(rng, 1.1, 1, uint64(n-1))
	hottest := 0
	for i := range seqLen {
		uniform[i] = uint32(rng.IntN(n))
		zipf[i] = uint32(z.Uint64())
		if zipf[i] == 0 {
			hottest++
		}
	}
	policy := limiter.Policy{Limit: inprocLimit, Period: inprocPeriod}
	systems := []keyedSystem{
		{"ratelimiter `tenant.Registry.Acquire`", func() (keyed, error) {
			r, err := tenant.New(tenant.Config{Policy: policy}, nil)
			if err != nil {
				return keyed{}, err
			}
			return keyed{
				acquire: func(key string, permits int64) (bool, error) {
					dec, err := r.Acquire(ctx, key, permits)
					return dec.Allowed, err
				},
				tenants: func() int { return r.Stats().Tenants },
				close:   func() { runtime.KeepAlive(r) },
			}, nil
		}},
		{"map + sync.Mutex of x/time/rate `*Limiter`", func() (keyed, error) {
			var mu sync.Mutex
			m := make(map[string]*rate.Limiter)
			return keyed{
				acquire: func(key string, permits int64) (bool, error) {
					mu.Lock()
					l, ok := m[key]
					if !ok {
						l = newRateLimiter()
						m[key] = l
					}
					mu.Unlock()
					return l.AllowN(time.Now(), int(permits)), nil
				},
				close: func() { runtime.KeepAlive(m) },
			}, nil
		}},
		{"go-limiter memorystore", func() (keyed, error) {
			st, err := newGoLimiter()
			if err != nil {
				return keyed{}, err
			}
			return keyed{
				// Take has no count: one token per call, the prefill too.
				acquire: func(key string, _ int64) (bool, error) {
					_, _, _, ok, err := st.Take(ctx, key)
					return ok, err
				},
				close: func() { st.Close(ctx) },
			}, nil
		}},
		{"throttled GCRA on memstore", func() (keyed, error) {
			rl, err := newThrottled()
			if err != nil {
				return keyed{}, err
			}
			return keyed{
				acquire: func(key string, permits int64) (bool, error) {
					limited, _, err := rl.RateLimitCtx(ctx, key, int(permits))
					return !limited, throttledErr(err)
				},
				close: func() { runtime.KeepAlive(rl) },
			}, nil
		}},
	}
	seqs := []struct {
		name string
		seq  []uint32
	}{{"uniform", uniform}, {"Zipf", zipf}}
	modes := []int{1, runtime.GOMAXPROCS(0)}
	type roundRuns struct {
		bytesPerKey, insertNs float64
		runs                  [][]inprocRun // sequence, mode
	}
	results := make([][]roundRuns, len(systems))
	for round := range cfg.rounds {
		for i, s := range systems {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			inst, err := s.open()
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			start := time.Now()
			for _, k := range keys {
				if err := granted(inst.acquire(k, inprocPrefill)); err != nil {
					inst.close()
					return fmt.Errorf("%s: prefilling %s: %w", s.name, k, err)
				}
			}
			rr := roundRuns{insertNs: float64(time.Since(start).Nanoseconds()) / float64(n)}
			runtime.GC()
			runtime.ReadMemStats(&after)
			rr.bytesPerKey = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(n)
			for _, sq := range seqs {
				var byMode []inprocRun
				for _, g := range modes {
					r, err := inprocDrive(g, 256, d, func(j int) error {
						k := keys[sq.seq[j&(len(sq.seq)-1)]]
						if err := granted(inst.acquire(k, 1)); err != nil {
							return fmt.Errorf("%s: %w", k, err)
						}
						return nil
					})
					if err != nil {
						inst.close()
						return fmt.Errorf("%s, %s, %d goroutines: %w", s.name, sq.name, g, err)
					}
					byMode = append(byMode, r)
					cfg.progress("round %d  %d keys  %-44s %-7s G=%d %8.1f ns/op %5.2f allocs/op", round+1, n, s.name, sq.name, g, r.nsPerOp, r.allocsPerOp)
				}
				rr.runs = append(rr.runs, byMode)
			}
			if inst.tenants != nil {
				// Every tenant must still be remembered: the runs measured
				// acquisitions on known tenants, not re-insertions.
				if got := inst.tenants(); got != n {
					inst.close()
					return fmt.Errorf("%s: %d tenants remembered after the runs, want %d", s.name, got, n)
				}
			}
			inst.close()
			results[i] = append(results[i], rr)
			cfg.progress("round %d  %d keys  %-44s %6.1f B/key, insert %6.1f ns/key", round+1, n, s.name, rr.bytesPerKey, rr.insertNs)
		}
	}

	sec.printf("### %s keys\n\n", thousands(n))
	sec.printf("%s distinct IPv4 addresses as strings (\"a.b.c.d\", spread over the address space by a multiplicative hash, multicast and 0.0.0.0 skipped), the same for every system. Before measuring, a fresh instance of each system takes %s permits for every key once, in order (*insert*, ns per key; go-limiter takes 1, having no count), which keeps every bucket partly used for the whole round; *heap B/key* is the growth of the live heap (`HeapAlloc` after a GC) over that prefill, divided by %s. The keys' strings belong to the harness and are not counted: a map-based server would also keep each key's bytes (about 16 B more per key), where the registry keeps a 64-bit key. The timed runs then take one permit per call, reading keys from a precomputed sequence of %s indexes, the same sequence for every system and every run: *uniform* over the keys, or *Zipf* (math/rand/v2 `NewZipf`, s = 1.1, v = 1, ranks in key order), where the hottest key is %.1f%% of the calls. The registry's call is its public `Acquire(ctx, ip, 1)`: it parses the address, checks whether a span should be started (none is: tracing is off) and keeps the lowest-capacity index up to date, where the map baselines look the string up as it is and keep no index. After the runs the registry must still hold every key (it forgets a tenant whose bucket is full), so that the runs measured acquisitions, not re-insertions.\n\n",
		thousands(n), thousands(inprocPrefill), thousands(n), thousands(seqLen), 100*float64(hottest)/float64(seqLen))
	sec.printf("| system | heap B/key | insert ns/key | uniform serial ns/op | uniform parallel ns/op | Zipf serial ns/op | Zipf parallel ns/op | allocs/op (uniform serial) |\n|---|---|---|---|---|---|---|---|\n")
	pick := func(rs []roundRuns, sq, m int) []inprocRun {
		out := make([]inprocRun, len(rs))
		for i, r := range rs {
			out[i] = r.runs[sq][m]
		}
		return out
	}
	for i, s := range systems {
		rs := results[i]
		bytes, inserts := make([]float64, len(rs)), make([]float64, len(rs))
		for j, r := range rs {
			bytes[j], inserts[j] = r.bytesPerKey, r.insertNs
		}
		sec.printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", s.name, stat(bytes, "%.1f"), stat(inserts, "%.0f"),
			nsCell(pick(rs, 0, 0), "%.0f"), nsCell(pick(rs, 0, 1), "%.0f"),
			nsCell(pick(rs, 1, 0), "%.0f"), nsCell(pick(rs, 1, 1), "%.0f"),
			stat(runField(pick(rs, 0, 0), allocsOf), "%.2f"))
	}
	sec.printf("\n")
	for sq, s := range seqs {
		for m, mode := range []string{"serial", "parallel"} {
			xs := ratios(pick(results[1], sq, m), pick(results[0], sq, m)) // their ns/op ÷ ours
			inprocLine(sec, rep, fmt.Sprintf("%s keys, %s, %s: ratelimiter ÷ map + mutex, calls/s", thousands(n), s.name, mode), xs, "%.2f×", median(xs) >= 2, "≥ 2×")
		}
	}
	bytes := make([]float64, len(results[0]))
	for j, r := range results[0] {
		bytes[j] = r.bytesPerKey
	}
	inprocLine(sec, rep, fmt.Sprintf("%s keys: ratelimiter heap per key", thousands(n)), bytes, "%.1f B", median(bytes) <= 64, "≤ 64 B")
	sec.printf("\n")
	return nil
}

// inprocKeys returns n distinct IPv4 addresses that the registry accepts,
// scattered over the address space, sharing one backing string so that the
// garbage collector sees one object rather than n.
func inprocKeys(n int) []string {
	var b strings.Builder
	ends := make([]int, 0, n)
	for i := uint32(1); len(ends) < n; i++ {
		x := i * 2654435761 // odd: a bijection
		a := netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
		if a.IsMulticast() || a.IsUnspecified() {
			continue
		}
		b.WriteString(a.String())
		ends = append(ends, b.Len())
	}
	all := b.String()
	keys := make([]string, n)
	start := 0
	for i, end := range ends {
		keys[i], start = all[start:end], end
	}
	return keys
}

// inprocDrive calls op with consecutive indexes from g goroutines, each
// claiming chunk indexes at a time, until d has passed. It counts the calls
// that fail with errGaveUp and stops at any other error.
func inprocDrive(g, chunk int, d time.Duration, op func(j int) error) (inprocRun, error) {
	var (
		next, ops atomic.Int64
		failed    atomic.Int64
		stop      atomic.Bool
		errOnce   sync.Once
		firstErr  error
		wg        sync.WaitGroup
		ms        runtime.MemStats
	)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	mallocs := ms.Mallocs
	start := time.Now()
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	for range g {
		wg.Go(func() {
			n := 0
			defer func() { ops.Add(int64(n)) }()
			for !stop.Load() {
				base := int(next.Add(int64(chunk))) - chunk
				for j := base; j < base+chunk; j++ {
					if err := op(j); errors.Is(err, errGaveUp) {
						failed.Add(1)
					} else if err != nil {
						errOnce.Do(func() { firstErr = err })
						stop.Store(true)
						return
					}
					n++
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&ms)
	if firstErr != nil {
		return inprocRun{}, firstErr
	}
	n := float64(ops.Load())
	if n == 0 {
		return inprocRun{}, errors.New("no call completed")
	}
	return inprocRun{nsPerOp: float64(elapsed.Nanoseconds()) / n, allocsPerOp: float64(ms.Mallocs-mallocs) / n, failed: float64(failed.Load()) / n}, nil
}

// thousands writes n with thousands separators: 1,000,000.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func nsOf(r inprocRun) float64     { return r.nsPerOp }
func failedOf(r inprocRun) float64 { return r.failed }

// nsCell is the ns/op of rs, with the share of failed calls when any failed.
func nsCell(rs []inprocRun, format string) string {
	c := stat(runField(rs, nsOf), format)
	if xs := runField(rs, failedOf); slices.Max(xs) > 0 {
		for i := range xs {
			xs[i] *= 100
		}
		c += "; failed: " + stat(xs, "%.2f%%")
	}
	return c
}
func allocsOf(r inprocRun) float64 { return r.allocsPerOp }

func runField(rs []inprocRun, f func(inprocRun) float64) []float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return xs
}

// ratios is a's ns/op over b's, round by round: how many times faster b is.
func ratios(a, b []inprocRun) []float64 {
	xs := make([]float64, len(a))
	for i := range a {
		xs[i] = a[i].nsPerOp / b[i].nsPerOp
	}
	return xs
}

// inprocLine writes one headline figure, with its target's verdict when
// target is set, to the section and the report's summary.
func inprocLine(sec *section, rep *report, text string, xs []float64, format string, met bool, target string) {
	v := fmt.Sprintf("%s: %s", text, stat(xs, format))
	if target != "" {
		v += fmt.Sprintf(" (target %s: %s)", target, verdict(met))
	}
	sec.printf("- %s\n", v)
	rep.facts = append(rep.facts, "In process, "+v)
}
