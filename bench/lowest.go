package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

func lowestVsScan(cfg config, sec *section, rep *report, d time.Duration, ns []int) error {
	ctx := context.Background()
	policy := limiter.Policy{Limit: lowestLimit, Period: inprocPeriod}
	t0 := time.Unix(1_700_000_000, 0)
	query := t0.Add(time.Second)
	type pair struct {
		r    *tenant.Registry
		mu   sync.Mutex
		lims map[string]*rate.Limiter
	}
	pairs := make([]*pair, len(ns))
	for i, n := range ns {
		var at atomic.Int64
		r, err := tenant.New(tenant.Config{Policy: policy}, limiter.NewClockAt(time.Unix(0, 0), func() time.Duration { return time.Duration(at.Load()) }))
		if err != nil {
			return err
		}
		p := &pair{r: r, lims: make(map[string]*rate.Limiter, n)}
		rng := rand.New(rand.NewPCG(3, 4))
		for j, k := range inprocKeys(n) {
			now := t0.Add(time.Duration(j))
			permits := 1 + rng.Int64N(100)
			at.Store(now.UnixNano())
			dec, err := r.Acquire(ctx, k, permits)
			if err := granted(dec.Allowed, err); err != nil {
				return fmt.Errorf("registry of %d: %s: %w", n, k, err)
			}
			l := rate.NewLimiter(rate.Every(policy.Period/lowestLimit), lowestLimit)
			if !l.AllowN(now, int(permits)) {
				return fmt.Errorf("map of %d: %s: %w", n, k, errDenied)
			}
			p.lims[k] = l
		}
		at.Store(query.UnixNano())
		// The baseline must give the index's answer.
		es, err := r.Lowest(ctx, 10)
		if err != nil {
			return err
		}
		var got []int64
		for _, e := range es {
			got = append(got, e.Remaining)
		}
		want := scanLowest(&p.mu, p.lims, query, 10)
		if !slices.Equal(got, want) {
			return fmt.Errorf("%d tenants: Lowest gives permits left %v, the scan %v", n, got, want)
		}
		pairs[i] = p
	}
	lowest := make([][]inprocRun, len(ns))
	scan := make([][]inprocRun, len(ns))
	for round := range cfg.rounds {
		for i, p := range pairs {
			r, err := inprocDrive(1, 1, d, func(int) error {
				es, err := p.r.Lowest(ctx, 10)
				if err == nil && len(es) != 10 {
					err = fmt.Errorf("%d entries, want 10", len(es))
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("Lowest of %d: %w", ns[i], err)
			}
			lowest[i] = append(lowest[i], r)
			s, err := inprocDrive(1, 1, d, func(int) error {
				if got := scanLowest(&p.mu, p.lims, query, 10); len(got) != 10 {
					return fmt.Errorf("%d entries, want 10", len(got))
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("scan of %d: %w", ns[i], err)
			}
			scan[i] = append(scan[i], s)
			cfg.progress("round %d  lowest 10 of %7d: Lowest %9.2f µs  scan %11.2f µs", round+1, ns[i], r.nsPerOp/1e3, s.nsPerOp/1e3)
		}
	}
	sec.printf("### Lowest 10 against a full scan\n\n")
	sec.printf("Built once, before the rounds: a registry of n tenants (%d permits per %s; tenant j took 1 to 100 permits, at random, at t0 + j ns) answers `Registry.Lowest(ctx, 10)` at t0 + 1 s (its clock is fixed there), against what a map + mutex user would write: under the mutex, read `TokensAt(t0 + 1 s)` of every `*rate.Limiter` of a map filled the same way and keep the 10 lowest. Both give the same permits left (checked before timing). One goroutine; µs per query.\n\n",
		lowestLimit, limiter.FormatPeriod(policy.Period))
	sec.printf("| tenants | `Registry.Lowest` µs | map + mutex scan µs | scan ÷ `Lowest`, time |\n|---|---|---|---|\n")
	us := func(rs []inprocRun) []float64 {
		xs := runField(rs, nsOf)
		for i := range xs {
			xs[i] /= 1e3
		}
		return xs
	}
	for i, n := range ns {
		sec.printf("| %s | %s | %s | %s |\n", thousands(n), stat(us(lowest[i]), "%.2f"), stat(us(scan[i]), "%.1f"), stat(ratios(scan[i], lowest[i]), "%.0f×"))
	}
	first, last := 0, len(ns)-1
	sec.printf("\nFrom %s to %s tenants (%d× as many), `Lowest` took %.1f× as long and the scan %.1f× (medians).\n\n",
		thousands(ns[first]), thousands(ns[last]), ns[last]/ns[first],
		median(us(lowest[last]))/median(us(lowest[first])), median(us(scan[last]))/median(us(scan[first])))
	xs := us(lowest[last])
	inprocLine(sec, rep, fmt.Sprintf("lowest 10 of %s tenants: `Registry.Lowest`", thousands(ns[last])), xs, "%.2f µs", median(xs) <= 10, "≤ 10 µs")
	inprocLine(sec, rep, fmt.Sprintf("lowest 10 of %s tenants: map + mutex full scan ÷ `Registry.Lowest`, time per query", thousands(ns[last])), ratios(scan[last], lowest[last]), "%.0f×", true, "")
	return nil
}

// scanLowest returns the whole permits left of the k limiters of lims with
// the fewest tokens at now, fewest first.
func scanLowest(mu *sync.Mutex, lims map[string]*rate.Limiter, now time.Time, k int) []int64 {
	low := make([]float64, 0, k+1)
	mu.Lock()
	for _, l := range lims {
		t := l.TokensAt(now)
		if len(low) == k && t >= low[k-1] {
			continue
		}
		i, _ := slices.BinarySearch(low, t)
		low = slices.Insert(low, i, t)
		if len(low) > k {
			low = low[:k]
		}
	}
	mu.Unlock()
	out := make([]int64, len(low))
	for i, t := range low {
		out[i] = int64(t)
	}
	return out
}
