package bolt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// What the file keeps of the limiters' state, beside their definitions:
//
//   - a snapshot of every table (the memory store's limiters and keys, and
//     the per-IP tenants), written by Save: at a graceful shutdown (Close)
//     and every SaveInterval while the service runs;
//   - a header saying whether the process that wrote it is still running,
//     and the instant of the snapshot, on the wall clock and on the Clock
//     the tables decide on.
//
// At start-up Restore reads the snapshot back. After a graceful shutdown
// the header says "stopped" and nothing was decided after the snapshot: the
// state is restored exactly, with the time that passed while the service
// was down (on the wall clock) credited as the algorithms define. When the
// header still says "running", the process ended without Close (a crash,
// SIGKILL, a lost node) and grants made after the last snapshot are lost
// with it: every bucket, of every limiter and every key (those never seen
// included) is then restored exhausted at the restart, as if it had
// granted then everything it held (see limiter.Bucket.Exhaust). No limit
// can be exceeded across the crash; the cost is that a caller may be
// denied for up to one period after it.

// SaveInterval is how often a running Store saves the tables' state.
const SaveInterval = 10 * time.Second

// chunkSize is the most bytes of a table's state in one value of the file.
const chunkSize = 1 << 20

var (
	stateBucket = []byte("state")
	headerKey   = []byte("header")
)

// The header's run states.
const (
	stopped = 1 // Close saved the state: nothing was decided after it
	running = 2 // a process decides on this file, or crashed doing so
)

// header is the state bucket's header: run state, then the snapshot's
// instant on the wall clock (Unix nanoseconds) and on the tables' Clock,
// both 0 before the first snapshot.
type header struct {
	run         byte
	wall, clock int64
}

func (h header) encode() []byte {
	b := []byte{h.run}
	b = binary.AppendVarint(b, h.wall)
	return binary.AppendVarint(b, h.clock)
}

func decodeHeader(b []byte) (header, error) {
	if len(b) < 1 || b[0] != stopped && b[0] != running {
		return header{}, fmt.Errorf("%w: state header", errUnreadable)
	}
	h := header{run: b[0]}
	var n int
	if h.wall, n = binary.Varint(b[1:]); n <= 0 {
		return header{}, fmt.Errorf("%w: state header", errUnreadable)
	}
	if h.clock, n = binary.Varint(b[1+n:]); n <= 0 {
		return header{}, fmt.Errorf("%w: state header", errUnreadable)
	}
	return h, nil
}

// Table is a table whose state the file keeps: memory.Store and
// tenant.Registry are.
type Table interface {
	// AppendState appends the table's state to b.
	AppendState(b []byte) []byte
	// RestoreState reads what AppendState wrote, shifting its instants by
	// shift nanoseconds onto the table's Clock and, with crashed,
	// exhausting every bucket at now; an empty b records nothing.
	RestoreState(b []byte, shift int64, crashed bool, now int64) error
}

// Restored is what Restore found and did.
type Restored struct {
	// Crashed reports that the previous process ended without Close: the
	// buckets were restored exhausted.
	Crashed bool
	// SavedAt is when the snapshot restored was taken, on the wall clock;
	// zero when there was none.
	SavedAt time.Time
	// Bytes is the size of the snapshot restored.
	Bytes int
}

// saver is the periodic saving that Restore starts and Close ends.
type saver struct {
	stop chan struct{}
	done sync.WaitGroup
}

// Restore reads the last snapshot into the memory store and the other
// tables, as the file's header says (see above), marks the file as in use
// by a running process, and starts saving the state every SaveInterval,
// reporting failures to onError (the previous snapshot then stays). It is
// called once, after the definitions are in place (Open, and those of the
// configuration) and before any decision.
func (s *Store) Restore(onError func(error)) (Restored, error) {
	var (
		h      header
		found  bool
		chunks = make(map[string][]byte)
	)
	err := s.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(stateBucket)
		if b == nil {
			return nil
		}
		v := b.Get(headerKey)
		if v == nil {
			return nil
		}
		v, err := unseal(string(stateBucket), headerKey, v)
		if err != nil {
			return err
		}
		if h, err = decodeHeader(v); err != nil {
			return err
		}
		found = true
		for name := range s.tables {
			tb := b.Bucket([]byte(name))
			if tb == nil {
				continue
			}
			path := string(stateBucket) + "/" + name
			var buf []byte
			if err := tb.ForEach(func(k, v []byte) error {
				v, err := unseal(path, k, v)
				buf = append(buf, v...)
				return err
			}); err != nil {
				return err
			}
			chunks[name] = buf
		}
		return nil
	})
	if err != nil {
		return Restored{}, fmt.Errorf("bolt: %s: %w", s.path, err)
	}
	r := Restored{Crashed: found && h.run == running}
	now, wall := s.clock.Now(), s.wall()
	if found && h.wall != 0 {
		r.SavedAt = time.Unix(0, h.wall)
		// The snapshot's Clock read h.clock at the wall time h.wall; the
		// time since on the wall clock is credited (none if it went back).
		shift := now - max(0, wall.UnixNano()-h.wall) - h.clock
		for name, t := range s.tables {
			b := chunks[name]
			r.Bytes += len(b)
			if err := t.RestoreState(b, shift, r.Crashed, now); err != nil {
				return Restored{}, fmt.Errorf("bolt: %s: state of the %s: %w", s.path, name, err)
			}
		}
	} else if r.Crashed {
		// Crashed before its first snapshot: every bucket is exhausted.
		for name, t := range s.tables {
			if err := t.RestoreState(nil, 0, true, now); err != nil {
				return Restored{}, fmt.Errorf("bolt: %s: state of the %s: %w", s.path, name, err)
			}
		}
	}
	h.run = running
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(stateBucket)
		if err != nil {
			return err
		}
		if err := b.Put(headerKey, seal(string(stateBucket), headerKey, h.encode())); err != nil {
			return err
		}
		return updateContents(tx, func(c *contents) { c.state = true })
	}); err != nil {
		return Restored{}, fmt.Errorf("bolt: %s: mark the file in use: %w", s.path, err)
	}
	s.saver = &saver{stop: make(chan struct{})}
	s.saver.done.Add(1)
	go func() {
		defer s.saver.done.Done()
		t := time.NewTicker(SaveInterval)
		defer t.Stop()
		for {
			select {
			case <-s.saver.stop:
				return
			case <-t.C:
				if err := s.Save(false); err != nil && onError != nil {
					onError(err)
				}
			}
		}
	}()
	return r, nil
}

// Save writes a snapshot of every table to the file, replacing the last,
// in one transaction: the file holds the old snapshot or the new one,
// whole. With clean it also marks the file as no longer in use (Close
// does; nothing may be decided after it).
func (s *Store) Save(clean bool) error {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	return s.save(clean)
}

// save is Save under saveMu.
func (s *Store) save(clean bool) error {
	// Every refund counted by now has been decided: this snapshot holds it.
	covers := s.refunds.Load()
	h := header{run: running}
	if clean {
		h.run = stopped
	}
	// The two readings of the snapshot's instant, taken together; the
	// tables' states are read after them, so no state is older.
	h.clock, h.wall = s.clock.Now(), s.wall().UnixNano()
	states := make(map[string][]byte, len(s.tables))
	for name, t := range s.tables {
		// Room for the last snapshot's size and a little more, so that a
		// table of a million keys is not copied over and over as it grows.
		n := s.sizes[name]
		states[name] = t.AppendState(make([]byte, 0, n+n/8))
		s.sizes[name] = len(states[name])
	}
	err := s.db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(stateBucket)
		if err != nil {
			return err
		}
		for name, state := range states {
			if b.Bucket([]byte(name)) != nil {
				if err := b.DeleteBucket([]byte(name)); err != nil {
					return err
				}
			}
			tb, err := b.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			path := string(stateBucket) + "/" + name
			for i := 0; len(state) > 0; i++ {
				n := min(len(state), chunkSize)
				k := binary.BigEndian.AppendUint64(nil, uint64(i))
				v := append(make([]byte, 0, n+checksumSize), state[:n]...)
				if err := tb.Put(k, seal(path, k, v)); err != nil {
					return err
				}
				state = state[n:]
			}
		}
		if err := b.Put(headerKey, seal(string(stateBucket), headerKey, h.encode())); err != nil {
			return err
		}
		return updateContents(tx, func(c *contents) {
			c.state = true
			for name, state := range states {
				c.tables[name] = tableState{chunks: uint64((len(state) + chunkSize - 1) / chunkSize), bytes: uint64(len(state))}
			}
		})
	})
	if err != nil {
		return fmt.Errorf("bolt: %s: save the state: %w", s.path, err)
	}
	s.saved = covers
	return nil
}

// A refund made with an idempotency key is on disk before it is answered:
// otherwise a crash could lose the record of it and let a retry of the
// same request, answered after the restart, give its permits back a second
// time. Every other decision with a key errs the safe way when its record
// is lost (a retried acquisition or charge takes its permits again), so
// only these wait: for a snapshot taken after them, one for all the
// refunds decided while the last one was being written. Each costs a
// snapshot's time (a few milliseconds for small tables; 74 ms with a
// million tenants, see BenchmarkSnapshot1M).

// Decide is memory.Store.Decide; a Refund with an idempotency key returns
// once a snapshot holds it, or fails with an error wrapping
// limiter.ErrNotDurable: the refund was made, and a retry with the same key
// is answered from its record and waits for a snapshot again.
func (s *Store) Decide(ctx context.Context, items []limiter.Item, mode limiter.Mode, once string) (limiter.Verdict, error) {
	v, err := s.Store.Decide(ctx, items, mode, once)
	if err != nil || once == "" || mode != limiter.Refund {
		return v, err
	}
	if err := s.sync(); err != nil {
		return limiter.Verdict{}, fmt.Errorf("bolt: refund: %w: %w", limiter.ErrNotDurable, err)
	}
	return v, nil
}

// Settle is memory.Store.Settle; with an idempotency key it returns once a
// snapshot holds the settlement (which gives back what was reserved and
// not used), as Decide does for a refund.
func (s *Store) Settle(ctx context.Context, id string, actual []limiter.Item, once string) (limiter.Verdict, error) {
	v, err := s.Store.Settle(ctx, id, actual, once)
	if err != nil || once == "" {
		return v, err
	}
	if err := s.sync(); err != nil {
		return limiter.Verdict{}, fmt.Errorf("bolt: settle: %w: %w", limiter.ErrNotDurable, err)
	}
	return v, nil
}

// sync returns once a snapshot taken after the caller's decision is on
// disk.
func (s *Store) sync() error {
	n := s.refunds.Add(1)
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	if s.saved >= n {
		return nil // a snapshot begun after the decision holds it
	}
	return s.save(false)
}

var (
	errClosed = errors.New("bolt: closed")

	_ Table = (*memory.Store)(nil)
)

// Close stops the periodic saving, saves the state as of a graceful
// shutdown, and closes the file. Nothing may be decided after it starts:
// a decision made after the last snapshot would be forgotten by a restore
// that trusts it. The memory store still answers; Put and Delete fail
// with limiter.ErrNotDurable.
func (s *Store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return errClosed
	}
	s.closed = true
	var errs []error
	if s.saver != nil {
		close(s.saver.stop)
		s.saver.done.Wait()
		errs = append(errs, s.Save(true))
	}
	errs = append(errs, s.db.Close())
	return errors.Join(errs...)
}
