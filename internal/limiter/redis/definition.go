package redis

import (
	"fmt"
	"math/bits"
	"strconv"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The fields of a definition hash. The first four are the policy, as Get
// returns it; the others are constants the scripts need, derived from the
// policy here with 64- and 128-bit integers so that the scripts, whose
// numbers are doubles, never handle a value beyond 2^53.
const (
	fieldLimit     = "limit"     // permits per period
	fieldPeriod    = "period"    // nanoseconds
	fieldAlgorithm = "algorithm" // limiter.GCRA or limiter.SlidingLog
	fieldBurst     = "burst"     // GCRA's bucket size; 0 for a sliding log
	fieldGroup     = "group"     // the limiter's group; absent for none
	fieldMaxKeys   = "maxkeys"   // a keyed limiter's most keys it remembers; absent for a plain one (see keyed.go)
	// The generation of the definition: a new one for every definition
	// written, so that what outlives a decision (a reservation, a keyed
	// limiter's keys' states) is never applied to a limiter redefined
	// since. Absent from a plain limiter defined by an earlier version.
	fieldGen = "gen"

	// GCRA counts in units of 1/limit ns, held by the scripts as a*m + b
	// with m units = 1µs and 0 <= b < m.
	fieldM  = "m"  // 1000 × limit
	fieldPA = "pa" // period ÷ m: one permit's cost, in whole µs
	fieldPB = "pb" // period mod m: the rest, in units
	fieldTA = "ta" // burst × period ÷ m: the bucket's tolerance, in whole µs
	fieldTB = "tb" // burst × period mod m: the rest, in units

	// A sliding log works in microseconds.
	fieldPW   = "pw"   // ⌊period / 1µs⌋
	fieldPR   = "pr"   // period mod 1µs, in nanoseconds
	fieldPU   = "pu"   // ⌈period / 1µs⌉: a grant at t has left the window at t+pu
	fieldMaxE = "maxe" // most entries a log holds: min(limit, limiter.MaxLogEntries)
)

// definitionArgs returns p, which must be valid and normalized, as the
// field, value pairs of its definition hash: the policy first, in the order
// put.lua compares it, then the derived constants.
func definitionArgs(p limiter.Policy) []string {
	limit, period := uint64(p.Limit), uint64(p.Period)
	u := strconv.FormatUint
	args := []string{
		fieldLimit, u(limit, 10),
		fieldPeriod, u(period, 10),
		fieldAlgorithm, string(p.Algorithm),
		fieldBurst, u(uint64(p.Burst), 10),
	}
	if p.Algorithm == limiter.GCRA {
		m := 1000 * limit
		pa, pb := period/m, period%m
		// burst × period < 2^85, and its quotient by m (≤ period/1000 µs)
		// fits in 64 bits, so Div64 cannot overflow.
		hi, lo := bits.Mul64(uint64(p.Burst), period)
		ta, tb := bits.Div64(hi, lo, m)
		return append(args,
			fieldM, u(m, 10), fieldPA, u(pa, 10), fieldPB, u(pb, 10),
			fieldTA, u(ta, 10), fieldTB, u(tb, 10))
	}
	pw, pr := period/1000, period%1000
	pu := pw
	if pr != 0 {
		pu++
	}
	return append(args,
		fieldPW, u(pw, 10), fieldPR, u(pr, 10), fieldPU, u(pu, 10),
		fieldMaxE, u(uint64(min(p.Limit, limiter.MaxLogEntries)), 10))
}

// policyFields are the fields of the policy, in the order parsePolicy
// expects; definitionFields are the fields Get reads: the policy, then a
// keyed limiter's bound of keys (absent for a plain limiter).
var (
	policyFields     = []string{fieldLimit, fieldPeriod, fieldAlgorithm, fieldBurst}
	definitionFields = append(policyFields[:len(policyFields):len(policyFields)], fieldMaxKeys)
)

// parsePolicy reads the policy from the values of policyFields.
func parsePolicy(vals []string) (limiter.Policy, error) {
	if len(vals) != len(policyFields) {
		return limiter.Policy{}, fmt.Errorf("definition has %d policy fields, want %d", len(vals), len(policyFields))
	}
	limit, err1 := strconv.ParseInt(vals[0], 10, 64)
	period, err2 := strconv.ParseInt(vals[1], 10, 64)
	burst, err3 := strconv.ParseInt(vals[3], 10, 64)
	p := limiter.Policy{Limit: limit, Period: time.Duration(period), Algorithm: limiter.Algorithm(vals[2]), Burst: burst}
	if err1 != nil || err2 != nil || err3 != nil {
		return limiter.Policy{}, fmt.Errorf("malformed definition %q", vals)
	}
	if err := p.Validate(); err != nil {
		// Not wrapped: a corrupt stored definition is the backend's fault,
		// not the caller's.
		return limiter.Policy{}, fmt.Errorf("stored definition: %v", err)
	}
	return p.Normalize(), nil
}
