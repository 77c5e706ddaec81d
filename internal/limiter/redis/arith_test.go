package redis

import (
	"context"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The scripts' arithmetic primitives, run on the server in batches and
// compared with math/big at and around their bounds, where a double would
// round if any intermediate exceeded 2^53.

var (
	mulDivModHarness = rueidis.NewLuaScript(libLua + `
local out = {}
for i = 1, #ARGV, 3 do
  local q, r = muldivmod(tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
  out[#out + 1] = q
  out[#out + 1] = r
end
return out`)
	remainingHarness = rueidis.NewLuaScript(libLua + `
local g = {limit = tonumber(ARGV[1]), burst = tonumber(ARGV[2]), m = tonumber(ARGV[3]),
  pa = tonumber(ARGV[4]), pb = tonumber(ARGV[5]), ta = tonumber(ARGV[6]), tb = tonumber(ARGV[7])}
local out = {}
for i = 8, #ARGV, 2 do
  out[#out + 1] = gcra_remaining(g, tonumber(ARGV[i]), tonumber(ARGV[i + 1]))
end
return out`)
)

func testMulDivMod(t *testing.T, c rueidis.Client) {
	rng := rand.New(rand.NewPCG(19, 23))
	const cases = 20_000
	type tc struct{ n, y, m int64 }
	var all []tc
	for range cases {
		m := []int64{1, 2, 1000, 4096, 999_999_999_999, 1_000_000_000_000, 1 + rng.Int64N(1_000_000_000_000)}[rng.IntN(7)]
		y := []int64{0, 1, m - 1, rng.Int64N(m)}[rng.IntN(4)]
		n := []int64{0, 1, limiter.MaxLimit, limiter.MaxLimit + 1, 1<<36 - 1, rng.Int64N(limiter.MaxLimit + 2)}[rng.IntN(6)]
		all = append(all, tc{n, max(min(y, m-1), 0), m})
	}
	for start := 0; start < len(all); start += 1000 {
		batch := all[start:min(start+1000, len(all))]
		args := make([]string, 0, 3*len(batch))
		for _, b := range batch {
			args = append(args, strconv.FormatInt(b.n, 10), strconv.FormatInt(b.y, 10), strconv.FormatInt(b.m, 10))
		}
		got, err := mulDivModHarness.Exec(context.Background(), c, []string{"{h}"}, args).AsIntSlice()
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range batch {
			var q, r big.Int
			q.QuoRem(new(big.Int).Mul(big.NewInt(b.n), big.NewInt(b.y)), big.NewInt(b.m), &r)
			if got[2*i] != q.Int64() || got[2*i+1] != r.Int64() {
				t.Fatalf("muldivmod(%d, %d, %d): got %d, %d, want %d, %d", b.n, b.y, b.m, got[2*i], got[2*i+1], &q, &r)
			}
		}
	}
	t.Logf("%d products compared", len(all))
}

// testGCRARemaining checks floor((tolerance - backlog) / period) where the
// floating-point estimate is most likely off: backlogs that leave an exact
// multiple of the period, one unit more or less, and random ones, for
// policies at the bounds.
func testGCRARemaining(t *testing.T, c rueidis.Client) {
	rng := rand.New(rand.NewPCG(29, 31))
	compared := 0
	for _, p := range gcraPolicies(rng, 200) {
		p = p.Normalize()
		args := definitionArgs(p)
		field := map[string]string{}
		for i := 0; i < len(args); i += 2 {
			field[args[i]] = args[i+1]
		}
		period, burst := big.NewInt(int64(p.Period)), big.NewInt(p.Burst)
		m := big.NewInt(1000 * p.Limit)
		tol := new(big.Int).Mul(burst, period)
		var backlogs []*big.Int
		for range 40 {
			k := rng.Int64N(p.Burst + 1)
			exact := new(big.Int).Sub(tol, new(big.Int).Mul(big.NewInt(k), period)) // leaves k periods
			for _, d := range []int64{-1, 0, 1} {
				if b := new(big.Int).Add(exact, big.NewInt(d)); b.Sign() >= 0 {
					backlogs = append(backlogs, b)
				}
			}
			// A random backlog up to just past the tolerance.
			whole := rng.Int64N(new(big.Int).Quo(tol, m).Int64() + 1)
			backlogs = append(backlogs, new(big.Int).Add(new(big.Int).Mul(big.NewInt(whole), m), big.NewInt(rng.Int64N(m.Int64()))))
		}
		harnessArgs := []string{field[fieldLimit], field[fieldBurst], field[fieldM], field[fieldPA], field[fieldPB], field[fieldTA], field[fieldTB]}
		for _, b := range backlogs {
			var a, r big.Int
			a.QuoRem(b, m, &r)
			harnessArgs = append(harnessArgs, a.String(), r.String())
		}
		got, err := remainingHarness.Exec(context.Background(), c, []string{"{h}"}, harnessArgs).AsIntSlice()
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range backlogs {
			want := int64(0)
			if b.Cmp(tol) < 0 {
				want = new(big.Int).Quo(new(big.Int).Sub(tol, b), period).Int64()
			}
			if got[i] != want {
				t.Fatalf("policy %+v, backlog %s units: remaining %d, want %d", p, b, got[i], want)
			}
			compared++
		}
	}
	t.Logf("%d remaining counts compared", compared)
}
