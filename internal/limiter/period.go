package limiter

import (
	"fmt"
	"time"
)

// ParsePeriod parses a period written as a Go duration ("100s", "1m",
// "1h30m", "8760h"; units ns, us, µs, ms, s, m, h) and checks that it lies
// between MinPeriod and MaxPeriod. The error wraps ErrInvalidPolicy.
func ParsePeriod(s string) (time.Duration, error) {
	if len(s) > 64 {
		return 0, fmt.Errorf("%w: period %q is too long", ErrInvalidPolicy, truncate(s, 64))
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%w: period %q is not a duration such as \"100s\", \"1m\" or \"1h30m\"", ErrInvalidPolicy, s)
	}
	if d < MinPeriod || d > MaxPeriod {
		return 0, fmt.Errorf("%w: period must be between %s and %s, got %q", ErrInvalidPolicy, MinPeriod, MaxPeriod, s)
	}
	return d, nil
}

// FormatPeriod writes d the way ParsePeriod reads it, in Go's canonical form
// ("1m40s" for 100 seconds).
func FormatPeriod(d time.Duration) string { return d.String() }
