package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	"github.com/ratelimiter/ratelimiter/internal/limiter/storetest"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, memory.New(nil, 0), Options{Clock: limiter.NewClock()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func list(t *testing.T, s *Store) []limiter.Definition {
	t.Helper()
	defs, err := s.List(context.Background(), "", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return defs
}

var defs = []limiter.Definition{
	{Name: "api", Policy: limiter.Policy{Limit: 5, Period: time.Minute}},
	{Name: "burst", Policy: limiter.Policy{Limit: 2000, Period: 100 * time.Second, Burst: 10}},
	{Name: "log", Policy: limiter.Policy{Limit: 9, Period: time.Hour, Algorithm: limiter.SlidingLog}},
	{Name: "per-user", Policy: limiter.Policy{Limit: 3, Period: time.Second}, Keyed: true, MaxKeys: 50},
	{Name: "grouped", Policy: limiter.Policy{Limit: 7, Period: 24 * time.Hour}, Group: "billing"},
}

func TestDefinitionsSurviveReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir)
	for _, def := range defs {
		if created, err := s.Put(ctx, def); err != nil || !created {
			t.Fatalf("Put(%s): created %v, err %v; want created", def.Name, created, err)
		}
	}
	replaced := limiter.Definition{Name: "api", Policy: limiter.Policy{Limit: 6, Period: time.Minute}}
	if created, err := s.Put(ctx, replaced); err != nil || created {
		t.Fatalf("replace: created %v, err %v", created, err)
	}
	if err := s.Delete(ctx, "burst"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "burst"); !errors.Is(err, limiter.ErrNotFound) {
		t.Fatalf("second Delete: got %v, want ErrNotFound", err)
	}
	want := list(t, s)
	if len(want) != len(defs)-1 {
		t.Fatalf("before reopening: got %d limiters, want %d", len(want), len(defs)-1)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := list(t, open(t, dir)); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopening:\ngot  %+v\nwant %+v", got, want)
	}
}

// A change the memory store refuses is not written.
func TestRefusedChangeIsNotWritten(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(dir, memory.New(nil, 2), Options{Clock: limiter.NewClock()})
	if err != nil {
		t.Fatal(err)
	}
	for _, def := range defs[:2] {
		if _, err := s.Put(ctx, def); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Put(ctx, defs[2]); !errors.Is(err, limiter.ErrTooManyLimiters) {
		t.Fatalf("third limiter: got %v, want ErrTooManyLimiters", err)
	}
	moved := defs[0]
	moved.Group = "elsewhere"
	if _, err := s.Put(ctx, moved); !errors.Is(err, limiter.ErrGroupConflict) {
		t.Fatalf("new group: got %v, want ErrGroupConflict", err)
	}
	want := list(t, s)
	s.Close()
	if got := list(t, open(t, dir)); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopening:\ngot  %+v\nwant %+v", got, want)
	}
}

// A write that fails leaves the definition in force, with its state, and
// the file as it was.
func TestFailedWriteChangesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir)
	if _, err := s.Put(ctx, defs[0]); err != nil {
		t.Fatal(err)
	}
	if d, err := s.Acquire(ctx, "api", 4); err != nil || !d.Allowed {
		t.Fatalf("acquire: %+v, %v", d, err)
	}
	s.db.Close() // every later write fails
	replaced := defs[0]
	replaced.Policy.Limit = 50
	if _, err := s.Put(ctx, replaced); !errors.Is(err, limiter.ErrNotDurable) {
		t.Fatalf("replace: got %v, want ErrNotDurable", err)
	}
	if _, err := s.Put(ctx, defs[1]); !errors.Is(err, limiter.ErrNotDurable) {
		t.Fatalf("create: got %v, want ErrNotDurable", err)
	}
	if err := s.Delete(ctx, "api"); !errors.Is(err, limiter.ErrNotDurable) {
		t.Fatalf("delete: got %v, want ErrNotDurable", err)
	}
	if got := list(t, s); !reflect.DeepEqual(got, []limiter.Definition{defs[0].Normalize()}) {
		t.Errorf("limiters: got %+v, want only %+v", got, defs[0])
	}
	// The replaced limiter is back with its state: 1 of 5 left.
	if av, err := s.Available(ctx, "api"); err != nil || av.Remaining != 1 {
		t.Errorf("available after the failed replace: %+v, %v; want 1 remaining", av, err)
	}
	s2 := open(t, dir)
	if got := list(t, s2); !reflect.DeepEqual(got, []limiter.Definition{defs[0].Normalize()}) {
		t.Errorf("after reopening: got %+v, want only %+v", got, defs[0])
	}
}

// A second process (or Store) on the same directory is refused while the
// first holds it.
func TestSecondOpenRefused(t *testing.T) {
	dir := t.TempDir()
	open(t, dir)
	waited := false
	_, err := Open(dir, memory.New(nil, 0), Options{Clock: limiter.NewClock(), LockWait: 2 * time.Second, OnLockWait: func() { waited = true }})
	if !waited {
		t.Error("OnLockWait was not called")
	}
	if err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("second Open: got %v, want an error saying the file is in use", err)
	}
}

// A file that cannot be trusted is refused at Open, and left as it was.
func TestUntrustedFileRefused(t *testing.T) {
	valid := func(t *testing.T, path string) {
		t.Helper()
		s, err := Open(filepath.Dir(path), memory.New(nil, 0), Options{Clock: limiter.NewClock()})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 200 {
			def := defs[i%len(defs)]
			def.Name = fmt.Sprintf("%s-%03d", def.Name, i)
			def.Group = ""
			if _, err := s.Put(context.Background(), def); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
	}
	foreign := func(t *testing.T, path string, fill func(tx *bbolt.Tx) error) {
		t.Helper()
		db, err := bbolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(fill); err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
	for _, tc := range []struct {
		name  string
		make  func(t *testing.T, path string)
		error string
	}{
		{"text file", func(t *testing.T, path string) {
			os.WriteFile(path, bytes.Repeat([]byte("not a database\n"), 1000), 0o600)
		}, "not a data file this service can read"},
		{"empty file", func(t *testing.T, path string) { os.WriteFile(path, nil, 0o600) }, "not a data file this service can read"},
		{"another program's bbolt file", func(t *testing.T, path string) {
			foreign(t, path, func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("widgets")); return err })
		}, "not a ratelimiter data file"},
		{"another format", func(t *testing.T, path string) {
			foreign(t, path, func(tx *bbolt.Tx) error {
				b, err := tx.CreateBucket(metaBucket)
				if err != nil {
					return err
				}
				return b.Put(formatKey, []byte("ratelimiter 99"))
			})
		}, `format "ratelimiter 99"`},
		{"a definition no Put writes", func(t *testing.T, path string) {
			valid(t, path)
			db, _ := bbolt.Open(path, 0o600, nil)
			db.Update(func(tx *bbolt.Tx) error {
				v := seal(string(limitersBucket), []byte("bad"), []byte(`{"limit":0,"period_ns":1000000000,"algorithm":"gcra"}`))
				if err := tx.Bucket(limitersBucket).Put([]byte("bad"), v); err != nil {
					return err
				}
				return updateContents(tx, func(c *contents) { c.limiters++ })
			})
			db.Close()
		}, `limiter "bad": invalid policy`},
		{"truncated", func(t *testing.T, path string) {
			valid(t, path)
			fi, _ := os.Stat(path)
			os.Truncate(path, fi.Size()/3)
		}, "not a data file this service can read"},
		{"corrupt meta pages", func(t *testing.T, path string) {
			valid(t, path)
			b, _ := os.ReadFile(path)
			for _, off := range []int{16, 4096 + 16} { // inside both meta pages
				b[off] ^= 0xff
			}
			os.WriteFile(path, b, 0o600)
		}, "not a data file this service can read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			tc.make(t, path)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Open(dir, memory.New(nil, 0), Options{Clock: limiter.NewClock()})
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tc.error) || !strings.Contains(err.Error(), path) {
				t.Errorf("Open: got %q, want it to name %s and say %q", err, path, tc.error)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Error("Open changed the file it refused")
			}
		})
	}
}

// On a full disk a change fails with ErrNotDurable and changes nothing; the
// changes made before it are all in the file. The disk is a tmpfs of 256
// KiB mounted for the test, which needs root.
func TestFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatal("FAIL: CI is set and this test needs root, to mount a small tmpfs")
		}
		t.Skip("needs root, to mount a small tmpfs")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	ctx := context.Background()
	s, err := Open(dir, memory.New(nil, 0), Options{Clock: limiter.NewClock()})
	if err != nil {
		t.Fatal(err)
	}
	var written []string
	var failed error
	for i := 0; failed == nil && i < 100_000; i++ {
		def := limiter.Definition{Name: fmt.Sprintf("limiter-%06d-%s", i, strings.Repeat("x", 100)), Policy: limiter.Policy{Limit: 5, Period: time.Minute}}
		if _, err := s.Put(ctx, def); err != nil {
			failed = err
			if _, err := s.Get(ctx, def.Name); !errors.Is(err, limiter.ErrNotFound) {
				t.Errorf("the limiter whose write failed: Get says %v, want ErrNotFound", err)
			}
			break
		}
		written = append(written, def.Name)
	}
	if !errors.Is(failed, limiter.ErrNotDurable) {
		t.Fatalf("filling a 256 KiB disk: got %v after %d limiters, want ErrNotDurable", failed, len(written))
	}
	t.Logf("%d limiters written before: %v", len(written), failed)
	if got := len(list(t, s)); got != len(written) {
		t.Errorf("in memory: %d limiters, want %d", got, len(written))
	}
	s.Close()
	var got []string
	for _, def := range list(t, open(t, dir)) {
		got = append(got, def.Name)
	}
	if !reflect.DeepEqual(got, written) {
		t.Errorf("after reopening: %d limiters, want the %d written", len(got), len(written))
	}
}

// TestStoreSuite runs the behavioural suite every limiter.Store passes on
// a Store whose definitions are kept in a data file.
func TestStoreSuite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) limiter.Store { return open(t, t.TempDir()) })
}
