package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Decide decides items together, all or nothing, in one atomic script
// (decide.lua) at the Redis server's time (or charges or refunds them all,
// unconditionally, by mode): the limiters of one decision share a group,
// and so a Cluster slot. The groups are checked first, from what the Store
// knows of them; the limiters it has not met are looked up in the
// directory, in one round trip, before that. A limiter not found where the
// Store believed it lived is looked up again, and the decision made once
// more if it moved: the first run found no definition and so changed
// nothing. As with Acquire nothing else is retried: when the error wraps
// ErrUnavailable the permits may or may not have been taken.
//
// A decision with once remembers it for limiter.OnceTTL under
// <prefix>{<tag>}#once:<once>, in the slot of its limiters (tag is their
// group, or the one limiter's name), checked and written by the same
// script: a retry is answered from it and decides nothing.
//
// With CacheDenials, a Take or Peek without once that Redis would deny may
// be answered without asking it, and a Refund forgets what the cache knew
// of its limiters.
//
// Decisions of one slot that arrive while one there is in flight wait for
// it, then go together as one run of the script, each decided as if alone
// (see coalescer).
func (s *Store) Decide(ctx context.Context, items []limiter.Item, mode limiter.Mode, once string) (limiter.Verdict, error) {
	return s.decideMode(ctx, items, mode, once, "")
}

// decideMode is Decide at nowMicros (see acquire); only tests pass one.
func (s *Store) decideMode(ctx context.Context, items []limiter.Item, mode limiter.Mode, once, nowMicros string) (limiter.Verdict, error) {
	c := call{mode: mode.String(), once: once, fingerprint: fingerprint(items, mode, once)}
	if s.denials == nil {
		return s.decideAt(ctx, items, c, nowMicros)
	}
	switch {
	case once == "" && (mode == limiter.Take || mode == limiter.Peek):
		c.learn = true
		return s.decideCached(ctx, items, c, nowMicros)
	case mode == limiter.Refund:
		defer s.denials.forget(items)
	}
	return s.decideAt(ctx, items, c, nowMicros)
}

// Reserve is Decide under Take that also writes the reservation,
// <prefix>{<tag>}#rsv:<random>, in the same script when the items fit; it
// expires after ttl. The answer carries the reservation's ID, and so does
// the answer an idempotency key remembers: a replay names the reservation
// the first call made.
func (s *Store) Reserve(ctx context.Context, items []limiter.Item, ttl time.Duration, once string) (limiter.Verdict, error) {
	c := call{mode: "take", once: once, ttl: ttl}
	if once != "" {
		c.fingerprint = "reserve " + strconv.FormatInt(int64(ttl), 10) + " " + limiter.Fingerprint(items, limiter.Take)
	}
	return s.decideAt(ctx, items, c, "")
}

// fingerprint is what the idempotency key once remembers of a decision:
// nothing without a key.
func fingerprint(items []limiter.Item, mode limiter.Mode, once string) string {
	if once == "" {
		return ""
	}
	return limiter.Fingerprint(items, mode)
}

// call is one run of decide.lua beyond its limiters and permits: its mode
// by decide.lua's name, the idempotency key and its fingerprint, and, for
// a reservation, its TTL (Reserve) or ID (Settle).
type call struct {
	mode              string
	once, fingerprint string
	ttl               time.Duration
	reservation       string
	// learn has the Store's denial cache learn from the reply, as of its
	// generation gen (see denials.learn).
	learn bool
	gen   uint64
}

// decideAt is a decision at nowMicros (see acquire); only tests pass one.
func (s *Store) decideAt(ctx context.Context, items []limiter.Item, c call, nowMicros string) (limiter.Verdict, error) {
	parts, index := limiter.Parts(items)
	names := make([]string, len(parts))
	for j, p := range parts {
		names[j] = p.Name
	}
	var unknown []string
	for _, name := range names {
		if _, ok := s.known(name); !ok {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		if _, err := s.lookup(ctx, unknown...); err != nil {
			return limiter.Verdict{}, unavailable("decide", names[0], err)
		}
	}
	for again := true; ; again = false {
		groups := make([]string, len(names))
		for j, name := range names {
			groups[j] = s.groupOf(name)
		}
		itemGroups := make([]string, len(items))
		for i := range items {
			itemGroups[i] = groups[index[i]]
		}
		if err := limiter.CheckGroups(items, itemGroups); err != nil {
			// A name the directory does not know may name no limiter at
			// all: that is the answer, as the memory store gives it.
			if missing, merr := s.missing(ctx, names, groups); merr != nil || missing != "" {
				if merr != nil {
					return limiter.Verdict{}, unavailable("decide", names[0], merr)
				}
				return limiter.Verdict{}, fmt.Errorf("redis: decide: %w", &limiter.MissingError{Name: missing})
			}
			return limiter.Verdict{}, fmt.Errorf("redis: decide: %w", err)
		}
		scope := limiter.Scope(items, itemGroups)
		if c.ttl > 0 {
			c.reservation = limiter.NewReservationID(scope)
		}
		v, err := s.run(ctx, items, parts, index, groups[0], scope, c, nowMicros)
		var missing *limiter.MissingError
		if errors.As(err, &missing) && again && s.relocated(ctx, missing.Name) {
			continue
		}
		return v, err
	}
}

// checkFields is the number of fields of one part in decide.lua's reply.
const checkFields = 9

// widen reads a reply of n parts remembered by an earlier version, with
// eight fields a part before keys_full, as one of checkFields a part; a
// reservation's reply ends with its ID.
func widen(v []int64, n int, reserved bool) []int64 {
	const old = checkFields - 1
	tail := 0
	if reserved {
		tail = 4
	}
	if len(v) != 1+old*n+tail {
		return v
	}
	w := make([]int64, 1, len(v)+n)
	w[0] = v[0]
	for j := range n {
		w = append(append(w, v[1+old*j:1+old*(j+1)]...), 0)
	}
	return append(w, v[1+old*n:]...)
}

// scopeKeys returns the hash tag of the slot of a decision in scope, with
// the prefix, and what names the decision's idempotency record beside the
// key: a key of a limiter in no group lives in its limiter's slot, and its
// records are the key's own.
func (s *Store) scopeKeys(scope string) (tag, record string) {
	_, where, _ := strings.Cut(scope, ":")
	name, key, keyed := strings.Cut(where, "\x00")
	if keyed {
		// A key holds no control character: the NUL ends it.
		return s.prefix + "{" + name + "}", key + "\x00"
	}
	return s.prefix + "{" + where + "}", ""
}

// run decides items once with decide.lua: parts are their limiters and
// keys (by index), which live in group, for a decision in scope. The call
// waits for its slot's call in flight, if there is one, and goes in a
// batch with the others that waited (see coalescer).
func (s *Store) run(ctx context.Context, items, parts []limiter.Item, index []int, group, scope string, c call, nowMicros string) (limiter.Verdict, error) {
	tag, sc := s.scriptCall(parts, group, scope, c, nowMicros)
	var sent time.Time
	if c.learn {
		sent = s.denials.now()
	}
	r, err := s.decisions.do(ctx, tag+" "+nowMicros, sc)
	if err == nil {
		err = r.err
	}
	if err != nil {
		return limiter.Verdict{}, unavailable("decide", parts[0].Name, err)
	}
	return s.verdict(items, parts, index, c, r.v, sent)
}

// scriptCall returns decide.lua's keys and arguments for a decision on
// parts in group and scope (see run), and the hash tag of their slot.
func (s *Store) scriptCall(parts []limiter.Item, group, scope string, c call, nowMicros string) (string, scriptCall) {
	tag, record := s.scopeKeys(scope)
	keys := make([]string, 0, 2*len(parts)+2)
	for _, p := range parts {
		keys = append(keys, s.keysIn(p.Name, group)...)
	}
	random := ""
	if c.reservation != "" {
		_, random, _ = limiter.ParseReservationID(c.reservation)
	}
	keys = append(keys, tag+"#once:"+record+c.once, tag+"#rsv:"+random)
	args := make([]string, 2, 9+3*len(parts))
	args[0], args[1] = nowMicros, c.mode
	for _, p := range parts {
		args = append(args, strconv.FormatInt(p.Permits, 10))
	}
	ttl := ""
	if c.ttl > 0 {
		ttl = strconv.FormatInt(c.ttl.Milliseconds(), 10)
	}
	args = append(args, c.fingerprint, strconv.FormatInt(limiter.OnceTTL.Milliseconds(), 10), ttl)
	for _, p := range parts {
		args = append(args, p.Name)
	}
	for _, p := range parts {
		args = append(args, p.Key)
	}
	if c.ttl > 0 {
		for i := range 4 {
			n, _ := strconv.ParseUint(random[8*i:8*i+8], 16, 32)
			args = append(args, strconv.FormatUint(n, 10))
		}
	}
	return tag, scriptCall{keys: keys, args: args}
}

// verdict reads decide.lua's reply v to a decision of items (see run),
// sent at sent for the denial cache to learn from.
func (s *Store) verdict(items, parts []limiter.Item, index []int, c call, v []int64, sent time.Time) (limiter.Verdict, error) {
	names := make([]string, len(parts))
	for j, p := range parts {
		names[j] = p.Name
	}
	switch {
	case len(v) == 1 && v[0] == -1:
		return limiter.Verdict{}, fmt.Errorf("redis: decide: %w", limiter.ErrOnceMismatch)
	case len(v) == 1 && v[0] == -2:
		return limiter.Verdict{}, fmt.Errorf("redis: settle %s: %w", c.reservation, limiter.ErrReservationNotFound)
	case len(v) == 2 && v[0] == -3 && v[1] >= 1 && v[1] <= int64(len(names)):
		return limiter.Verdict{}, fmt.Errorf("redis: %w", limiter.InvalidSettlement(c.reservation, parts[v[1]-1]))
	case len(v) == 2 && v[0] == 0 && v[1] >= 1 && v[1] <= int64(len(names)):
		return limiter.Verdict{}, fmt.Errorf("redis: decide: %w", &limiter.MissingError{Name: names[v[1]-1]})
	case len(v) == 2 && v[0] == -4 && v[1] >= 1 && v[1] <= int64(len(names)):
		p := parts[v[1]-1]
		return limiter.Verdict{}, fmt.Errorf("redis: decide: %w", limiter.KeyMismatch(p.Name, p.Key == ""))
	}
	var next []time.Duration
	if n := 1 + checkFields*len(names); (c.mode == "take" || c.mode == "peek") && c.ttl == 0 && len(v) == n+2*len(names) && v[0] == 1 {
		next = make([]time.Duration, len(names))
		for j := range names {
			next[j] = -1
			if us := v[n+2*j]; us >= 0 {
				next[j] = Duration(us, v[n+2*j+1])
			}
		}
		v = v[:n]
	}
	replayed := len(v) > 0 && v[0] == 2
	if replayed {
		v[0] = 1
		v = widen(v, len(names), c.ttl > 0)
	}
	reservation := ""
	if n := 1 + checkFields*len(names); c.ttl > 0 && len(v) == n+4 {
		// The reservation this answer made, which a replay names too.
		reservation = c.reservation[:strings.LastIndexByte(c.reservation, '.')+1]
		for _, x := range v[n:] {
			reservation += fmt.Sprintf("%08x", uint32(x))
		}
		v = v[:n]
	}
	if len(v) != 1+checkFields*len(names) || v[0] != 1 {
		return limiter.Verdict{}, unavailable("decide", names[0], fmt.Errorf("unexpected reply %v", v))
	}
	found := make([]limiter.Check, len(names))
	for j := range names {
		f := v[1+checkFields*j:]
		found[j] = limiter.Check{
			Fits: f[0] == 1, Remaining: f[1], Limit: f[2],
			RetryAfter: Duration(f[3], f[4]), ResetAfter: Duration(f[5], f[6]),
			ExceedsCapacity: f[7] == 1, KeysFull: f[8] == 1,
		}
	}
	if c.learn && next != nil {
		s.denials.learn(parts, found, next, sent, c.gen)
	}
	verdict := limiter.NewVerdict(items, found, index)
	verdict.Replayed = replayed
	if verdict.Allowed {
		verdict.Reservation = reservation
	}
	return verdict, nil
}

// scriptCall is one decision's keys and arguments for decide.lua.
type scriptCall struct {
	keys, args []string
}

// parts is how many limiters and keys the decision decides.
func (c scriptCall) parts() int { return (len(c.keys) - 2) / 2 }

// scriptReply is decide.lua's reply to one decision.
type scriptReply struct {
	v   []int64
	err error
}

// runDecisions runs decide.lua once for the decisions calls, sent under
// their slot's hash tag and instant (see run): the one on its own, or
// several as a batch, each decided as if alone.
func (s *Store) runDecisions(ctx context.Context, _ string, calls []scriptCall, out []scriptReply) {
	if len(calls) == 1 {
		out[0].v, out[0].err = decideScript.Exec(ctx, s.client, calls[0].keys, calls[0].args).AsIntSlice()
		return
	}
	nk, na := 0, 3+2*len(calls)
	for _, c := range calls {
		nk, na = nk+len(c.keys), na+len(c.args)
	}
	keys := make([]string, 0, nk)
	args := make([]string, 0, na)
	// Every call of a batch has the same instant.
	args = append(args, "batch", calls[0].args[0], strconv.Itoa(len(calls)))
	for _, c := range calls {
		args = append(args, strconv.Itoa(len(c.keys)), strconv.Itoa(len(c.args)))
	}
	for _, c := range calls {
		keys = append(keys, c.keys...)
		args = append(args, c.args...)
	}
	replies, err := decideScript.Exec(ctx, s.client, keys, args).ToArray()
	if err == nil && len(replies) != len(calls) {
		err = fmt.Errorf("%d replies to a batch of %d decisions", len(replies), len(calls))
	}
	for i := range out {
		if err != nil {
			out[i].err = err
			continue
		}
		out[i].v, out[i].err = replies[i].AsIntSlice()
	}
}

// Settle settles or cancels a reservation in one script that checks and
// deletes it, and charges or refunds its limiters: the reservation's ID
// names their group, or their one limiter. A cancel reads the reservation
// first, for its limiters, then settles each at 0.
func (s *Store) Settle(ctx context.Context, id string, actual []limiter.Item, once string) (limiter.Verdict, error) {
	return s.settleAt(ctx, id, actual, once, "")
}

// settleAt is Settle at nowMicros (see acquire); only tests pass one.
func (s *Store) settleAt(ctx context.Context, id string, actual []limiter.Item, once, nowMicros string) (limiter.Verdict, error) {
	scope, random, err := limiter.ParseReservationID(id)
	if err != nil {
		return limiter.Verdict{}, err
	}
	// Every key of the script must be in the reservation's slot.
	if err := limiter.CheckSettlementScope(scope, id, actual); err != nil {
		return limiter.Verdict{}, err
	}
	kind, where, _ := strings.Cut(scope, ":")
	group := ""
	if kind == "g" {
		group = where
	}
	if actual == nil {
		tag, _ := s.scopeKeys(scope) // where the reservation was written
		key := tag + "#rsv:" + random
		rec, err := s.client.Do(ctx, s.client.B().Get().Key(key).Build()).ToString()
		if rueidis.IsRedisNil(err) {
			return limiter.Verdict{}, fmt.Errorf("redis: cancel %s: %w", id, limiter.ErrReservationNotFound)
		}
		if err != nil {
			return limiter.Verdict{}, unavailable("cancel", id, err)
		}
		actual = reservedParts(rec)
		if len(actual) == 0 {
			return limiter.Verdict{}, unavailable("cancel", id, fmt.Errorf("malformed reservation %q", rec))
		}
	}
	parts, index := limiter.Parts(actual)
	fp := ""
	if once != "" {
		fp = "settle " + id + " " + limiter.Fingerprint(actual, limiter.Take)
	}
	if s.denials != nil {
		// A settlement may give permits back.
		defer s.denials.forget(parts)
	}
	return s.run(ctx, actual, parts, index, group, scope, call{mode: "settle", once: once, fingerprint: fp, reservation: id}, nowMicros)
}

// missing returns the first of names in no group (groups[j] == "") whose
// definition does not exist, or "".
func (s *Store) missing(ctx context.Context, names, groups []string) (string, error) {
	var check []string
	for j, name := range names {
		if groups[j] == "" {
			check = append(check, name)
		}
	}
	if len(check) == 0 {
		return "", nil
	}
	c := s.client
	cmds := make(rueidis.Commands, len(check))
	for k, name := range check {
		cmds[k] = c.B().Exists().Key(s.defKey(name)).Build()
	}
	for k, r := range c.DoMulti(ctx, cmds...) {
		n, err := r.AsInt64()
		if err != nil {
			return "", err
		}
		if n == 0 {
			return check[k], nil
		}
	}
	return "", nil
}

// reservedParts reads the limiters and keys a reservation's record holds
// (see decide.lua): name, key, permits, the generation of the limiter's
// definition and what its bucket holds (two numbers), or only the first
// three from before reservations held the others, separated by US within
// a part and RS between parts; or, from before reservations held keys,
// "name=permits" separated by spaces.
func reservedParts(rec string) []limiter.Item {
	var parts []limiter.Item
	if !strings.Contains(rec, "\x1f") {
		for _, f := range strings.Fields(rec) {
			name, _, _ := strings.Cut(f, "=")
			parts = append(parts, limiter.Item{Name: name})
		}
		return parts
	}
	for _, f := range strings.Split(rec, "\x1e") {
		if fs := strings.Split(f, "\x1f"); len(fs) == 3 || len(fs) == 6 {
			parts = append(parts, limiter.Item{Name: fs[0], Key: fs[1]})
		}
	}
	return parts
}
