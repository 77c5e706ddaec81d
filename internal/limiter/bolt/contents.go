package bolt

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"

	bbolt "go.etcd.io/bbolt"
)

// A checksum proves a record whole, not that every record is there: a bit
// flipped in the count of a page's elements drops the last of them (the
// tenants' saved state, or the whole state bucket), and the file reads as
// one that never held it. So the meta bucket's contents record says what
// the file holds, and every transaction that adds or removes a record
// updates it: how many definitions; whether a snapshot was written, and
// of each table its number of chunks and of bytes. Open refuses a file
// whose records do not add up to it.

var contentsKey = []byte("contents")

// contents is what the contents record says the file holds.
type contents struct {
	limiters uint64                // definitions in the limiters bucket
	state    bool                  // the state bucket holds a header
	tables   map[string]tableState // the state of each table saved, by name
}

// tableState is how a table's state is kept: in chunks values, of bytes
// in all.
type tableState struct{ chunks, bytes uint64 }

func (c contents) encode() []byte {
	b := binary.AppendUvarint(nil, c.limiters)
	if c.state {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(c.tables)))
	for _, name := range slices.Sorted(maps.Keys(c.tables)) {
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, c.tables[name].chunks)
		b = binary.AppendUvarint(b, c.tables[name].bytes)
	}
	return b
}

var errContents = fmt.Errorf("%w: contents record", errUnreadable)

func decodeContents(b []byte) (contents, error) {
	var c contents
	next := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			b = nil
			return 0
		}
		b = b[n:]
		return v
	}
	c.limiters = next()
	if len(b) < 1 || b[0] > 1 {
		return contents{}, errContents
	}
	c.state, b = b[0] == 1, b[1:]
	n := next()
	if n > uint64(len(b)) {
		return contents{}, errContents
	}
	c.tables = make(map[string]tableState, n)
	for range n {
		l := next()
		if l > uint64(len(b)) {
			return contents{}, errContents
		}
		name := string(b[:l])
		b = b[l:]
		c.tables[name] = tableState{chunks: next(), bytes: next()}
	}
	if b == nil || len(b) != 0 {
		return contents{}, errContents
	}
	return c, nil
}

// readContents reads the contents record of the file tx reads.
func readContents(tx *bbolt.Tx) (contents, error) {
	v := tx.Bucket(metaBucket).Get(contentsKey)
	if v == nil {
		return contents{}, fmt.Errorf("%w: no contents record", errUnreadable)
	}
	v, err := unseal(string(metaBucket), contentsKey, v)
	if err != nil {
		return contents{}, err
	}
	return decodeContents(v)
}

// putContents writes c as the file's contents record.
func putContents(tx *bbolt.Tx, c contents) error {
	return tx.Bucket(metaBucket).Put(contentsKey, seal(string(metaBucket), contentsKey, c.encode()))
}

// updateContents applies change to the file's contents record.
func updateContents(tx *bbolt.Tx, change func(*contents)) error {
	c, err := readContents(tx)
	if err != nil {
		return err
	}
	change(&c)
	return putContents(tx, c)
}

// count returns what the file holds, counted.
func count(tx *bbolt.Tx) contents {
	c := contents{tables: make(map[string]tableState)}
	tx.Bucket(limitersBucket).ForEach(func(_, _ []byte) error { c.limiters++; return nil })
	st := tx.Bucket(stateBucket)
	if st == nil {
		return c
	}
	c.state = st.Get(headerKey) != nil
	st.ForEachBucket(func(name []byte) error {
		var t tableState
		st.Bucket(name).ForEach(func(_, v []byte) error {
			t.chunks++
			t.bytes += uint64(len(v) - checksumSize)
			return nil
		})
		c.tables[string(name)] = t
		return nil
	})
	return c
}

// checkContents refuses a file whose records do not add up to its
// contents record. The checksums are checked first.
func checkContents(tx *bbolt.Tx) error {
	want, err := readContents(tx)
	if err != nil {
		return err
	}
	got := count(tx)
	var diffs []string
	if got.limiters != want.limiters {
		diffs = append(diffs, fmt.Sprintf("bucket %s holds %d records, not the %d written", limitersBucket, got.limiters, want.limiters))
	}
	if got.state != want.state {
		diffs = append(diffs, fmt.Sprintf("the state header is %s, not %s as written", presence(got.state), presence(want.state)))
	}
	for _, name := range slices.Sorted(maps.Keys(want.tables)) {
		if g, w := got.tables[name], want.tables[name]; g != w {
			diffs = append(diffs, fmt.Sprintf("the state of the %s is %d chunks of %d bytes, not the %d of %d bytes written", name, g.chunks, g.bytes, w.chunks, w.bytes))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(got.tables)) {
		if _, ok := want.tables[name]; !ok {
			diffs = append(diffs, fmt.Sprintf("the state of the %s was not written", name))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%w: its records do not add up to its contents record: %s", errUnreadable, strings.Join(diffs, "; "))
	}
	return nil
}

func presence(there bool) string {
	if there {
		return "there"
	}
	return "missing"
}
