package keystest

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// ReservationBackend is a JointBackend that RunReservations also deletes
// limiters from and reserves and settles on, at the instants it chooses.
type ReservationBackend interface {
	JointBackend
	Delete(name string) error
	Reserve(items []limiter.Item, nowUS int64) (limiter.Verdict, error)
	Settle(id string, actual []limiter.Item, nowUS int64) (limiter.Verdict, error)
}

// RunReservations drives one limiter of algorithm alg, plain or keyed,
// through random takes, reservations, settlements and cancellations while
// its definition is replaced, deleted and created again. Each definition
// keeps a ledger of what its callers were granted and used: a reservation
// counts at the instant it was granted for what its settlement says was
// spent (nothing when cancelled). The ledger of every definition must
// keep its contract (Violation). A settlement that gave back permits which
// had already drained from the bucket or left the window, or that gave a
// later definition back what an earlier one had reserved, would let the
// bucket grant past its limit.
func RunReservations(t *testing.T, b ReservationBackend, alg limiter.Algorithm, keyed bool, seed uint64, steps int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x2e5e))
	const name = "r"
	key := ""
	if keyed {
		key = "k"
	}
	const periodUS = int64(time.Second / time.Microsecond)
	type ledger struct {
		p      limiter.Policy
		grants []limiter.Grant
	}
	var (
		ledgers []*ledger // one per definition, the last in force unless deleted
		live    bool
		now     = b.Start()
	)
	define := func() {
		p := limiter.Policy{Limit: 3 + rng.Int64N(6), Period: time.Duration(periodUS) * time.Microsecond, Algorithm: alg}.Normalize()
		if err := b.Put(limiter.Definition{Name: name, Policy: p, Keyed: keyed}); err != nil {
			t.Fatal(err)
		}
		if live && ledgers[len(ledgers)-1].p == p {
			return // an identical definition keeps its state
		}
		ledgers, live = append(ledgers, &ledger{p: p}), true
	}
	type held struct {
		id    string
		def   int // the ledger of the definition it was made on
		grant int // its grant in that ledger
		n     int64
	}
	var open []held
	item := func(n int64) []limiter.Item { return []limiter.Item{{Name: name, Key: key, Permits: n}} }
	define()
	for step := range steps {
		switch r := rng.IntN(20); {
		case r < 6 && live:
			n := 1 + rng.Int64N(4)
			v, err := b.Decide(item(n), limiter.Take, now)
			if err != nil {
				t.Fatalf("step %d: take %d: %v", step, n, err)
			}
			if v.Allowed {
				l := ledgers[len(ledgers)-1]
				l.grants = append(l.grants, limiter.Grant{At: now * 1000, N: n})
			}
		case r < 10 && live:
			n := 1 + rng.Int64N(4)
			v, err := b.Reserve(item(n), now)
			if err != nil {
				t.Fatalf("step %d: reserve %d: %v", step, n, err)
			}
			if v.Allowed {
				l := ledgers[len(ledgers)-1]
				l.grants = append(l.grants, limiter.Grant{At: now * 1000, N: n})
				open = append(open, held{id: v.Reservation, def: len(ledgers) - 1, grant: len(l.grants) - 1, n: n})
			}
		case r < 14 && len(open) > 0:
			i := rng.IntN(len(open))
			h := open[i]
			var actual []limiter.Item // a cancel
			spent := int64(0)
			if rng.IntN(2) == 0 {
				spent = rng.Int64N(h.n + 1)
				actual = item(spent)
			}
			_, err := b.Settle(h.id, actual, now)
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
			ledgers[h.def].grants[h.grant].N = spent
		case r < 15:
			now += rng.Int64N(periodUS / 2)
		case r < 16:
			now += periodUS + rng.Int64N(periodUS/4) // reservations drain
		case r < 18:
			define() // the same or another policy
		case r < 19 && live:
			if err := b.Delete(name); err != nil {
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
		if err := Violation(l.p, l.grants); err != nil {
			t.Errorf("definition %d of %d: %v", i+1, len(ledgers), err)
		}
	}
}
