package bolt

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// written returns the bytes of a data file written by the store: the
// definitions, with n more limiters, and a snapshot of their state and of
// a tenant's, saved by a graceful shutdown.
func written(t *testing.T, n int) []byte {
	t.Helper()
	dir := t.TempDir()
	wall := clocktest.New(time.Unix(1_700_000_000, 0))
	r, _ := start(t, dir, wall)
	putDefs(t, r.store)
	for i := range n {
		def := defs[i%len(defs)]
		def.Name = fmt.Sprintf("%s-%03d", def.Name, i)
		def.Group = ""
		if _, err := r.store.Put(context.Background(), def); err != nil {
			t.Fatal(err)
		}
	}
	r.use(t, rand.New(rand.NewPCG(6, 6)))
	if err := r.store.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// value returns the value the file b holds under key in the bucket at
// path (nested buckets, outermost first).
func value(t *testing.T, b []byte, key []byte, path ...string) []byte {
	t.Helper()
	file := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(file, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v []byte
	err = db.View(func(tx *bbolt.Tx) error {
		bk := tx.Bucket([]byte(path[0]))
		for _, name := range path[1:] {
			if bk == nil {
				break
			}
			bk = bk.Bucket([]byte(name))
		}
		if bk == nil {
			return fmt.Errorf("no bucket %v", path)
		}
		v = bytes.Clone(bk.Get(key))
		return nil
	})
	if err != nil || v == nil {
		t.Fatalf("%v/%q: %v, found %v", path, key, err, v != nil)
	}
	return v
}

// flip returns a copy of the file b with bit of byte i of the value v
// flipped, wherever the file holds v (pages a transaction replaced may hold
// it too: the copy that the file uses is among them).
func flip(t *testing.T, b, v []byte, i int, bit byte) []byte {
	t.Helper()
	b = bytes.Clone(b)
	found := 0
	for off := 0; ; {
		j := bytes.Index(b[off:], v)
		if j < 0 {
			break
		}
		b[off+j+i] ^= bit
		off += j + len(v)
		found++
	}
	if found == 0 {
		t.Fatalf("the value %q is not in the file", v)
	}
	return b
}

// size returns the bytes of the file b that its pages take, and its page
// size, as bbolt reads them from its meta page.
func size(t *testing.T, b []byte) (used, page int) {
	t.Helper()
	file := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(file, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bbolt.Tx) error { used = int(tx.Size()); return nil })
	return used, db.Info().PageSize
}

// startOn starts a store, with the tenants, on a copy of the file b, and
// returns the error that refused it, nil if it started.
func startOn(t *testing.T, b []byte) (path string, err error) {
	t.Helper()
	dir := t.TempDir()
	path = filepath.Join(dir, FileName)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	clock := clocktest.New(time.Unix(1_700_000_000, 0)).Limiter()
	reg, err := tenant.New(tenantConfig, clock)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, memory.New(clock, 0), Options{Clock: clock, Tenants: reg})
	if err != nil {
		return path, err
	}
	defer s.Close()
	_, err = s.Restore(nil)
	return path, err
}

// A bit flipped in any record's value, a definition's or a saved bucket
// state's, refuses the file at start-up, naming it, the record and the
// reason. bbolt checks its pages' structure, not what they hold: without a
// checksum of its own, the file loads what the flip made of it (a limit of
// 5 made 7, a bucket used up made full).
func TestBitFlipRefused(t *testing.T) {
	b := written(t, 0)
	chunk0 := binary.BigEndian.AppendUint64(nil, 0)
	for _, tc := range []struct {
		name   string
		key    []byte
		path   []string
		record string
	}{
		{"a definition", []byte("api"), []string{"limiters"}, `limiters/"api"`},
		{"the state header", headerKey, []string{"state"}, `state/"header"`},
		{"the state of the limiters", chunk0, []string{"state", "limiters"}, "state/limiters/0"},
		{"the state of the tenants", chunk0, []string{"state", "tenants"}, "state/tenants/0"},
		{"the format", formatKey, []string{"meta"}, `meta/"format"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := value(t, b, tc.key, tc.path...)
			for i := range v {
				bit := byte(1) << (i % 8)
				path, err := startOn(t, flip(t, b, v, i, bit))
				if err == nil {
					t.Errorf("byte %d of %d, bit %#x flipped: the file was loaded", i, len(v), bit)
					continue
				}
				if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.record) {
					t.Errorf("byte %d, bit %#x flipped: got %q, want it to name %s and the record %s", i, bit, err, path, tc.record)
				}
			}
		})
	}
	// The flip of the example: "limit":5 made "limit":7.
	v := value(t, b, []byte("api"), "limiters")
	i := bytes.Index(v, []byte(`"limit":5,`)) + len(`"limit":`)
	path, err := startOn(t, flip(t, b, v, i, 0x02))
	if err == nil || !strings.Contains(err.Error(), "checksum mismatch") || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `limiters/"api"`) {
		t.Errorf("a limit of 5 made 7: got %v, want a checksum mismatch naming %s and limiters/\"api\"", err, path)
	}
}

// A record moved under another key, or into another bucket, is refused: its
// checksum covers where it is.
func TestMovedRecordRefused(t *testing.T) {
	b := written(t, 0)
	for _, tc := range []struct {
		name   string
		move   func(tx *bbolt.Tx) error
		record string
	}{
		{"a definition under another name", func(tx *bbolt.Tx) error {
			lim := tx.Bucket(limitersBucket)
			return lim.Put([]byte("apj"), bytes.Clone(lim.Get([]byte("api"))))
		}, `limiters/"apj"`},
		{"the state of the limiters as the tenants'", func(tx *bbolt.Tx) error {
			st := tx.Bucket(stateBucket)
			v := bytes.Clone(st.Bucket([]byte("limiters")).Get(binary.BigEndian.AppendUint64(nil, 0)))
			if err := st.DeleteBucket([]byte("tenants")); err != nil {
				return err
			}
			tb, err := st.CreateBucket([]byte("tenants"))
			if err != nil {
				return err
			}
			return tb.Put(binary.BigEndian.AppendUint64(nil, 0), v)
		}, "state/tenants/0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, FileName)
			if err := os.WriteFile(file, b, 0o600); err != nil {
				t.Fatal(err)
			}
			db, err := bbolt.Open(file, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(tc.move)
			db.Close()
			if err != nil {
				t.Fatal(err)
			}
			moved, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			path, err := startOn(t, moved)
			if err == nil || !strings.Contains(err.Error(), "checksum mismatch") || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.record) {
				t.Errorf("got %v, want a checksum mismatch naming %s and %s", err, path, tc.record)
			}
		})
	}
}

// A file cut short, at any length, is refused with its path and a reason,
// never with what a page read past its end made of it (a nil pointer
// dereference recovered, say).
func TestTruncatedFileRefused(t *testing.T) {
	b := written(t, 300)
	used, page := size(t, b)
	if used < 6*page || used > len(b) {
		t.Fatalf("the file uses %d bytes of its %d: want a few data pages", used, len(b))
	}
	for _, n := range []int{1, 100, page - 1, page, page + 100, 2*page - 1, 2 * page, 2*page + 1, 3*page + 7, used / 2, used - page, used - page/2, used - 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			path, err := startOn(t, b[:n])
			if err == nil {
				t.Fatalf("cut to %d of %d bytes: the file was loaded", n, len(b))
			}
			msg := err.Error()
			if !strings.Contains(msg, path) || !strings.Contains(msg, "not a data file this service can read") {
				t.Errorf("cut to %d bytes: got %q, want it to name %s and say it cannot be read", n, msg, path)
			}
			for _, leak := range []string{"runtime error", "nil pointer", "invalid memory address", "fault"} {
				if strings.Contains(msg, leak) {
					t.Errorf("cut to %d bytes: got %q, which says %q", n, msg, leak)
					break
				}
			}
		})
	}
}

// limitersOf lists the definitions the store holds.
func limitersOf(t *testing.T, s limiter.Store) []limiter.Definition {
	t.Helper()
	got, err := s.List(context.Background(), "", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A file of format 1, written before records carried checksums (by the
// store as it was then: testdata/format1.db.gz holds the definitions, with
// permits taken at the wall time below, and a graceful shutdown), is read
// as it was and rewritten with a checksum on every record.
func TestFormat1FileUpgraded(t *testing.T) {
	gz, err := os.Open(filepath.Join("testdata", "format1.db.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer gz.Close()
	zr, err := gzip.NewReader(gz)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// What the store that wrote the file could take, at its shutdown.
	want := map[string]int64{"api": 4, "burst": 8, "grouped": 6, "log": 8, "per-user/alice": 2, "tenant": 7}
	var wantDefs []limiter.Definition
	for _, def := range defs {
		wantDefs = append(wantDefs, def.Normalize())
	}
	slices.SortFunc(wantDefs, func(a, b limiter.Definition) int { return strings.Compare(a.Name, b.Name) })
	wall := clocktest.New(time.Unix(1_700_000_000, 0))
	for _, run := range []string{"the first start, which rewrites the file", "the start after it"} {
		r, restored := start(t, dir, wall)
		if restored.Crashed || restored.Bytes == 0 {
			t.Fatalf("%s: restored %+v, want a clean snapshot", run, restored)
		}
		if got := limitersOf(t, r.store); !reflect.DeepEqual(got, wantDefs) {
			t.Errorf("%s: limiters\ngot  %+v\nwant %+v", run, got, wantDefs)
		}
		if got := r.remaining(t); !mapsEqual(got, want) {
			t.Errorf("%s: remaining %v, want %v", run, got, want)
		}
		if err := r.store.Close(); err != nil {
			t.Fatal(err)
		}
		db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		err = db.View(func(tx *bbolt.Tx) error {
			if got := string(tx.Bucket(metaBucket).Get(formatKey)); got != string(seal("meta", formatKey, []byte(format))) {
				return fmt.Errorf("format %q, want %q with its checksum", got, format)
			}
			if err := verify(tx); err != nil {
				return err
			}
			return checkContents(tx)
		})
		db.Close()
		if err != nil {
			t.Errorf("%s: the file after it: %v", run, err)
		}
	}
}

// A page in use whose header is damaged (its number, its type, its count
// of elements or of overflow pages) is refused with the file named and a
// reason, never with a panic: bbolt asserts these fields, and Tx.Check does
// it in a goroutine of its own, where a failed assertion ends the process.
func TestDamagedPageHeaderRefused(t *testing.T) {
	b := written(t, 300)
	used, page := size(t, b)
	var inUse []int // the pages in use, overflow pages left out
	file := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(file, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.View(func(tx *bbolt.Tx) error {
		for id := 2; id < used/page; {
			info, err := tx.Page(id)
			if err != nil || info == nil {
				t.Fatalf("page %d: %+v, %v", id, info, err)
			}
			if info.Type == "free" {
				id++
				continue
			}
			inUse = append(inUse, id)
			id += 1 + info.OverflowCount
		}
		return nil
	})
	db.Close()
	for _, id := range inUse {
		for _, field := range []struct {
			name string
			off  int
			v    byte
		}{{"number", 0, 0x55}, {"type", 8, 0x01}, {"type", 8, 0x10}, {"count", 10, 0xff}, {"count", 11, 0xff}, {"overflow", 12, 0x7f}} {
			c := bytes.Clone(b)
			c[id*page+field.off] = field.v
			if bytes.Equal(c, b) {
				continue
			}
			path, err := startOn(t, c)
			if err == nil {
				t.Errorf("page %d, its %s set to %#x: the file was loaded", id, field.name, field.v)
				continue
			}
			msg := err.Error()
			if !strings.Contains(msg, path) || !strings.Contains(msg, "not a data file this service can read") {
				t.Errorf("page %d, its %s set to %#x: got %q, want it to name %s and say it cannot be read", id, field.name, field.v, msg, path)
			}
			if strings.Contains(msg, "runtime error") || strings.Contains(msg, "assertion failed") {
				t.Errorf("page %d, its %s set to %#x: got %q", id, field.name, field.v, msg)
			}
		}
	}
	t.Logf("%d pages in use of %d", len(inUse), used/page)
}

// A record dropped from the file, whole, is refused: with a bit flipped
// in the count of a leaf page's elements, the last of them is gone (the
// tenants' saved state, or the whole state bucket) and every record left
// has its checksum; so do a definition, a table's state or the state
// deleted.
func TestDroppedRecordRefused(t *testing.T) {
	b := written(t, 0)
	file := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	used, page := size(t, b)
	db, err := bbolt.Open(file, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var leaves []int
	db.View(func(tx *bbolt.Tx) error {
		for id := 2; id < used/page; id++ {
			if info, err := tx.Page(id); err == nil && info != nil && info.Type == "leaf" {
				leaves = append(leaves, id)
			}
		}
		return nil
	})
	db.Close()
	type damage struct {
		name string
		file []byte
	}
	var cases []damage
	for _, id := range leaves {
		c := bytes.Clone(b)
		c[id*page+10] ^= 1 // the low byte of the page's count of elements
		cases = append(cases, damage{fmt.Sprintf("leaf page %d, its count's low bit flipped", id), c})
	}
	for _, d := range []struct {
		name string
		drop func(tx *bbolt.Tx) error
	}{
		{"a definition deleted", func(tx *bbolt.Tx) error { return tx.Bucket(limitersBucket).Delete([]byte("log")) }},
		{"the tenants' state deleted", func(tx *bbolt.Tx) error { return tx.Bucket(stateBucket).DeleteBucket([]byte("tenants")) }},
		{"the state deleted", func(tx *bbolt.Tx) error { return tx.DeleteBucket(stateBucket) }},
		{"the state header deleted", func(tx *bbolt.Tx) error { return tx.Bucket(stateBucket).Delete(headerKey) }},
	} {
		f := filepath.Join(t.TempDir(), FileName)
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		db, err := bbolt.Open(f, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = db.Update(d.drop)
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		c, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, damage{d.name, c})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path, err := startOn(t, tc.file)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a data file this service can read") {
				t.Errorf("got %v, want it refused, naming %s", err, path)
			}
		})
	}
}
