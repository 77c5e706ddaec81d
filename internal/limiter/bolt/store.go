// Package bolt keeps the embedded backend's limiters on disk, in one bbolt
// file, so that they survive a restart of the process.
package bolt

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// FileName is the name of the data file in its directory.
const FileName = "ratelimiter.db"

// format is what the data file's meta bucket holds under formatKey, with
// its checksum (see checksum.go): a file without it was not written by
// this package, and one with another value by a version that this one
// cannot read, except format1.
const format = "ratelimiter 2"

// format1 is the format of the files written before every record carried
// a checksum: the same records, without it. Open reads such a file and
// rewrites it as one of format.
const format1 = "ratelimiter 1"

var (
	metaBucket     = []byte("meta")
	formatKey      = []byte("format")
	limitersBucket = []byte("limiters")
)

// DefaultLockWait is how long Open waits, unless told otherwise, for
// another process to let go of the file: bbolt holds an exclusive lock on
// it while open. A replacement pod (or a service restarted by a
// supervisor) can start while its predecessor still drains; 25 seconds
// covers a graceful shutdown and stays under the 30 seconds after which
// the chart's liveness probe restarts a container that does not listen.
const DefaultLockWait = 25 * time.Second

// lockPoll is how long each attempt to take the lock waits.
const lockPoll = time.Second

var _ limiter.BatchStore = (*Store)(nil)

// Store is a memory.Store whose definitions are also kept in a bbolt file.
// Decisions are the memory store's, untouched: they never wait for the
// disk. A definition created, replaced or deleted through Put or Delete is
// on disk, synced, before the call returns nil; when the write fails the
// call returns an error wrapping limiter.ErrNotDurable and the store keeps
// the definition it had. Open reads the definitions back. The state of the
// memory store's limiters, and of the other tables Options names, is saved
// in snapshots and restored by Restore, by the rules state.go states.
//
// Store is safe for concurrent use; changes to definitions are made one at
// a time, decisions in parallel with them and with each other.
type Store struct {
	*memory.Store
	db     *bbolt.DB
	path   string
	mu     sync.Mutex // serializes Put and Delete, so that the file and mem agree
	clock  *limiter.Clock
	wall   func() time.Time
	tables map[string]Table // by name, the memory store's "limiters" among them

	saveMu  sync.Mutex     // one Save at a time
	sizes   map[string]int // each table's last snapshot size, under saveMu
	refunds atomic.Uint64  // refunds and settlements with a key decided (see sync)
	saved   uint64         // how many of them the last snapshot holds, under saveMu
	saver   *saver         // set by Restore
	closeMu sync.Mutex
	closed  bool
}

// Options configures a Store beyond its memory store.
type Options struct {
	// Clock is the Clock the memory store and Tenants decide on, whose
	// readings the snapshots record. It is required.
	Clock *limiter.Clock
	// Tenants, when not nil, is saved and restored with the limiters:
	// the per-IP tenants, on the same Clock.
	Tenants Table
	// Wall reads the wall clock, for the time credited across a restart;
	// time.Now when nil.
	Wall func() time.Time
	// LockWait is how long Open waits for another process to let go of
	// the file; DefaultLockWait when 0. OnLockWait, when not nil, is
	// called once if it has to wait.
	LockWait   time.Duration
	OnLockWait func()
}

// Open opens (or creates) the data file in dir, creating dir if need be,
// and puts the limiters it holds into mem, which should be empty and decide
// on opts.Clock (Restore then reads their state back). It
// refuses a file it cannot trust rather than start empty: one that another
// process holds open, one that is not a bbolt file, is corrupt or shorter
// than its pages, one that bbolt reads but this package did not write, one
// with a record whose checksum does not match (see checksum.go) or whose
// records do not add up to its contents record (see contents.go), and one
// holding a definition that mem refuses (more limiters than its maximum,
// say); the error names the file and, for a checksum, the record. A file
// of format 1 is rewritten with checksums once read. It waits up to
// opts.LockWait for a process that holds the file to let go of it. The caller
// closes the Store once nothing uses it.
func Open(dir string, mem *memory.Store, opts Options) (*Store, error) {
	if opts.Clock == nil {
		return nil, errors.New("bolt: open: no clock")
	}
	if opts.Wall == nil {
		opts.Wall = time.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bolt: data directory: %w", err)
	}
	path := filepath.Join(dir, FileName)
	if fi, err := os.Stat(path); err == nil && fi.Size() == 0 {
		// bbolt would make a new file of it; an empty file where one was
		// written is a file lost, not a new start.
		return nil, fmt.Errorf("bolt: %s is empty: %w; move it aside to start empty", path, errUnreadable)
	}
	if opts.LockWait <= 0 {
		opts.LockWait = DefaultLockWait
	}
	db, err := openDB(path)
	for deadline := time.Now().Add(opts.LockWait); errors.Is(err, bolterrors.ErrTimeout) && time.Now().Before(deadline); {
		if opts.OnLockWait != nil {
			opts.OnLockWait()
			opts.OnLockWait = nil
		}
		db, err = openDB(path)
	}
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, fmt.Errorf("bolt: %s is in use by another process, still after %s (a second instance on the same data directory?)", path, opts.LockWait)
	case errors.Is(err, errTruncated):
		return nil, fmt.Errorf("bolt: %s: %w; move it aside to start empty", path, err)
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrChecksum), errors.Is(err, bolterrors.ErrVersionMismatch), errors.Is(err, errUnreadable):
		if !errors.Is(err, errUnreadable) {
			err = fmt.Errorf("%w: %w", errUnreadable, err)
		}
		return nil, fmt.Errorf("bolt: %s: %w (corrupt, truncated or of another program); move it aside to start empty", path, err)
	case err != nil:
		var perr *fs.PathError
		if errors.As(err, &perr) {
			return nil, fmt.Errorf("bolt: %w", err) // it names the file
		}
		return nil, fmt.Errorf("bolt: %s: %w", path, err)
	}
	s := &Store{Store: mem, db: db, path: path, clock: opts.Clock, wall: opts.Wall, tables: map[string]Table{"limiters": mem}, sizes: make(map[string]int)}
	if opts.Tenants != nil {
		s.tables["tenants"] = opts.Tenants
	}
	if err := s.load(); err != nil {
		db.Close()
		if errors.Is(err, errUnreadable) {
			return nil, fmt.Errorf("bolt: %s: %w; move it aside to start empty", path, err)
		}
		return nil, fmt.Errorf("bolt: %s: %w", path, err)
	}
	return s, nil
}

// load checks the file's format, the checksum of every record and its
// contents record, writing them into a new file, and puts the limiters the
// file holds into the memory store; it rewrites a file of format1 with
// checksums, and its contents record, once read. It writes nothing to a
// file it refuses.
func (s *Store) load() error {
	var fresh, old bool
	err := s.db.View(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(metaBucket)
		if meta == nil {
			fresh = true
			return tx.ForEach(func([]byte, *bbolt.Bucket) error { return errForeign })
		}
		var err error
		if old, err = checkFormat(meta.Get(formatKey)); err != nil {
			return err
		}
		if tx.Bucket(limitersBucket) == nil {
			return fmt.Errorf("%w: no %s bucket", errForeign, limitersBucket)
		}
		if !old {
			if err := verify(tx); err != nil {
				return err
			}
			if err := checkContents(tx); err != nil {
				return err
			}
		} else if st := tx.Bucket(stateBucket); st != nil && st.Get(headerKey) != nil {
			if _, err := decodeHeader(st.Get(headerKey)); err != nil {
				return err
			}
		}
		return tx.Bucket(limitersBucket).ForEach(func(k, v []byte) error {
			if !old {
				v = v[:len(v)-checksumSize] // verified above
			}
			def, err := decode(string(k), v)
			if err != nil {
				return err
			}
			if _, err := s.Store.Put(context.Background(), def); err != nil {
				return fmt.Errorf("limiter %q: %w", def.Name, err)
			}
			return nil
		})
	})
	switch {
	case err != nil:
		return err
	case old:
		if err := s.db.Update(upgrade); err != nil {
			return fmt.Errorf("rewrite with checksums: %w", err)
		}
		return nil
	case !fresh:
		return nil
	}
	return s.db.Update(func(tx *bbolt.Tx) error {
		meta, err := tx.CreateBucket(metaBucket)
		if err != nil {
			return err
		}
		if err := meta.Put(formatKey, seal(string(metaBucket), formatKey, []byte(format))); err != nil {
			return err
		}
		if _, err = tx.CreateBucket(limitersBucket); err != nil {
			return err
		}
		return putContents(tx, contents{})
	})
}

var (
	errForeign    = errors.New("not a ratelimiter data file")
	errUnreadable = errors.New("not a data file this service can read")
	errTruncated  = errors.New("truncated")
)

// openDB opens the bbolt file at path and checks every page of it. A file
// shorter than the pages its meta page counts (one cut short) is refused
// before bbolt reads past its end, which faults: see checkSize. bbolt
// panics on some corrupt pages rather than return an error: openDB turns
// that into an error wrapping errUnreadable, at start-up, rather than let
// it happen while serving.
func openDB(path string) (db *bbolt.DB, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			if db != nil {
				db.Close()
			}
			// What bbolt made of the page (a nil pointer, a fault) says
			// nothing to whoever reads the error.
			db, err = nil, fmt.Errorf("%w: a page of it cannot be read", errUnreadable)
		}
	}()
	if err := checkSize(path); err != nil {
		return nil, err
	}
	db, err = bbolt.Open(path, 0o600, &bbolt.Options{Timeout: lockPoll})
	if err != nil {
		return nil, err
	}
	err = db.View(func(tx *bbolt.Tx) error {
		if err := checkPages(tx, path, db.Info().PageSize); err != nil {
			return err
		}
		readAll(tx)
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("%w: %w", errUnreadable, err)
	}
	return db, nil
}

// checkPages checks the header of every page in use of the file at path,
// as Tx.Check asserts it: that it holds the page's own number and one type,
// and that its overflow pages are in use, before the last page.
// Tx.Check asserts it in a goroutine of its own, where a failed assertion
// ends the process; checkPages returns an error instead. A page's number
// is the first field of its header, in the machine's byte order, as bbolt
// writes it.
func checkPages(tx *bbolt.Tx, path string, pageSize int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var hdr [8]byte
	for id := 2; ; {
		info, err := tx.Page(id)
		switch {
		case err != nil:
			return err
		case info == nil: // past the last page
			return nil
		case info.Type == "free":
			id++
			continue
		case info.Type != "branch" && info.Type != "leaf" && info.Type != "freelist":
			return fmt.Errorf("page %d: of type %s", id, info.Type)
		}
		if _, err := f.ReadAt(hdr[:], int64(id)*int64(pageSize)); err != nil {
			return err
		}
		if got := binary.NativeEndian.Uint64(hdr[:]); got != uint64(id) {
			return fmt.Errorf("page %d: its header says page %d", id, got)
		}
		// Its overflow pages are freed with it: a free one among them
		// would be freed twice, a failed assertion in a later write.
		for o := id + 1; o <= id+info.OverflowCount; o++ {
			switch next, err := tx.Page(o); {
			case err != nil:
				return err
			case next == nil:
				return fmt.Errorf("page %d: its %d overflow pages run past the last page", id, info.OverflowCount)
			case next.Type == "free":
				return fmt.Errorf("page %d: its overflow page %d is free", id, o)
			}
		}
		id += 1 + info.OverflowCount
	}
}

// readAll reads every key and value of every bucket of the file, as
// Tx.Check does: a page that bbolt cannot read then panics or faults here,
// in the goroutine that openDB recovers, rather than in the one that
// Tx.Check starts, where a panic ends the process.
func readAll(tx *bbolt.Tx) (sum byte) {
	var visit func(b *bbolt.Bucket)
	visit = func(b *bbolt.Bucket) {
		b.ForEach(func(k, v []byte) error {
			if v == nil {
				if nested := b.Bucket(k); nested != nil {
					visit(nested)
				}
				return nil
			}
			// A value is one run of the memory map: its ends are in it.
			if len(v) > 0 {
				sum += v[0] ^ v[len(v)-1]
			}
			return nil
		})
	}
	tx.ForEach(func(_ []byte, b *bbolt.Bucket) error { visit(b); return nil })
	return sum
}

// checkSize refuses a file at path shorter than the pages its meta page
// counts, with an error wrapping errUnreadable and errTruncated. It opens the file read-only,
// which reads its meta pages and nothing else, and asks the size the pages
// take (Tx.Size). A file that does not exist yet passes; one that another
// process holds gives bbolt's ErrTimeout, as opening it would.
func checkSize(path string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: lockPoll})
	var perr *fs.PathError
	switch {
	case errors.Is(err, bolterrors.ErrTimeout), errors.Is(err, bolterrors.ErrInvalid),
		errors.Is(err, bolterrors.ErrChecksum), errors.Is(err, bolterrors.ErrVersionMismatch), errors.As(err, &perr):
		return err
	case err != nil:
		// "file size too small", shorter than the two meta pages.
		return fmt.Errorf("%w: %w", errUnreadable, err)
	}
	defer db.Close()
	var need int64
	db.View(func(tx *bbolt.Tx) error { need = tx.Size(); return nil })
	if fi.Size() < need {
		return fmt.Errorf("%w: %w: %d bytes, and its pages take %d", errUnreadable, errTruncated, fi.Size(), need)
	}
	return nil
}

// Put creates or replaces a limiter as memory.Store.Put does, and writes
// its definition to the file before returning. Should the write fail, the
// memory store is put back as it was: for that short while decisions saw
// the new definition, and what they took from it is forgotten with it.
func (s *Store) Put(ctx context.Context, def limiter.Definition) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	created, undo, err := s.Store.PutUndo(ctx, def)
	if err != nil {
		return false, err
	}
	v, err := encode(def.Normalize())
	if err == nil {
		err = s.db.Update(func(tx *bbolt.Tx) error {
			b, k := tx.Bucket(limitersBucket), []byte(def.Name)
			added := b.Get(k) == nil
			if err := b.Put(k, seal(string(limitersBucket), k, v)); err != nil || !added {
				return err
			}
			return updateContents(tx, func(c *contents) { c.limiters++ })
		})
	}
	if err != nil {
		undo()
		return false, fmt.Errorf("bolt: put %q: %w: %w", def.Name, limiter.ErrNotDurable, err)
	}
	return created, nil
}

// Delete removes a limiter from the file, then from the memory store.
func (s *Store) Delete(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.Store.Get(ctx, name); err != nil {
		return err
	}
	err := s.db.Update(func(tx *bbolt.Tx) error {
		b, k := tx.Bucket(limitersBucket), []byte(name)
		if b.Get(k) == nil {
			return nil
		}
		if err := b.Delete(k); err != nil {
			return err
		}
		return updateContents(tx, func(c *contents) { c.limiters-- })
	})
	if err != nil {
		return fmt.Errorf("bolt: delete %q: %w: %w", name, limiter.ErrNotDurable, err)
	}
	return s.Store.Delete(ctx, name)
}

// DeleteIdle deletes a limiter that holds no counts, as Delete does; see
// limiter.IdleDeleter. A limiter that takes counts between the check and
// the deletion loses them with it, as with Delete.
func (s *Store) DeleteIdle(ctx context.Context, name string) error {
	if err := s.Store.Idle(name); err != nil {
		return err
	}
	return s.Delete(ctx, name)
}

// Path returns the data file's path.
func (s *Store) Path() string { return s.path }

// record is a definition as the file keeps it, under the limiter's name.
type record struct {
	Limit     int64  `json:"limit"`
	PeriodNS  int64  `json:"period_ns"`
	Algorithm string `json:"algorithm"`
	Burst     int64  `json:"burst,omitempty"`
	Group     string `json:"group,omitempty"`
	Keyed     bool   `json:"keyed,omitempty"`
	MaxKeys   int    `json:"max_keys,omitempty"`
}

func encode(def limiter.Definition) ([]byte, error) {
	p := def.Policy
	return json.Marshal(record{Limit: p.Limit, PeriodNS: int64(p.Period), Algorithm: string(p.Algorithm), Burst: p.Burst,
		Group: def.Group, Keyed: def.Keyed, MaxKeys: def.MaxKeys})
}

// decode reads the definition of the limiter name, refusing one that no
// Put could have written.
func decode(name string, v []byte) (limiter.Definition, error) {
	var r record
	if err := json.Unmarshal(v, &r); err != nil {
		return limiter.Definition{}, fmt.Errorf("limiter %q: %w", name, err)
	}
	def := limiter.Definition{
		Name:   name,
		Policy: limiter.Policy{Limit: r.Limit, Period: time.Duration(r.PeriodNS), Algorithm: limiter.Algorithm(r.Algorithm), Burst: r.Burst},
		Group:  r.Group, Keyed: r.Keyed, MaxKeys: r.MaxKeys,
	}
	for _, err := range []error{limiter.CheckName(name), def.Policy.Validate(), limiter.CheckGroup(def.Group), limiter.CheckKeyed(def)} {
		if err != nil {
			return limiter.Definition{}, fmt.Errorf("limiter %q: %w", name, err)
		}
	}
	return def, nil
}
