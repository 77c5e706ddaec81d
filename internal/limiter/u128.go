package limiter

import "math/bits"

// u128 is an unsigned 128-bit integer. GCRA works in units of 1/limit of a
// nanosecond so that no rounding ever happens; products such as
// burst × period reach 2^85 at the documented edges, beyond uint64.
type u128 struct{ hi, lo uint64 }

func mul64(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

func (x u128) add(y u128) u128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	hi, _ := bits.Add64(x.hi, y.hi, c)
	return u128{hi, lo}
}

func (x u128) addSmall(y uint64) u128 {
	lo, c := bits.Add64(x.lo, y, 0)
	return u128{x.hi + c, lo}
}

// sub returns x-y; callers guarantee x >= y.
func (x u128) sub(y u128) u128 {
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	hi, _ := bits.Sub64(x.hi, y.hi, b)
	return u128{hi, lo}
}

func (x u128) cmp(y u128) int {
	switch {
	case x.hi < y.hi:
		return -1
	case x.hi > y.hi:
		return 1
	case x.lo < y.lo:
		return -1
	case x.lo > y.lo:
		return 1
	}
	return 0
}

func (x u128) isZero() bool { return x.hi == 0 && x.lo == 0 }

// divmod returns x/d and x%d. A quotient that does not fit in 64 bits
// saturates to MaxUint64 with remainder 0.
func (x u128) divmod(d uint64) (q, r uint64) {
	if x.hi >= d {
		return ^uint64(0), 0
	}
	return bits.Div64(x.hi, x.lo, d)
}

// divCeil returns ⌈x/d⌉, saturating like divmod.
func (x u128) divCeil(d uint64) uint64 {
	q, r := x.divmod(d)
	if r != 0 && q != ^uint64(0) {
		q++
	}
	return q
}
