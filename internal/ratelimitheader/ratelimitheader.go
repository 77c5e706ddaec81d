// Package ratelimitheader writes the rate-limit header fields of
// draft-ietf-httpapi-ratelimit-headers-11, which every answer of the
// service that states a limit carries, whatever its protocol:
//
//	RateLimit-Policy: "<name>";q=<limit>;w=<period>
//	RateLimit: "<name>";r=<remaining>;t=<reset>
//
// The draft counts time in whole seconds only, so every duration is
// rounded up: a sub-second or fractional period advertises a slightly
// stricter policy than the real one, never a looser one, and a caller that
// waits as long as it is told never comes back too early.
package ratelimitheader

import (
	"strconv"
	"time"
)

// Header field names, as the draft spells them.
const (
	PolicyField = "RateLimit-Policy"
	Field       = "RateLimit"
)

// CeilUnits is d in whole units, rounded up; 0 for d <= 0.
func CeilUnits(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/unit) + 1
}

// Seconds is d in whole seconds, rounded up.
func Seconds(d time.Duration) int64 { return CeilUnits(d, time.Second) }

// appendString appends s as a Structured Field String, leaving out the
// characters it cannot hold.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\', c)
		} else if c >= 0x20 && c < 0x7f {
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// Policy is the RateLimit-Policy value of a limit; w is left out when the
// period is unknown (0).
func Policy(name string, period time.Duration, limit int64) string {
	b := make([]byte, 0, len(name)+40)
	b = appendString(b, name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, limit, 10)
	if period > 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, max(1, Seconds(period)), 10)
	}
	return string(b)
}

// Value is the RateLimit value of a limit with remaining permits that is
// full again after reset.
func Value(name string, remaining int64, reset time.Duration) string {
	var buf [192]byte
	return string(AppendValue(buf[:0], name, remaining, reset))
}

// AppendValue appends Value(name, remaining, reset) to b.
func AppendValue(b []byte, name string, remaining int64, reset time.Duration) []byte {
	b = appendString(b, name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, remaining, 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, Seconds(reset), 10)
}
