package bolt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"

	bbolt "go.etcd.io/bbolt"
)

// bbolt checks the structure of its pages, not what they hold: a bit
// flipped inside a value reads back as another value. So every record of
// the file (format 2) ends with a CRC-32C (Castagnoli) of where it is, its
// bucket's path and its key, and of the rest of its value: a record
// changed, or moved under another key or bucket, no longer matches. Open
// checks every record of the file before it trusts any; a file of format 1
// (written before the checksums) is read as it is and then rewritten, in
// one transaction, with them.

// checksumSize is the bytes of checksum at the end of every record.
const checksumSize = 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errChecksum is the reason a record whose checksum does not match is
// refused.
var errChecksum = errors.New("checksum mismatch")

// checksum returns the CRC-32C of the record key in the bucket at path
// (nested names joined by "/") whose value, checksum left out, is payload.
func checksum(path string, key, payload []byte) uint32 {
	var buf [64]byte
	where := binary.AppendUvarint(buf[:0], uint64(len(path)))
	where = append(where, path...)
	where = binary.AppendUvarint(where, uint64(len(key)))
	where = append(where, key...)
	return crc32.Update(crc32.Checksum(where, castagnoli), castagnoli, payload)
}

// seal returns payload with the checksum of the record key in the bucket
// at path appended: the value to put. It may append to payload's array.
func seal(path string, key, payload []byte) []byte {
	return binary.BigEndian.AppendUint32(payload, checksum(path, key, payload))
}

// unseal checks the value v of the record key in the bucket at path and
// returns its payload, a part of v; an error wrapping errUnreadable and
// errChecksum, naming the record, when it does not match.
func unseal(path string, key, v []byte) ([]byte, error) {
	n := len(v) - checksumSize
	if n < 0 || binary.BigEndian.Uint32(v[n:]) != checksum(path, key, v[:n]) {
		return nil, fmt.Errorf("%w: record %s: %w", errUnreadable, recordName(path, key), errChecksum)
	}
	return v[:n], nil
}

// recordName names the record key of the bucket at path in an error: a
// state chunk by its number, any other by its key, quoted, and cut after
// 64 bytes (a damaged one can be any length).
func recordName(path string, key []byte) string {
	if strings.HasPrefix(path, string(stateBucket)+"/") && len(key) == 8 {
		return fmt.Sprintf("%s/%d", path, binary.BigEndian.Uint64(key))
	}
	if len(key) > 64 {
		return fmt.Sprintf("%s/%q… (%d bytes)", path, key[:64], len(key))
	}
	return fmt.Sprintf("%s/%q", path, key)
}

// checkFormat reads the format record's value v: old reports a file of
// format 1, without checksums; an error, one this package cannot read.
func checkFormat(v []byte) (old bool, err error) {
	switch {
	case string(v) == format1:
		return true, nil
	case len(v) != len(format)+checksumSize:
		return false, fmt.Errorf("%w: format %q, want %q", errForeign, v, format)
	}
	p, err := unseal(string(metaBucket), formatKey, v)
	if err != nil {
		return false, err
	}
	if string(p) != format {
		return false, fmt.Errorf("%w: format %q, want %q", errForeign, p, format)
	}
	return false, nil
}

// verify checks the checksum of every record of the file, in every bucket.
func verify(tx *bbolt.Tx) error {
	return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
		return verifyBucket(string(name), b)
	})
}

func verifyBucket(path string, b *bbolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			return verifyBucket(path+"/"+string(k), b.Bucket(k))
		}
		_, err := unseal(path, k, v)
		return err
	})
}

// upgrade rewrites a file of format 1 as one of format: every record with
// its checksum.
func upgrade(tx *bbolt.Tx) error {
	type record struct {
		b    *bbolt.Bucket
		path string
		k, v []byte
	}
	var all []record
	var collect func(path string, b *bbolt.Bucket) error
	collect = func(path string, b *bbolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return collect(path+"/"+string(k), b.Bucket(k))
			}
			if path != string(metaBucket) || !bytes.Equal(k, formatKey) {
				all = append(all, record{b, path, bytes.Clone(k), bytes.Clone(v)})
			}
			return nil
		})
	}
	if err := tx.ForEach(func(name []byte, b *bbolt.Bucket) error { return collect(string(name), b) }); err != nil {
		return err
	}
	for _, r := range all {
		if err := r.b.Put(r.k, seal(r.path, r.k, r.v)); err != nil {
			return err
		}
	}
	if err := tx.Bucket(metaBucket).Put(formatKey, seal(string(metaBucket), formatKey, []byte(format))); err != nil {
		return err
	}
	return putContents(tx, count(tx))
}
