package redis

import (
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Library returns the Lua library the limiter scripts share (lua/lib.lua):
// the exact GCRA and sliding-log arithmetic, within 2^53, on states kept as
// this package keeps them (GCRA's TAT as the string "µs units", a sliding
// log as a sorted set of running totals). A script cannot load another, so
// a script of another package that needs the arithmetic starts with this
// text, then a newline, then its own code. Its functions read a policy from
// the array DefinitionValues returns.
func Library() string { return libLua }

// definitionOrder is the order in which the scripts read a definition: the
// library's gcra_def and log_def index this array.
var definitionOrder = []string{
	fieldAlgorithm, fieldLimit, fieldBurst,
	fieldM, fieldPA, fieldPB, fieldTA, fieldTB,
	fieldPW, fieldPR, fieldPU, fieldMaxE,
}

// DefinitionValues returns policy p as the array of 12 decimal strings the
// library's gcra_def and log_def read (d[1] to d[12] in Lua): algorithm,
// limit, burst, then GCRA's m, pa, pb, ta, tb and the sliding log's pw, pr,
// pu, maxe, all derived with 64- and 128-bit integers so that the scripts
// never handle a value beyond 2^53. The fields the algorithm does not use
// are "0". p must be valid (see limiter.Policy.Validate); it is normalized
// here.
func DefinitionValues(p limiter.Policy) []string {
	pairs := definitionArgs(p.Normalize())
	byField := make(map[string]string, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		byField[pairs[i]] = pairs[i+1]
	}
	vals := make([]string, len(definitionOrder))
	for i, f := range definitionOrder {
		vals[i] = "0"
		if v, ok := byField[f]; ok {
			vals[i] = v
		}
	}
	return vals
}

// AcquireCall returns what Store.Acquire sends to take permits from the
// limiter name under key prefix: the script's source (run by its SHA-1, as
// EVALSHA), its keys and its arguments. It lets a benchmark replay the very
// call the service makes, e.g. with redis-benchmark, to measure what Redis
// itself can decide per second.
func AcquireCall(prefix, name string, permits int64) (script string, keys, args []string) {
	s := &Store{prefix: prefix}
	return acquireSource, s.keys(name), acquireArgs([]int64{permits}, "")
}

// DecisionOf reads the decision to take permits as the scripts reply with
// it: the first eight integers of f are allowed, remaining, limit,
// retry_us, retry_ns, reset_us, reset_ns and exceeds_capacity (durations
// as microseconds plus nanoseconds).
func DecisionOf(f []int64, permits int64) limiter.Decision {
	return limiter.Decision{
		Allowed:         f[0] == 1,
		Permits:         permits,
		Remaining:       f[1],
		Limit:           f[2],
		RetryAfter:      Duration(f[3], f[4]),
		ResetAfter:      Duration(f[5], f[6]),
		ExceedsCapacity: f[7] == 1,
	}
}

// DecisionFields is the number of fields of one decision in the acquire
// script's reply.
const DecisionFields = 8

// Duration is us microseconds plus ns nanoseconds, as the scripts report
// spans: whole nanoseconds of a span may exceed 2^53, beyond what a Lua
// number holds exactly.
func Duration(us, ns int64) time.Duration {
	return time.Duration(us)*time.Microsecond + time.Duration(ns)
}
