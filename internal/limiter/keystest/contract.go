package keystest

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Violation checks the documented guarantee of policy p on grants, the
// permits one bucket granted (or was charged) at their instants, in any
// order: the sliding log never grants more than Limit in any window of
// length Period; GCRA never more than Burst + ⌊w·Limit/Period⌋ in any
// interval of length w. It returns the first excess found, or nil. It is
// brute force, quadratic in the grants.
func Violation(p limiter.Policy, grants []limiter.Grant) error {
	p = p.Normalize()
	gs := slices.SortedStableFunc(slices.Values(grants), func(a, b limiter.Grant) int { return cmp.Compare(a.At, b.At) })
	for j := range gs {
		var sum int64
		for i := j; i >= 0; i-- {
			sum += gs[i].N
			w := gs[j].At - gs[i].At
			bound := p.Burst + w*p.Limit/int64(p.Period)
			if p.Algorithm == limiter.SlidingLog {
				if w >= int64(p.Period) {
					break
				}
				bound = p.Limit
			}
			if sum > bound {
				return fmt.Errorf("grants %d..%d of %d: %d permits within %dns, the contract of %+v allows %d", i, j, len(gs), sum, w, p, bound)
			}
		}
	}
	return nil
}
