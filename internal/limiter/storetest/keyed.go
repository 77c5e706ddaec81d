package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// testKeyed checks keyed limiters: one bucket per key, all or nothing,
// Available without consuming, Lowest in order, and the calls that name a
// key (or none) against the definition refused with nothing changed.
func testKeyed(t *testing.T, s limiter.Store) {
	p := limiter.Policy{Limit: 9, Period: hour}
	put(t, s, "plain", p)
	_, err := s.Put(ctx(t), limiter.Definition{Name: "per-user", Policy: p, Keyed: true, MaxKeys: 100})
	if err != nil {
		t.Fatalf("Put of a keyed limiter: %v", err)
	}
	def, err := s.Get(ctx(t), "per-user")
	if err != nil || !def.Keyed || def.MaxKeys != 100 {
		t.Errorf("Get: got %+v, %v, want keyed with MaxKeys 100", def, err)
	}
	take := func(key string, n int64) limiter.KeyDecision {
		t.Helper()
		d, err := s.AcquireKey(ctx(t), "per-user", key, n)
		if err != nil {
			t.Fatalf("AcquireKey(%q, %d): %v", key, n, err)
		}
		return d
	}
	if d := take("alice", 5); !d.Allowed || d.Remaining != 4 {
		t.Errorf("alice 5: got %+v, want allowed with 4 left", d)
	}
	if d := take("alice", 5); d.Allowed || d.Remaining != 4 {
		t.Errorf("alice 5 more: got %+v, want denied with 4 left", d)
	}
	if d := take("bob", 10); d.Allowed || !d.ExceedsCapacity {
		t.Errorf("bob 10: got %+v, want denied, exceeds capacity", d)
	}
	if d := take("carol", 8); !d.Allowed || d.Remaining != 1 {
		t.Errorf("carol 8: got %+v, want allowed with 1 left", d)
	}
	for key, want := range map[string]int64{"alice": 4, "bob": 9, "carol": 1} {
		a, err := s.AvailableKey(ctx(t), "per-user", key)
		if err != nil || a.Remaining != want {
			t.Errorf("AvailableKey(%q): got %+v, %v, want %d left", key, a, err, want)
		}
	}
	es, err := s.Lowest(ctx(t), "per-user", 10)
	if err != nil || len(es) != 2 || es[0].Key != "carol" || es[1].Key != "alice" {
		t.Errorf("Lowest: got %+v, %v, want carol then alice", es, err)
	}
	for name, err := range map[string]error{
		"Acquire":    func() error { _, err := s.Acquire(ctx(t), "per-user", 1); return err }(),
		"Available":  func() error { _, err := s.Available(ctx(t), "per-user"); return err }(),
		"AcquireKey": func() error { _, err := s.AcquireKey(ctx(t), "plain", "alice", 1); return err }(),
		"Lowest":     func() error { _, err := s.Lowest(ctx(t), "plain", 1); return err }(),
	} {
		if !errors.Is(err, limiter.ErrKeyMismatch) {
			t.Errorf("%s against the definition: got %v, want ErrKeyMismatch", name, err)
		}
	}
	if got := available(t, s, "plain").Remaining; got != 9 {
		t.Errorf("plain: %d left, want 9", got)
	}
	if a, _ := s.AvailableKey(ctx(t), "per-user", "alice"); a.Remaining != 4 {
		t.Errorf("alice after the refused calls: %d left, want 4", a.Remaining)
	}

	// A joint decision names keys: two items of alice's are summed.
	alice := []limiter.Item{{Name: "per-user", Key: "alice", Permits: 3}, {Name: "per-user", Key: "alice", Permits: 1}}
	v, err := s.Decide(ctx(t), alice, limiter.Take, "")
	if err != nil || !v.Allowed || v.Checks[0].Remaining != 0 || v.Checks[1].Key != "alice" {
		t.Errorf("Decide of alice's last 4: got %+v, %v, want allowed with 0 left", v, err)
	}
	if v, err := s.Decide(ctx(t), alice[1:], limiter.Take, ""); err != nil || v.Allowed {
		t.Errorf("Decide of one more: got %+v, %v, want denied", v, err)
	}
	for name, items := range map[string][]limiter.Item{
		"two keys of a limiter in no group": {{Name: "per-user", Key: "alice", Permits: 1}, {Name: "per-user", Key: "bob", Permits: 1}},
		"a keyed limiter without its key":   {{Name: "per-user", Permits: 1}},
		"a key of a plain limiter":          {{Name: "plain", Key: "bob", Permits: 1}},
	} {
		if _, err := s.Decide(ctx(t), items, limiter.Take, ""); !errors.Is(err, limiter.ErrCrossGroup) && !errors.Is(err, limiter.ErrKeyMismatch) {
			t.Errorf("Decide of %s: got %v, want ErrCrossGroup or ErrKeyMismatch", name, err)
		}
	}
	if a, _ := s.AvailableKey(ctx(t), "per-user", "bob"); a.Remaining != 9 {
		t.Errorf("bob after the refused decisions: %d left, want 9", a.Remaining)
	}

	// Two tables full of limited keys: a Peek of a newcomer in each reports
	// both without room, as a Take would.
	one := limiter.Policy{Limit: 1, Period: limiter.MaxPeriod}
	for _, name := range []string{"full-user", "full-ip"} {
		if _, err := s.Put(ctx(t), limiter.Definition{Name: name, Policy: one, Group: "full", Keyed: true, MaxKeys: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := s.Decide(ctx(t), []limiter.Item{{Name: "full-user", Key: "a", Permits: 1}, {Name: "full-ip", Key: "x", Permits: 1}}, limiter.Take, ""); err != nil || !v.Allowed {
		t.Fatalf("first keys: got %+v, %v, want allowed", v, err)
	}
	newcomers := []limiter.Item{{Name: "full-user", Key: "b", Permits: 1}, {Name: "full-ip", Key: "y", Permits: 1}}
	for _, mode := range []limiter.Mode{limiter.Peek, limiter.Take} {
		v, err := s.Decide(ctx(t), newcomers, mode, "")
		if err != nil || v.Allowed {
			t.Fatalf("%s of newcomers: got %+v, %v, want denied", mode, v, err)
		}
		for _, c := range v.Checks {
			if c.Fits || !c.KeysFull || c.Remaining != 0 || c.RetryAfter <= 0 {
				t.Errorf("%s of newcomers: check %+v, want keys full with a wait", mode, c)
			}
		}
	}

	testKeyedBatch(t, s)
	testKeyedReservations(t, s)
}

// testKeyedBatch: a batch names keys, each decided as AcquireKey would
// decide it; a key of a plain limiter, or none of a keyed one, fails on
// its own and the others are decided.
func testKeyedBatch(t *testing.T, s limiter.Store) {
	reqs := []limiter.Request{
		{Name: "per-user", Key: "batch-1", Permits: 5},
		{Name: "per-user", Key: "batch-1", Permits: 5},
		{Name: "per-user", Key: "batch-2", Permits: 1},
		{Name: "per-user", Permits: 1},
		{Name: "plain", Key: "batch-1", Permits: 1},
		{Name: "plain", Permits: 1},
	}
	out := make([]limiter.Result, len(reqs))
	if err := limiter.NewService(s).AcquireBatch(ctx(t), reqs, out); err != nil {
		t.Fatalf("AcquireBatch: %v", err)
	}
	for i, want := range []struct {
		allowed   bool
		remaining int64
		mismatch  bool
	}{{true, 4, false}, {false, 4, false}, {true, 8, false}, {false, 0, true}, {false, 0, true}, {true, 8, false}} {
		got := out[i]
		if want.mismatch {
			if !errors.Is(got.Err, limiter.ErrKeyMismatch) {
				t.Errorf("batch %d (%+v): got %+v, want ErrKeyMismatch", i, reqs[i], got)
			}
			continue
		}
		if got.Err != nil || got.Decision.Allowed != want.allowed || got.Decision.Remaining != want.remaining || got.KeysFull {
			t.Errorf("batch %d (%+v): got %+v, want allowed %v with %d left", i, reqs[i], got, want.allowed, want.remaining)
		}
	}
	if a, err := s.AvailableKey(ctx(t), "per-user", "batch-1"); err != nil || a.Remaining != 4 {
		t.Errorf("batch-1 after the batch: %+v, %v, want 4 left", a, err)
	}
	// What the batch took from plain is given back for the checks after.
	if _, err := s.Decide(ctx(t), []limiter.Item{{Name: "plain", Permits: 1}}, limiter.Refund, ""); err != nil {
		t.Fatal(err)
	}
}

// testKeyedReservations: reservations of keys, of a keyed limiter in no
// group (the ID names the key) and of a group's keys beside a plain
// limiter, settled and cancelled; a settlement naming a key the
// reservation does not hold is refused and changes nothing.
func testKeyedReservations(t *testing.T, s limiter.Store) {
	p := limiter.Policy{Limit: 100, Period: hour}
	for _, def := range []limiter.Definition{
		{Name: "rsv-user", Policy: p, Keyed: true},
		{Name: "llm-user", Policy: p, Group: "llm", Keyed: true},
		{Name: "llm-global", Policy: limiter.Policy{Limit: 1000, Period: hour}, Group: "llm"},
	} {
		if _, err := s.Put(ctx(t), def); err != nil {
			t.Fatal(err)
		}
	}
	left := func(name, key string) int64 {
		t.Helper()
		if key == "" {
			return available(t, s, name).Remaining
		}
		a, err := s.AvailableKey(ctx(t), name, key)
		if err != nil {
			t.Fatal(err)
		}
		return a.Remaining
	}
	reserve := func(items ...limiter.Item) string {
		t.Helper()
		v, err := s.Reserve(ctx(t), items, time.Minute, "")
		if err != nil || !v.Allowed || v.Reservation == "" {
			t.Fatalf("Reserve(%+v): got %+v, %v, want allowed with a reservation", items, v, err)
		}
		return v.Reservation
	}
	dave := "dave {on} a:b"
	id := reserve(limiter.Item{Name: "rsv-user", Key: dave, Permits: 50})
	if !strings.HasPrefix(id, "k.rsv-user.") {
		t.Errorf("reservation %q of a key of a limiter in no group: want it to start with k.rsv-user.", id)
	}
	if _, err := s.Settle(ctx(t), id, []limiter.Item{{Name: "rsv-user", Key: "erin", Permits: 1}}, ""); !errors.Is(err, limiter.ErrInvalidReservation) {
		t.Errorf("Settle naming another key: got %v, want ErrInvalidReservation", err)
	}
	if v, err := s.Settle(ctx(t), id, []limiter.Item{{Name: "rsv-user", Key: dave, Permits: 70}}, ""); err != nil || !v.Allowed || v.Checks[0].Remaining != 30 {
		t.Errorf("Settle dave's 50 at 70: got %+v, %v, want 30 left", v, err)
	}
	if _, err := s.Settle(ctx(t), id, nil, ""); !errors.Is(err, limiter.ErrReservationNotFound) {
		t.Errorf("Cancel after the settlement: got %v, want ErrReservationNotFound", err)
	}
	if got := left("rsv-user", "erin"); got != 100 {
		t.Errorf("erin: %d left, want 100", got)
	}
	// A cancel finds the reservation of a key of a limiter in no group
	// where the reservation was made.
	id = reserve(limiter.Item{Name: "rsv-user", Key: "erin", Permits: 40})
	if v, err := s.Settle(ctx(t), id, nil, ""); err != nil || !v.Allowed || v.Checks[0].Remaining != 100 {
		t.Errorf("Cancel of erin's 40: got %+v, %v, want 100 left", v, err)
	}

	id = reserve(limiter.Item{Name: "llm-user", Key: "u1", Permits: 60}, limiter.Item{Name: "llm-global", Permits: 60})
	if v, err := s.Settle(ctx(t), id, []limiter.Item{{Name: "llm-user", Key: "u1", Permits: 80}, {Name: "llm-global", Permits: 80}}, ""); err != nil || !v.Allowed {
		t.Errorf("Settle u1's 60 at 80: got %+v, %v", v, err)
	}
	id = reserve(limiter.Item{Name: "llm-user", Key: "u2", Permits: 10}, limiter.Item{Name: "llm-global", Permits: 10})
	if _, err := s.Settle(ctx(t), id, []limiter.Item{{Name: "llm-user", Key: "u1", Permits: 1}}, ""); !errors.Is(err, limiter.ErrInvalidReservation) {
		t.Errorf("Settle naming a key of the group the reservation does not hold: got %v, want ErrInvalidReservation", err)
	}
	if v, err := s.Settle(ctx(t), id, nil, ""); err != nil || !v.Allowed || len(v.Checks) != 2 || v.Checks[0].Key != "u2" {
		t.Errorf("Cancel of u2's reservation: got %+v, %v, want both parts given back", v, err)
	}
	for _, c := range []struct {
		name, key string
		want      int64
	}{{"llm-user", "u1", 20}, {"llm-user", "u2", 100}, {"llm-global", "", 920}, {"rsv-user", dave, 30}} {
		if got := left(c.name, c.key); got != c.want {
			t.Errorf("%s %q: %d left, want %d", c.name, c.key, got, c.want)
		}
	}
}

// testKeyBudget: the keyed limiters' max_keys add up to at most
// limiter.KeyBudget; a Put past it changes nothing, and deleting,
// shrinking or unkeying a keyed limiter gives its keys back.
func testKeyBudget(t *testing.T, s limiter.Store) {
	p := limiter.Policy{Limit: 1, Period: time.Second}
	putDef := func(def limiter.Definition) {
		t.Helper()
		if _, err := s.Put(ctx(t), def); err != nil {
			t.Fatalf("Put(%+v): %v", def, err)
		}
	}
	half := limiter.KeyBudget / 2
	putDef(limiter.Definition{Name: "a", Policy: p, Keyed: true, MaxKeys: half})
	putDef(limiter.Definition{Name: "b", Policy: p, Keyed: true, MaxKeys: half})
	if _, err := s.Put(ctx(t), limiter.Definition{Name: "c", Policy: p, Keyed: true, MaxKeys: 1}); !errors.Is(err, limiter.ErrTooManyKeys) {
		t.Fatalf("Put past the budget: got %v, want ErrTooManyKeys", err)
	}
	if _, err := s.Get(ctx(t), "c"); !errors.Is(err, limiter.ErrNotFound) {
		t.Errorf("the refused limiter: got %v, want ErrNotFound", err)
	}
	if _, err := s.Put(ctx(t), limiter.Definition{Name: "a", Policy: p, Keyed: true, MaxKeys: half + 1}); !errors.Is(err, limiter.ErrTooManyKeys) {
		t.Errorf("growing a keyed limiter past the budget: got %v, want ErrTooManyKeys", err)
	}
	if def, _ := s.Get(ctx(t), "a"); def.MaxKeys != half {
		t.Errorf("after the refused growth: max keys %d, want %d", def.MaxKeys, half)
	}
	// Unkeyed limiters take none of the budget; a smaller bound gives
	// keys back.
	put(t, s, "plain", p)
	putDef(limiter.Definition{Name: "a", Policy: p, Keyed: true, MaxKeys: half - 10})
	putDef(limiter.Definition{Name: "c", Policy: p, Keyed: true, MaxKeys: 10})
	if err := s.Delete(ctx(t), "b"); err != nil {
		t.Fatal(err)
	}
	putDef(limiter.Definition{Name: "d", Policy: p, Keyed: true, MaxKeys: half})
	// Turning a keyed limiter into a plain one gives its keys back.
	putDef(limiter.Definition{Name: "d", Policy: p})
	putDef(limiter.Definition{Name: "e", Policy: p, Keyed: true, MaxKeys: half})
	if _, err := s.Put(ctx(t), limiter.Definition{Name: "f", Policy: p, Keyed: true, MaxKeys: 1}); !errors.Is(err, limiter.ErrTooManyKeys) {
		t.Errorf("Put past the budget at the end: got %v, want ErrTooManyKeys", err)
	}
}
