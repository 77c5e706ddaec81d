package memory

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The state of a Store or a Keys is written as a compact binary record (the
// layout below; integers are varints) that RestoreState reads back into a
// Store or Keys of the same definitions, on the timeline of another Clock:
//
//	store: count, then count × (name, keyed byte, plain or keys), then the
//	       idempotency records and the reservations
//	records: count, count × (key, fingerprint, expiry, verdict)
//	verdict: flags, retry after, reservation, count, count × check
//	check: name, key, permits, flags, remaining, limit, retry after, reset after
//	reservations: count, count × (ID, expiry, count, count × (name, key, permits, held))
//	held: at, until, until fraction (limiter.Held)
//
// A store's record starts with the bytes 0x80 0x00, which no record
// written before reservations held anything starts with (a varint is
// written in its shortest form): such a record has no held fields, and
// its reservations are taken to hold nothing.
//	plain: policy, bucket
//	keys:  policy, floor bucket, shards, then shards × (count, count × (key, bucket))
//	policy: limit, period, algorithm, burst
//	bucket: GCRA: TAT nanoseconds, TAT fraction; sliding log: count, count × (at, permits)
//
// A limiter whose policy is not the one recorded (replaced while the
// service was down) keeps the state it has: a new policy starts full.
//
// RestoreState with crashed set applies the rule for state whose last
// changes may be lost: every bucket is exhausted at now (see
// limiter.Bucket.Exhaust), the buckets of limiters and keys missing from
// the record included, as if each had granted at now everything it held.

// The verdict and check flags, one bit each.
const (
	flagAllowed = 1 << iota
	flagExceeds
	flagDegraded
	flagReplayed
	flagLocal
	flagFits
	flagKeysFull
)

func flags(bits ...bool) uint64 {
	var f uint64
	for i, b := range bits {
		if b {
			f |= 1 << i
		}
	}
	return f
}

// ErrCorruptState reports a state record that RestoreState cannot read.
var ErrCorruptState = errors.New("corrupt state record")

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendPolicy(b []byte, p limiter.Policy) []byte {
	b = binary.AppendUvarint(b, uint64(p.Limit))
	b = binary.AppendVarint(b, int64(p.Period))
	b = appendString(b, string(p.Algorithm))
	return binary.AppendUvarint(b, uint64(p.Burst))
}

func appendBucket(b []byte, p limiter.Policy, s limiter.State) []byte {
	if p.Algorithm == limiter.GCRA {
		b = binary.AppendVarint(b, s.TAT.NS)
		return binary.AppendUvarint(b, uint64(s.TAT.Frac))
	}
	b = binary.AppendUvarint(b, uint64(len(s.Grants)))
	for _, g := range s.Grants {
		b = binary.AppendVarint(b, g.At)
		b = binary.AppendUvarint(b, uint64(g.N))
	}
	return b
}

// stateReader reads a state record, remembering the first error.
type stateReader struct {
	b   []byte
	err error
}

func (r *stateReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s at %d bytes from the end", ErrCorruptState, what, len(r.b))
	}
	r.b = nil
}

func (r *stateReader) uvarint(what string) uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *stateReader) varint(what string) int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a count of items of at least min bytes each, refusing one
// that the rest of the record cannot hold.
func (r *stateReader) count(what string, min int) int {
	n := r.uvarint(what)
	if n > uint64(len(r.b)/min) {
		r.fail(what)
		return 0
	}
	return int(n)
}

func (r *stateReader) string(what string) string {
	n := r.uvarint(what)
	if n > uint64(len(r.b)) {
		r.fail(what)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *stateReader) policy() limiter.Policy {
	p := limiter.Policy{
		Limit:     int64(r.uvarint("limit")),
		Period:    time.Duration(r.varint("period")),
		Algorithm: limiter.Algorithm(r.string("algorithm")),
		Burst:     int64(r.uvarint("burst")),
	}
	if r.err == nil && p.Validate() != nil {
		r.fail("policy")
	}
	return p
}

func (r *stateReader) bucket(p limiter.Policy) limiter.State {
	if p.Algorithm == limiter.GCRA {
		ns := r.varint("TAT")
		frac := r.uvarint("TAT fraction")
		if frac >= uint64(p.Limit) {
			r.fail("TAT fraction")
		}
		return limiter.State{TAT: limiter.TAT{NS: ns, Frac: uint32(frac)}}
	}
	n := r.count("grants", 2)
	gs := make([]limiter.Grant, n)
	for i := range gs {
		gs[i] = limiter.Grant{At: r.varint("grant instant"), N: int64(r.uvarint("grant permits"))}
		if gs[i].N < 1 || gs[i].N > limiter.MaxLimit+limiter.MaxLogDebt || i > 0 && gs[i].At < gs[i-1].At {
			r.fail("grant")
		}
	}
	return limiter.State{Grants: gs}
}

// AppendState appends the state of every key k remembers to b, each shard
// read under its lock, and returns the extended slice.
func (k *Keys) AppendState(b []byte) []byte {
	b = appendPolicy(b, k.policy)
	b = appendBucket(b, k.policy, k.floorState())
	if st := k.gcra; st != nil {
		b = binary.AppendUvarint(b, uint64(len(st.shards)))
		for i := range st.shards {
			s := &st.shards[i]
			s.mu.Lock()
			b = binary.AppendUvarint(b, uint64(s.live))
			for j := range s.nslots {
				if sl := s.slot(j); sl.state == slotLive {
					key := s.key(j)
					b = appendString(b, string(key.bytes()))
					b = appendBucket(b, k.policy, limiter.State{TAT: sl.tat()})
				}
			}
			s.mu.Unlock()
		}
		return b
	}
	st := k.log
	b = binary.AppendUvarint(b, uint64(len(st.shards)))
	for i := range st.shards {
		s := &st.shards[i]
		s.mu.Lock()
		b = binary.AppendUvarint(b, uint64(len(s.keys)))
		for key, t := range s.keys {
			bk := k.proto
			bk.SetLog(t.log)
			b = appendString(b, key)
			b = appendBucket(b, k.policy, bk.State())
		}
		s.mu.Unlock()
	}
	return b
}

// RestoreState reads the state of keys that AppendState wrote at the
// start of b into k, whose policy must be the one recorded for anything to
// be restored, and returns what follows it; an empty b records nothing. Each instant is shifted by
// shift nanoseconds onto k's timeline (see limiter.State.Shift); with
// crashed, every bucket is exhausted at now and keys k does not remember
// start exhausted too (see StartExhausted). Keys beyond k's bound are not
// remembered: they start exhausted. It is for a Keys on which nothing is
// decided yet.
func (k *Keys) RestoreState(b []byte, shift int64, crashed bool, now int64) ([]byte, error) {
	if len(b) == 0 { // nothing recorded
		if crashed {
			k.StartExhausted(now)
		}
		return nil, nil
	}
	r := &stateReader{b: b}
	k.restore(r, shift, crashed, now)
	return r.b, r.err
}

func (k *Keys) restore(r *stateReader, shift int64, crashed bool, now int64) (same bool) {
	p := r.policy()
	same = p.Normalize() == k.policy
	if floor := r.bucket(p); same && r.err == nil {
		k.setFloor(floor.Shift(shift), now)
	}
	shards := r.count("shards", 1)
	overflow := false
	for range shards {
		n := r.count("keys", 2)
		for range n {
			key := r.string("key")
			s := r.bucket(p)
			if r.err != nil {
				return false
			}
			if !same || len(key) == 0 || len(key) > limiter.MaxKeyLen {
				continue
			}
			bk := k.proto
			bk.SetState(s.Shift(shift))
			if bk.Empty(now) {
				continue // a full bucket, or the floor after a crash
			}
			if crashed {
				bk.Exhaust(now)
			}
			if !k.remember(key, &bk, now) {
				overflow = true
			}
		}
	}
	if crashed || overflow {
		k.StartExhausted(now)
	}
	return same
}

// remember puts key in the table with the state of b, not full at now,
// unless the table holds its bound.
func (k *Keys) remember(key string, b *limiter.Bucket, now int64) bool {
	if st := k.gcra; st != nil {
		h := st.hash(key)
		s := st.shard(h)
		s.mu.Lock()
		defer s.mu.Unlock()
		i, found := s.find(key, h)
		if found {
			return true // a record holds each key once
		}
		if !st.reserve() {
			return false
		}
		s.insert(st, key, h, i, b.TAT(), now)
		return true
	}
	st := k.log
	s := st.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys[key] != nil {
		return true
	}
	if !st.reserve() {
		return false
	}
	l := b.Log()
	av := l.Available(st.window, now)
	s.put(key, &logKey{log: l, reset: addNanos(now, av.ResetAfter)})
	return true
}

// floorState is the state a key k does not remember starts from (see
// StartExhausted): a zero TAT or no grants for a full bucket.
func (k *Keys) floorState() limiter.State {
	b := k.proto
	if st := k.gcra; st != nil {
		b.SetTAT(st.floor)
	} else {
		b.SetLog(k.log.floor.Clone())
	}
	return b.State()
}

// setFloor makes s, unless it is a full bucket at now, the state a key k
// does not remember starts from, as StartExhausted does.
func (k *Keys) setFloor(s limiter.State, now int64) {
	b := k.proto
	b.SetState(s)
	if b.Empty(now) {
		return
	}
	if st := k.gcra; st != nil {
		st.floor = b.TAT()
		return
	}
	st := k.log
	st.floor = b.Log()
	st.floorUntil = addNanos(s.Grants[len(s.Grants)-1].At, k.policy.Period)
}

// StartExhausted makes a key k does not remember start from a bucket
// exhausted at now (see limiter.Bucket.Exhaust) instead of a full one,
// until that bucket is full again: the rule after a crash for the keys
// whose state was lost with it, which may have been granted anything. It
// is for a Keys on which nothing is decided yet.
func (k *Keys) StartExhausted(now int64) {
	b := k.proto
	b.Exhaust(now)
	if st := k.gcra; st != nil {
		st.floor = b.TAT()
		return
	}
	st := k.log
	st.floor = b.Log()
	st.floorUntil = addNanos(now, k.policy.Period)
}

// AppendState appends the state of every limiter in s to b, and returns
// the extended slice. Definitions are not changed meanwhile; decisions go
// on, each limiter and shard of keys read under its own lock.
func (s *Store) AppendState(b []byte) []byte {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b = append(b, stateMark...)
	b = binary.AppendUvarint(b, uint64(len(s.byKey)))
	s.names.Scan(func(name string) bool {
		e := s.byKey[name]
		b = appendString(b, name)
		if e.keys != nil {
			b = append(b, 1)
			b = e.keys.AppendState(b)
			return true
		}
		b = append(b, 0)
		b = appendPolicy(b, e.l.Policy())
		b = appendBucket(b, e.l.Policy(), e.l.State())
		return true
	})
	b = s.once.appendState(b)
	return s.rsv.appendState(b)
}

// appendState appends the records the table holds, each shard read under
// its lock.
func (t *onceTable) appendState(b []byte) []byte {
	var body []byte
	n := 0
	for i := range t.shards {
		o := &t.shards[i]
		o.mu.Lock()
		for key, r := range o.m {
			n++
			body = appendString(body, key)
			body = appendString(body, r.fingerprint)
			body = binary.AppendVarint(body, r.expires)
			v := r.v
			body = binary.AppendUvarint(body, flags(v.Allowed, v.ExceedsCapacity, v.Degraded, v.Replayed, v.Local))
			body = binary.AppendVarint(body, int64(v.RetryAfter))
			body = appendString(body, v.Reservation)
			body = binary.AppendUvarint(body, uint64(len(v.Checks)))
			for _, c := range v.Checks {
				body = appendString(body, c.Name)
				body = appendString(body, c.Key)
				body = binary.AppendVarint(body, c.Permits)
				body = binary.AppendUvarint(body, flags(false, c.ExceedsCapacity, false, false, false, c.Fits, c.KeysFull))
				body = binary.AppendVarint(body, c.Remaining)
				body = binary.AppendVarint(body, c.Limit)
				body = binary.AppendVarint(body, int64(c.RetryAfter))
				body = binary.AppendVarint(body, int64(c.ResetAfter))
			}
		}
		o.mu.Unlock()
	}
	b = binary.AppendUvarint(b, uint64(n))
	return append(b, body...)
}

// restore reads the records appendState wrote, their expiries shifted by
// shift, into an empty table, leaving out those expired at now.
func (t *onceTable) restore(r *stateReader, shift, now int64) {
	n := r.count("idempotency records", 8)
	for range n {
		key, fp := r.string("idempotency key"), r.string("fingerprint")
		expires := limiter.ShiftNanos(r.varint("expiry"), shift)
		f := r.uvarint("verdict flags")
		v := limiter.Verdict{
			Allowed: f&flagAllowed != 0, ExceedsCapacity: f&flagExceeds != 0, Degraded: f&flagDegraded != 0,
			Replayed: f&flagReplayed != 0, Local: f&flagLocal != 0,
			RetryAfter:  time.Duration(r.varint("retry after")),
			Reservation: r.string("reservation"),
		}
		v.Checks = make([]limiter.Check, r.count("checks", 8))
		for i := range v.Checks {
			c := limiter.Check{Name: r.string("check name"), Key: r.string("check key"), Permits: r.varint("check permits")}
			f := r.uvarint("check flags")
			c.ExceedsCapacity, c.Fits, c.KeysFull = f&flagExceeds != 0, f&flagFits != 0, f&flagKeysFull != 0
			c.Remaining, c.Limit = r.varint("check remaining"), r.varint("check limit")
			c.RetryAfter, c.ResetAfter = time.Duration(r.varint("check retry after")), time.Duration(r.varint("check reset after"))
			v.Checks[i] = c
		}
		if r.err != nil {
			return
		}
		if expires <= now || t.count.Load() >= limiter.MaxOnce {
			continue
		}
		o := &t.shards[maphash.String(t.seed, key)%onceShards]
		if _, dup := o.m[key]; dup {
			continue
		}
		o.m[key] = onceRecord{fingerprint: fp, v: v, expires: expires}
		o.queue = append(o.queue, onceQueued{key, expires})
		t.count.Add(1)
	}
	for i := range t.shards {
		o := &t.shards[i]
		slices.SortFunc(o.queue, func(a, b onceQueued) int { return cmp.Compare(a.expires, b.expires) })
	}
}

// stateMark starts a Store's record; see the layout above.
const stateMark = "\x80\x00"

// appendState appends the reservations held, each shard read under its
// lock.
func (rs *reservations) appendState(b []byte) []byte {
	var body []byte
	n := 0
	for i := range rs.shards {
		sh := &rs.shards[i]
		sh.mu.Lock()
		for id, r := range sh.m {
			n++
			body = appendString(body, id)
			body = binary.AppendVarint(body, r.expires)
			body = binary.AppendUvarint(body, uint64(len(r.parts)))
			for k, p := range r.parts {
				body = appendString(body, p.Name)
				body = appendString(body, p.Key)
				body = binary.AppendVarint(body, p.Permits)
				h := r.holds[k]
				body = binary.AppendVarint(body, h.At)
				body = binary.AppendVarint(body, h.Until.NS)
				body = binary.AppendUvarint(body, uint64(h.Until.Frac))
			}
		}
		sh.mu.Unlock()
	}
	b = binary.AppendUvarint(b, uint64(n))
	return append(b, body...)
}

// nothingHeld is what a reservation restored from a record written before
// reservations held anything is taken to hold: nothing is given back.
var nothingHeld = limiter.Held{At: math.MaxInt64}

// restore reads the reservations appendState wrote, their expiries
// shifted by shift, into an empty table, leaving out those expired at now.
// A part is bound to the generation bound gives its limiter: one missing
// there (its limiter redefined while the service was down) is never
// settled.
func (rs *reservations) restore(r *stateReader, shift, now int64, bound map[string]uint64, held bool) {
	n := r.count("reservations", 4)
	for range n {
		id := r.string("reservation ID")
		x := reservation{expires: limiter.ShiftNanos(r.varint("expiry"), shift)}
		x.parts = make([]limiter.Item, r.count("reserved parts", 3))
		x.gens, x.holds = make([]uint64, len(x.parts)), make([]limiter.Held, len(x.parts))
		for i := range x.parts {
			x.parts[i] = limiter.Item{Name: r.string("reserved name"), Key: r.string("reserved key"), Permits: r.varint("reserved permits")}
			x.gens[i], x.holds[i] = bound[x.parts[i].Name], nothingHeld
			if held {
				at, until := r.varint("held at"), r.varint("held until")
				frac := r.uvarint("held until fraction")
				x.holds[i] = limiter.Held{At: limiter.ShiftNanos(at, shift)}
				if until != 0 || frac != 0 {
					x.holds[i].Until = limiter.TAT{NS: limiter.ShiftNanos(until, shift), Frac: uint32(frac)}
				}
			}
		}
		if r.err != nil {
			return
		}
		if x.expires <= now || rs.count.Load() >= limiter.MaxReservations {
			continue
		}
		sh := rs.shard(id)
		if _, dup := sh.m[id]; dup {
			continue
		}
		sh.m[id] = x
		rs.count.Add(1)
	}
}

// RestoreState reads into s the state AppendState wrote as b (an empty b
// records nothing), as
// Keys.RestoreState does for each keyed limiter: a limiter of s missing
// from b, or recorded with another policy, keeps its state, exhausted at
// now when crashed. It is for a Store on which nothing is decided yet.
func (s *Store) RestoreState(b []byte, shift int64, crashed bool, now int64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	held := strings.HasPrefix(string(b), stateMark)
	if held {
		b = b[len(stateMark):]
	}
	r := &stateReader{b: b}
	restored := make(map[string]bool)
	// The generation of each limiter whose state was restored: the
	// definition it was recorded with is the one in force, so reservations
	// made on it are still its own.
	bound := make(map[string]uint64)
	recorded := held || len(b) > 0 // else nothing is recorded
	n := 0
	if recorded {
		n = r.count("limiters", 3)
	}
	for range n {
		name := r.string("name")
		keyed := len(r.b) > 0 && r.b[0] == 1
		if len(r.b) == 0 || r.b[0] > 1 {
			r.fail("kind")
			break
		}
		r.b = r.b[1:]
		e, ok := s.byKey[name]
		if keyed {
			ks := e.keys
			if !ok || ks == nil {
				ks = NewKeys(limiter.Policy{Limit: 1, Period: time.Second}, 1) // reads and drops the record
			}
			if ks.restore(r, shift, crashed, now) && ok && e.keys != nil {
				bound[name] = e.gen
			}
			restored[name] = ok && e.keys != nil
			continue
		}
		p := r.policy()
		st := r.bucket(p)
		if r.err != nil {
			break
		}
		if ok && e.keys == nil && p.Normalize() == e.l.Policy() {
			e.l.SetState(st.Shift(shift))
			restored[name] = true
			bound[name] = e.gen
		}
	}
	if r.err == nil && recorded {
		s.once.restore(r, shift, now)
		s.rsv.restore(r, shift, now, bound, held)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("trailing bytes")
	}
	if r.err != nil {
		return r.err
	}
	if !crashed {
		return nil
	}
	for name, e := range s.byKey {
		switch {
		case e.keys == nil:
			e.l.Exhaust(now)
		case !restored[name]:
			e.keys.StartExhausted(now)
		}
	}
	return nil
}
