package memory_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/keystest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// stateDefs cover both algorithms, plain and keyed, with a bound of keys
// small enough to be reached by the 10 keys randomOp picks from: eviction
// is then part of what a restore must reproduce.
var stateDefs = []limiter.Definition{
	{Name: "gcra", Policy: limiter.Policy{Limit: 5, Period: time.Second, Burst: 3}},
	{Name: "log", Policy: limiter.Policy{Limit: 7, Period: time.Second, Algorithm: limiter.SlidingLog}},
	{Name: "keyed-gcra", Policy: limiter.Policy{Limit: 4, Period: time.Second}, Keyed: true, MaxKeys: 6},
	{Name: "keyed-log", Policy: limiter.Policy{Limit: 3, Period: time.Second, Algorithm: limiter.SlidingLog}, Keyed: true, MaxKeys: 6},
}

// unbounded is stateDefs with room for every key: an evicted key is
// forgiven what it had not used (see memory.Keys), which the contract of
// one bucket does not allow for, so the crash test evicts none.
func unbounded() []limiter.Definition {
	defs := append([]limiter.Definition(nil), stateDefs...)
	for i := range defs {
		if defs[i].Keyed {
			defs[i].MaxKeys = 16
		}
	}
	return defs
}

func newStateStore(t testing.TB, clock *limiter.Clock, defs ...limiter.Definition) *memory.Store {
	t.Helper()
	if defs == nil {
		defs = stateDefs
	}
	s := memory.New(clock, 0)
	for _, def := range defs {
		if _, err := s.Put(context.Background(), def); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// stateOp is one random acquisition: a limiter, a key (keyed ones) and a
// permit count.
type stateOp struct {
	def     limiter.Definition
	key     string
	permits int64
}

func randomOp(rng *rand.Rand) stateOp {
	op := stateOp{def: stateDefs[rng.IntN(len(stateDefs))], permits: 1 + rng.Int64N(3)}
	if op.def.Keyed {
		op.key = fmt.Sprintf("k%d", rng.IntN(10))
	}
	return op
}

func (op stateOp) do(t testing.TB, s *memory.Store) limiter.Decision {
	t.Helper()
	ctx := context.Background()
	if op.def.Keyed {
		d, err := s.AcquireKey(ctx, op.def.Name, op.key, op.permits)
		if err != nil {
			t.Fatal(err)
		}
		return d.Decision
	}
	d, err := s.Acquire(ctx, op.def.Name, op.permits)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A graceful restart restores the state exactly: from the snapshot on, a
// restored store decides every acquisition as the store it was taken from
// does, on another Clock whose readings differ (the wall clock was
// stepped while it was down).
func TestStateRestoresExactly(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 1))
		wall := clocktest.New(time.Unix(1_700_000_000, 0))
		a := newStateStore(t, wall.Limiter())
		aClock := wall.Limiter() // reads as a's
		for range 200 {
			wall.Advance(time.Duration(rng.Int64N(int64(200 * time.Millisecond))))
			randomOp(rng).do(t, a)
		}
		snap := a.AppendState(nil)
		wall.StepWall(time.Duration(rng.Int64N(int64(time.Hour))) - 30*time.Minute)
		bClock := wall.Limiter()
		b := newStateStore(t, bClock)
		shift := bClock.Now() - aClock.Now()
		if err := b.RestoreState(snap, shift, false, bClock.Now()); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for i := range 300 {
			wall.Advance(time.Duration(rng.Int64N(int64(100 * time.Millisecond))))
			op := randomOp(rng)
			if got, want := op.do(t, b), op.do(t, a); got != want {
				t.Fatalf("seed %d, acquisition %d after the restore (%+v): restored store decided %+v, original %+v", seed, i, op, got, want)
			}
		}
	}
}

// After a crash the snapshot may be older than the last grants. Restored
// with crashed set, no bucket ever exceeds its limit across any number of
// crashes and graceful restarts, checked on every grant of every limiter and key, those made
// before each crash included, against the contract of its algorithm.
// Trusting the snapshot instead does exceed it: the check can fail.
func TestStateAfterCrashNeverOverAdmits(t *testing.T) {
	violations := func(seed uint64, crashed bool) (int, error) {
		rng := rand.New(rand.NewPCG(seed, 2))
		wall := clocktest.New(time.Unix(1_700_000_000, 0))
		timeline := wall.Limiter() // every grant is recorded on this one
		clock := wall.Limiter()
		s := newStateStore(t, clock, unbounded()...)
		grants := make(map[string][]limiter.Grant) // by limiter and key
		var snap []byte
		snapClock := clock
		for range 10 { // runs, each ended by a crash or a graceful stop
			// Runs of 0 to 3 periods: a crash's exhaustion may outlast one.
			for range 5 + rng.IntN(120) {
				wall.Advance(time.Duration(rng.Int64N(int64(50 * time.Millisecond))))
				op := randomOp(rng)
				if d := op.do(t, s); d.Allowed {
					id := op.def.Name + "/" + op.key
					grants[id] = append(grants[id], limiter.Grant{At: timeline.Now(), N: op.permits})
				}
				if rng.IntN(40) == 0 {
					snap, snapClock = s.AppendState(nil), clock
				}
			}
			// A graceful stop now and then, which snapshots the state
			// last; otherwise a crash. Then a restart after 0 to 1.5
			// periods, most often short.
			graceful := rng.IntN(3) == 0
			if graceful {
				snap, snapClock = s.AppendState(nil), clock
			}
			wall.Advance(time.Duration(rng.Int64N(int64(1500*time.Millisecond)) >> rng.IntN(4)))
			if rng.IntN(2) == 0 {
				wall.StepWall(time.Duration(rng.Int64N(int64(time.Minute))))
			}
			clock = wall.Limiter()
			s = newStateStore(t, clock, unbounded()...)
			shift := clock.Now() - snapClock.Now() // the snapshot's Clock reads on
			if err := s.RestoreState(snap, shift, crashed && !graceful, clock.Now()); err != nil {
				return 0, err
			}
			snapClock = clock
			snap = nil // a crash before the next snapshot restores none
		}
		n := 0
		for id, gs := range grants {
			var p limiter.Policy
			for _, def := range stateDefs {
				if strings.HasPrefix(id, def.Name+"/") {
					p = def.Policy
				}
			}
			if err := keystest.Violation(p, gs); err != nil {
				n++
				if crashed {
					t.Errorf("seed %d, %s: %v", seed, id, err)
				}
			}
		}
		return n, nil
	}
	trusted := 0
	for seed := range uint64(300) {
		if _, err := violations(seed, true); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		n, err := violations(seed, false)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		trusted += n
	}
	if trusted == 0 {
		t.Error("trusting the snapshot after a crash never exceeded a limit: the check cannot fail")
	}
	t.Logf("trusting the snapshot: %d buckets over their limit over 300 seeds; exhausting: none", trusted)
}

// A record cut short, or one with a byte changed, is refused or restores
// something, and never panics; a strict prefix is always refused.
func TestStateCorruptRecord(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	wall := clocktest.New(time.Unix(1_700_000_000, 0))
	a := newStateStore(t, wall.Limiter())
	for range 300 {
		wall.Advance(time.Duration(rng.Int64N(int64(20 * time.Millisecond))))
		randomOp(rng).do(t, a)
	}
	snap := a.AppendState(nil)
	for n := range len(snap) {
		b := newStateStore(t, wall.Limiter())
		if err := b.RestoreState(snap[:n], 0, false, 0); n > 0 && !errors.Is(err, memory.ErrCorruptState) {
			t.Fatalf("a record cut to %d of %d bytes: got %v, want ErrCorruptState", n, len(snap), err)
		}
	}
	for i := range len(snap) {
		b := newStateStore(t, wall.Limiter())
		c := append([]byte(nil), snap...)
		c[i] ^= 1 << rng.IntN(8)
		_ = b.RestoreState(c, 0, false, 0)
	}
}

func FuzzRestoreState(f *testing.F) {
	wall := clocktest.New(time.Unix(1_700_000_000, 0))
	a := newStateStore(f, wall.Limiter())
	rng := rand.New(rand.NewPCG(4, 4))
	for range 50 {
		wall.Advance(time.Duration(rng.Int64N(int64(20 * time.Millisecond))))
		randomOp(rng).do(f, a)
	}
	f.Add(a.AppendState(nil), false)
	f.Fuzz(func(t *testing.T, b []byte, crashed bool) {
		s := newStateStore(t, wall.Limiter())
		if err := s.RestoreState(b, 0, crashed, 0); err != nil && !errors.Is(err, memory.ErrCorruptState) {
			t.Fatalf("got %v, want nil or ErrCorruptState", err)
		}
		for _, def := range stateDefs {
			if def.Keyed {
				s.AcquireKey(context.Background(), def.Name, "k", 1)
			} else {
				s.Acquire(context.Background(), def.Name, 1)
			}
		}
	})
}

// After a crash with no snapshot, a key never seen is exhausted on every
// path that reads it (acquire, available, joint decision) and refills from
// there as the algorithm does; a plain limiter too.
func TestStartExhaustedEveryPath(t *testing.T) {
	ctx := context.Background()
	wall := clocktest.New(time.Unix(1_700_000_000, 0))
	clock := wall.Limiter()
	s := newStateStore(t, clock, unbounded()...)
	if err := s.RestoreState(nil, 0, true, clock.Now()); err != nil {
		t.Fatal(err)
	}
	for _, def := range stateDefs {
		name := def.Name
		if !def.Keyed {
			if av, err := s.Available(ctx, name); err != nil || av.Remaining != 0 {
				t.Errorf("%s: available %+v, %v; want 0 left", name, av, err)
			}
			continue
		}
		if av, err := s.AvailableKey(ctx, name, "new"); err != nil || av.Remaining != 0 {
			t.Errorf("%s: available %+v, %v; want 0 left", name, av, err)
		}
		if d, err := s.AcquireKey(ctx, name, "new", 1); err != nil || d.Allowed {
			t.Errorf("%s: acquire %+v, %v; want denied", name, d, err)
		}
		v, err := s.Decide(ctx, []limiter.Item{{Name: name, Key: "other", Permits: 1}}, limiter.Take, "")
		if err != nil || v.Allowed {
			t.Errorf("%s: decide %+v, %v; want denied", name, v, err)
		}
	}
	// One period on, every bucket is full again.
	wall.Advance(time.Second)
	for _, def := range stateDefs {
		var err error
		var left int64
		if def.Keyed {
			var av limiter.KeyAvailability
			av, err = s.AvailableKey(ctx, def.Name, "new")
			left = av.Remaining
		} else {
			var av limiter.Availability
			av, err = s.Available(ctx, def.Name)
			left = av.Remaining
		}
		if want := keystest.Capacity(def.Policy); err != nil || left != want {
			t.Errorf("%s a period later: %d left, %v; want %d", def.Name, left, err, want)
		}
	}
}

// The decisions made with an idempotency key, and the reservations held,
// are restored with the counts: a refund retried after a graceful restart
// is answered from its record and refunds nothing twice, and a reservation
// made before it can be settled after it.
func TestStateKeepsIdempotencyAndReservations(t *testing.T) {
	ctx := context.Background()
	wall := clocktest.New(time.Unix(1_700_000_000, 0))
	aClock := wall.Limiter()
	a := newStateStore(t, aClock)
	take := []limiter.Item{{Name: "gcra", Permits: 3}}
	if v, err := a.Decide(ctx, take, limiter.Take, ""); err != nil || !v.Allowed {
		t.Fatalf("take: %+v, %v", v, err)
	}
	refund := []limiter.Item{{Name: "gcra", Permits: 2}}
	if _, err := a.Decide(ctx, refund, limiter.Refund, "refund-1"); err != nil {
		t.Fatal(err)
	}
	rsv, err := a.Reserve(ctx, []limiter.Item{{Name: "log", Permits: 4}}, time.Minute, "")
	if err != nil || !rsv.Allowed || rsv.Reservation == "" {
		t.Fatalf("reserve: %+v, %v", rsv, err)
	}
	snap := a.AppendState(nil)
	wall.Advance(time.Millisecond)
	bClock := wall.Limiter()
	b := newStateStore(t, bClock)
	if err := b.RestoreState(snap, bClock.Now()-aClock.Now(), false, bClock.Now()); err != nil {
		t.Fatal(err)
	}
	before, _ := b.Available(ctx, "gcra")
	v, err := b.Decide(ctx, refund, limiter.Refund, "refund-1")
	if err != nil || !v.Replayed {
		t.Errorf("the refund retried: %+v, %v; want it replayed", v, err)
	}
	if after, _ := b.Available(ctx, "gcra"); after != before {
		t.Errorf("the refund retried gave permits back again: %d left, want %d", after.Remaining, before.Remaining)
	}
	if _, err := b.Decide(ctx, take, limiter.Take, "refund-1"); !errors.Is(err, limiter.ErrOnceMismatch) {
		t.Errorf("another decision under the key: got %v, want ErrOnceMismatch", err)
	}
	logBefore, _ := b.Available(ctx, "log")
	if _, err := b.Settle(ctx, rsv.Reservation, []limiter.Item{{Name: "log", Permits: 1}}, ""); err != nil {
		t.Fatalf("settle the reservation made before the restart: %v", err)
	}
	if logAfter, _ := b.Available(ctx, "log"); logAfter.Remaining != logBefore.Remaining+3 {
		t.Errorf("settling 1 of 4 reserved: %d left, want %d", logAfter.Remaining, logBefore.Remaining+3)
	}
}

// A record written before reservations held anything (testdata: a
// sliding log of 10 an hour with 4 of them reserved, at 1,700,000,000 s)
// still restores: its reservation can be settled, and, not knowing where
// its permits are, gives none back.
func TestStateBeforeHoldsGivesNothingBack(t *testing.T) {
	ctx := context.Background()
	rec, err := os.ReadFile("testdata/state-before-holds.bin")
	if err != nil {
		t.Fatal(err)
	}
	clock := clocktest.New(time.Unix(1_700_000_000, 0)).Limiter()
	s := memory.New(clock, 0)
	putDef(t, s, limiter.Definition{Name: "log", Policy: limiter.Policy{Limit: 10, Period: time.Hour, Algorithm: limiter.SlidingLog}})
	if err := s.RestoreState(rec, 0, false, clock.Now()); err != nil {
		t.Fatalf("restore: %v", err)
	}
	v, err := s.Settle(ctx, "l.log.a32b7e6ecdc950837bf6a02f7d8e7b23", nil, "")
	if err != nil {
		t.Fatalf("cancel the reservation restored: %v", err)
	}
	if got := v.Checks[0].Remaining; got != 6 {
		t.Errorf("after the cancel: %d left, want 6 (nothing given back)", got)
	}
}
