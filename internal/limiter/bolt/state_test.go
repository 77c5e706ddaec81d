package bolt

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// run is one process's worth of the embedded backend on a data directory:
// the memory store and the tenants on one Clock, and the file.
type run struct {
	store   *Store
	tenants *tenant.Registry
}

var tenantConfig = tenant.Config{Policy: limiter.Policy{Limit: 10, Period: time.Minute}}

func start(t *testing.T, dir string, wall *clocktest.Clock) (run, Restored) {
	t.Helper()
	clock := wall.Limiter()
	reg, err := tenant.New(tenantConfig, clock)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, memory.New(clock, 0), Options{Clock: clock, Tenants: reg, Wall: wall.Wall})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Restore(func(err error) { t.Errorf("save: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return run{store: s, tenants: reg}, r
}

// crash ends a run as SIGKILL would: the file is closed without a last
// snapshot, its header still saying it is in use.
func (r run) crash(t *testing.T) {
	t.Helper()
	if r.store.saver != nil {
		close(r.store.saver.stop)
		r.store.saver.done.Wait()
		r.store.saver = nil
	}
	if err := r.store.db.Close(); err != nil {
		t.Fatal(err)
	}
}

// remaining reads what every limiter, one key of each keyed one and one
// tenant could take now.
func (r run) remaining(t *testing.T) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	got := make(map[string]int64)
	for _, def := range defs {
		if def.Keyed {
			av, err := r.store.AvailableKey(ctx, def.Name, "alice")
			if err != nil {
				t.Fatal(err)
			}
			got[def.Name+"/alice"] = av.Remaining
			continue
		}
		av, err := r.store.Available(ctx, def.Name)
		if err != nil {
			t.Fatal(err)
		}
		got[def.Name] = av.Remaining
	}
	av, err := r.tenants.Available(context.Background(), "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	got["tenant"] = av.Remaining
	return got
}

// use takes a few permits from every limiter, key and tenant that
// remaining reads.
func (r run) use(t *testing.T, rng *rand.Rand) {
	t.Helper()
	ctx := context.Background()
	for _, def := range defs {
		n := 1 + rng.Int64N(2)
		var err error
		if def.Keyed {
			_, err = r.store.AcquireKey(ctx, def.Name, "alice", n)
		} else {
			_, err = r.store.Acquire(ctx, def.Name, n)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.tenants.Acquire(ctx, "192.0.2.1", 3); err != nil {
		t.Fatal(err)
	}
}

func putDefs(t *testing.T, s *Store) {
	t.Helper()
	for _, def := range defs {
		if _, err := s.Put(context.Background(), def); err != nil {
			t.Fatal(err)
		}
	}
}

// A graceful restart restores every bucket exactly, with the time the
// service was down credited: after it, every limiter, key and tenant has
// what a twin that never stopped has at the same instant.
func TestGracefulRestartRestoresExactly(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	dir := t.TempDir()
	wall := clocktest.New(time.Unix(1_700_000_000, 0))
	twin, _ := start(t, t.TempDir(), wall)
	putDefs(t, twin.store)
	r, restored := start(t, dir, wall)
	if restored.Crashed || !restored.SavedAt.IsZero() {
		t.Fatalf("a new file: restored %+v, want nothing", restored)
	}
	putDefs(t, r.store)
	for cycle := range 5 {
		for range 3 {
			wall.Advance(time.Duration(rng.Int64N(int64(2 * time.Second))))
			r.use(t, rand.New(rand.NewPCG(uint64(cycle), 7)))
			twin.use(t, rand.New(rand.NewPCG(uint64(cycle), 7)))
		}
		before := r.remaining(t)
		if err := r.store.Close(); err != nil {
			t.Fatal(err)
		}
		wall.Advance(time.Duration(rng.Int64N(int64(3 * time.Second)))) // down
		r, restored = start(t, dir, wall)
		if restored.Crashed || restored.Bytes == 0 {
			t.Fatalf("cycle %d: restored %+v, want a clean snapshot", cycle, restored)
		}
		got, want := r.remaining(t), twin.remaining(t)
		for k := range want {
			if got[k] != want[k] {
				t.Errorf("cycle %d, %s: %d left after the restart, want %d as the twin has (%d before it)", cycle, k, got[k], want[k], before[k])
			}
		}
	}
}

// A wall clock that went back while the service was down credits no time:
// the buckets are as they were at the shutdown.
func TestWallClockBackCreditsNothing(t *testing.T) {
	dir := t.TempDir()
	wall := clocktest.New(time.Unix(1_700_000_000, 0))
	r, _ := start(t, dir, wall)
	putDefs(t, r.store)
	r.use(t, rand.New(rand.NewPCG(2, 2)))
	before := r.remaining(t)
	r.store.Close()
	wall.StepWall(-time.Hour)
	r, _ = start(t, dir, wall)
	if got := r.remaining(t); !mapsEqual(got, before) {
		t.Errorf("after the restart: %v, want %v as at the shutdown", got, before)
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// After a crash, with or without a snapshot, every limiter, every key
// (one never seen included) and every tenant starts exhausted, and a
// period later is full again.
func TestCrashExhaustsEveryBucket(t *testing.T) {
	for _, snapshot := range []bool{false, true} {
		t.Run(map[bool]string{false: "before the first snapshot", true: "after a snapshot"}[snapshot], func(t *testing.T) {
			dir := t.TempDir()
			wall := clocktest.New(time.Unix(1_700_000_000, 0))
			r, _ := start(t, dir, wall)
			putDefs(t, r.store)
			r.use(t, rand.New(rand.NewPCG(3, 3)))
			if snapshot {
				if err := r.store.Save(false); err != nil {
					t.Fatal(err)
				}
			}
			r.crash(t)
			wall.Advance(time.Second)
			r, restored := start(t, dir, wall)
			if !restored.Crashed {
				t.Fatalf("restored %+v, want Crashed", restored)
			}
			for k, left := range r.remaining(t) {
				if left != 0 {
					t.Errorf("%s: %d left after the crash, want 0", k, left)
				}
			}
			ctx := context.Background()
			if av, err := r.store.AvailableKey(ctx, "per-user", "never-seen"); err != nil || av.Remaining != 0 {
				t.Errorf("a key never seen: %+v, %v; want 0 left", av, err)
			}
			if av, err := r.tenants.Available(context.Background(), "2001:db8::1"); err != nil || av.Remaining != 0 {
				t.Errorf("a tenant never seen: %+v, %v; want 0 left", av, err)
			}
			// The longest period is a day.
			wall.Advance(24 * time.Hour)
			for k, left := range r.remaining(t) {
				if left == 0 {
					t.Errorf("%s: nothing left a day after the crash", k)
				}
			}
			// A clean shutdown after the crash is a clean start again.
			r.store.Close()
			if _, restored = start(t, dir, wall); restored.Crashed {
				t.Error("a clean shutdown after a crash: the next start is taken for a crash")
			}
		})
	}
}

// A state record that cannot be read is refused at start-up, with the file
// named.
func TestCorruptStateRefused(t *testing.T) {
	dir := t.TempDir()
	wall := clocktest.New(time.Unix(1_700_000_000, 0))
	r, _ := start(t, dir, wall)
	putDefs(t, r.store)
	r.use(t, rand.New(rand.NewPCG(4, 4)))
	r.store.Close()
	db, err := bbolt.Open(filepath.Join(dir, FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		// Half of the record, with a checksum of its own and counted in
		// the contents: the file adds up, what it holds cannot be read.
		b := tx.Bucket(stateBucket).Bucket([]byte("limiters"))
		k, v := b.Cursor().First()
		half := bytes.Clone(v[:(len(v)-checksumSize)/2])
		if err := b.Put(k, seal("state/limiters", k, half)); err != nil {
			return err
		}
		return updateContents(tx, func(c *contents) { c.tables["limiters"] = tableState{chunks: 1, bytes: uint64(len(half))} })
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	clock := wall.Limiter()
	s, err := Open(dir, memory.New(clock, 0), Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Restore(nil)
	if !errors.Is(err, memory.ErrCorruptState) || !strings.Contains(err.Error(), dir) {
		t.Errorf("Restore: got %v, want ErrCorruptState naming the file", err)
	}
}

// A refund made with an idempotency key is on disk before its answer: a
// retry after a crash is answered from its record and gives nothing back
// a second time; so is a settlement.
func TestRefundWithKeySurvivesCrash(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	wall := clocktest.New(time.Unix(1_700_000_000, 0))
	r, _ := start(t, dir, wall)
	putDefs(t, r.store)
	rsv, err := r.store.Reserve(ctx, []limiter.Item{{Name: "log", Permits: 4}}, time.Hour, "")
	if err != nil || !rsv.Allowed {
		t.Fatalf("reserve: %+v, %v", rsv, err)
	}
	if err := r.store.Save(false); err != nil { // the reservation, in a snapshot
		t.Fatal(err)
	}
	if _, err := r.store.Acquire(ctx, "api", 5); err != nil {
		t.Fatal(err)
	}
	refund := []limiter.Item{{Name: "api", Permits: 3}}
	settle := []limiter.Item{{Name: "log", Permits: 1}}
	for _, tc := range []struct {
		name    string
		limiter string
		decide  func(*Store) (limiter.Verdict, error)
	}{
		{"refund", "api", func(s *Store) (limiter.Verdict, error) { return s.Decide(ctx, refund, limiter.Refund, "refund-1") }},
		{"settlement", "log", func(s *Store) (limiter.Verdict, error) { return s.Settle(ctx, rsv.Reservation, settle, "settle-1") }},
	} {
		if _, err := tc.decide(r.store); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r.crash(t) // no snapshot but the one the decision waited for
		var restored Restored
		r, restored = start(t, dir, wall)
		if !restored.Crashed {
			t.Fatalf("restored %+v, want Crashed", restored)
		}
		v, err := tc.decide(r.store)
		if err != nil || !v.Replayed {
			t.Errorf("the %s retried after the crash: %+v, %v; want it replayed", tc.name, v, err)
		}
		if av, err := r.store.Available(ctx, tc.limiter); err != nil || av.Remaining != 0 {
			t.Errorf("%s after the %s retried: %+v, %v; want 0 left (exhausted by the crash, nothing given back twice)", tc.limiter, tc.name, av, err)
		}
	}
}
