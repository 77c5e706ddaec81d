package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/keystest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// TestReservationsAcrossRedefinitions drives one limiter, plain or keyed,
// through random takes, reservations, settlements and cancellations while
// its definition is replaced, deleted and created again, on a manual
// clock. Each definition keeps a ledger of what it granted, as its
// algorithm records it (a settlement of one of its own reservations gives
// back what was not spent: on GCRA a grant of minus that many, on the
// sliding log the newest grants), and the ledger of every definition must
// keep its contract (keystest.Violation). A reservation made on one
// definition and settled on another would give the later one room that
// its ledger does not hold, and grant past its limit.
func TestReservationsAcrossRedefinitions(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog} {
		for _, keyed := range []bool{false, true} {
			for seed := range uint64(20) {
				t.Run(fmt.Sprintf("%s/keyed=%v/seed=%d", alg, keyed, seed), func(t *testing.T) {
					runRedefinitions(t, alg, keyed, seed, 400)
				})
			}
		}
	}
}

// ledger is what one definition granted.
type ledger struct {
	p      limiter.Policy
	grants []limiter.Grant
}

// refund gives back n permits at now as the definition's algorithm does.
func (l *ledger) refund(now, n int64) {
	if l.p.Algorithm == limiter.GCRA {
		l.grants = append(l.grants, limiter.Grant{At: now, N: -n})
		return
	}
	for i := len(l.grants) - 1; i >= 0 && n > 0; i-- {
		k := min(l.grants[i].N, n)
		l.grants[i].N -= k
		n -= k
	}
}

func runRedefinitions(t *testing.T, alg limiter.Algorithm, keyed bool, seed uint64, steps int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0x2e5e))
	c := clocktest.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	s := memory.New(c.Limiter(), 0)
	const name = "r"
	key := ""
	if keyed {
		key = "k"
	}
	period := time.Second
	var (
		ledgers []*ledger // one per definition, the last in force unless deleted
		live    bool
	)
	define := func() {
		p := limiter.Policy{Limit: 3 + rng.Int64N(6), Period: period, Algorithm: alg}.Normalize()
		if _, err := s.Put(ctx, limiter.Definition{Name: name, Policy: p, Keyed: keyed}); err != nil {
			t.Fatal(err)
		}
		if live && ledgers[len(ledgers)-1].p == p {
			return // an identical definition keeps its state
		}
		ledgers, live = append(ledgers, &ledger{p: p}), true
	}
	type held struct {
		id     string
		def    int // the ledger of the definition it was made on
		n      int64
		settle bool
	}
	var open []held
	now := func() int64 { return c.Limiter().Now() }
	define()
	for step := range steps {
		switch r := rng.IntN(20); {
		case r < 6 && live:
			n := 1 + rng.Int64N(4)
			v, err := s.Decide(ctx, []limiter.Item{{Name: name, Key: key, Permits: n}}, limiter.Take, "")
			if err != nil {
				t.Fatalf("step %d: take %d: %v", step, n, err)
			}
			if v.Allowed {
				l := ledgers[len(ledgers)-1]
				l.grants = append(l.grants, limiter.Grant{At: now(), N: n})
			}
		case r < 10 && live:
			n := 1 + rng.Int64N(4)
			v, err := s.Reserve(ctx, []limiter.Item{{Name: name, Key: key, Permits: n}}, time.Hour, "")
			if err != nil {
				t.Fatalf("step %d: reserve %d: %v", step, n, err)
			}
			if v.Allowed {
				l := ledgers[len(ledgers)-1]
				l.grants = append(l.grants, limiter.Grant{At: now(), N: n})
				open = append(open, held{id: v.Reservation, def: len(ledgers) - 1, n: n})
			}
		case r < 14 && len(open) > 0:
			i := rng.IntN(len(open))
			h := open[i]
			var actual []limiter.Item // a cancel
			spent := int64(0)
			if rng.IntN(2) == 0 {
				spent = rng.Int64N(h.n + 1)
				actual = []limiter.Item{{Name: name, Key: key, Permits: spent}}
			}
			_, err := s.Settle(ctx, h.id, actual, "")
			if !live {
				// The limiter is gone: the settlement is refused, and
				// the reservation waits for its TTL.
				if err == nil {
					t.Fatalf("step %d: settle %s of a deleted limiter: no error", step, h.id)
				}
				continue
			}
			if err != nil {
				t.Fatalf("step %d: settle %s: %v", step, h.id, err)
			}
			open = slices.Delete(open, i, i+1)
			if h.def == len(ledgers)-1 {
				ledgers[h.def].refund(now(), h.n-spent)
			}
		case r < 16:
			c.Advance(time.Duration(rng.Int64N(int64(period) / 2)))
		case r < 18:
			define() // the same or another policy
		case r < 19 && live:
			if err := s.Delete(ctx, name); err != nil {
				t.Fatal(err)
			}
			live = false
		default:
			if !live {
				define()
			}
		}
	}
	for i, l := range ledgers {
		if err := keystest.Violation(l.p, l.grants); err != nil {
			t.Errorf("definition %d of %d: %v", i+1, len(ledgers), err)
		}
	}
}
