package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Tables of keys. A table holds one bucket per key under one policy, as
// memory.Keys does: the per-IP tenants (package tenant/redis, whose
// service knows the policy and spreads the tenants over 16 shards) and
// the keyed limiters of the Store (one shard each, beside the definition
// that holds the policy). Both run the same scripts (lua/table.lua and the
// key_*.lua scripts); see lua/table.lua for how a shard is kept.

// A Shard names the keys of one shard of a table, all in one Cluster slot.
type Shard struct {
	// Base starts the state key of each of the shard's keys, which
	// continues with the key (for a keyed limiter, with the definition's
	// generation first; see key_base in lua/table.lua).
	Base string
	Idx  string // the index, a sorted set in Lowest's order
	Exp  string // the sliding log's expiry index; unused under GCRA
}

// walkBudget bounds how many index members beyond 2k one run of a sliding
// log's Lowest script visits: about 15 ms of the server's time on a small
// machine (BenchmarkLowest of the tenants reports the longest run), more
// for the largest k. A walk that needs more runs again, so no run holds
// the server for long.
const walkBudget = 1000

// Table calls the table scripts on the shards of one table. It is safe for
// concurrent use, but for SetWalkBudget.
type Table struct {
	client rueidis.Client
	policy limiter.Policy
	rate   limiter.Rate // GCRA's arithmetic, for Lowest's entries
	shards []Shard
	// Either the policy is given (policyArgs, and max keys a shard holds)
	// or it is read by the scripts from a keyed limiter's definition (def,
	// and gen, the generation Lowest expects).
	policyArgs []string
	max        string
	def, gen   string
	budget     int
	reruns     atomic.Int64
}

// NewTable returns the Table of keys in shards under policy p, which must
// be valid, each shard holding at most maxPerShard keys: keys of 1 to 128
// bytes with no control characters, placed in shards by the caller.
func NewTable(client rueidis.Client, p limiter.Policy, shards []Shard, maxPerShard int) *Table {
	t := &Table{
		client: client, shards: shards, policyArgs: DefinitionValues(p),
		max: strconv.Itoa(maxPerShard), budget: walkBudget,
	}
	t.setPolicy(p)
	return t
}

func (t *Table) setPolicy(p limiter.Policy) {
	t.policy = p.Normalize()
	if t.policy.Algorithm == limiter.GCRA {
		t.rate = limiter.NewRate(t.policy)
	}
}

// SetWalkBudget sets how many index members beyond 2k one run of a sliding
// log's Lowest script may visit (1000 by default), for tests.
func (t *Table) SetWalkBudget(n int) { t.budget = n }

// Reruns counts the shard scripts of Lowest sent again because their walk
// ran out of budget, for tests.
func (t *Table) Reruns() int64 { return t.reruns.Load() }

// The errors of a keyed limiter's table scripts, which the Store turns
// into its own.
var (
	errNoDefinition = errors.New("no definition")
	errNotKeyed     = errors.New("definition not keyed")
	errStale        = errors.New("definition replaced")
)

// keys and args are a table script's keys and arguments for shard i; see
// lua/table.lua.
func (t *Table) keys(i int) []string {
	sh := &t.shards[i]
	if t.def != "" {
		return []string{sh.Idx, sh.Exp, t.def}
	}
	return []string{sh.Idx, sh.Exp}
}

func (t *Table) args(i int, key, nowMicros, n, budget string) []string {
	a := make([]string, 7, 7+len(t.policyArgs))
	a[0], a[1], a[2], a[3], a[4], a[5], a[6] = t.shards[i].Base, key, nowMicros, t.max, n, budget, t.gen
	return append(a, t.policyArgs...)
}

// refused reads a keyed limiter's refusal from a reply, or returns nil.
func refused(v []int64) error {
	if len(v) != 1 {
		return nil
	}
	switch v[0] {
	case -1:
		return errNoDefinition
	case -2:
		return errNotKeyed
	case -3:
		return errStale
	}
	return nil
}

// Acquire takes permits (valid, see limiter.CheckPermits) from key of
// shard i, all or nothing, at nowMicros (microseconds since the Unix
// epoch, in decimal; only tests pass one) or at the server's time when it
// is empty. full reports a denial because the shard holds its bound of
// keys and the one it would evict is limited. When the error wraps
// limiter.ErrUnavailable the permits may or may not have been taken.
func (t *Table) Acquire(ctx context.Context, i int, key string, permits int64, nowMicros string) (d limiter.Decision, full bool, err error) {
	return keyDecision(acquireKeyScript.Exec(ctx, t.client, t.keys(i), t.acquireArgs(i, key, permits, nowMicros)), permits)
}

func (t *Table) acquireArgs(i int, key string, permits int64, nowMicros string) []string {
	return t.args(i, key, nowMicros, strconv.FormatInt(permits, 10), "")
}

// keyDecision reads key_acquire.lua's reply to taking permits.
func keyDecision(reply rueidis.RedisResult, permits int64) (d limiter.Decision, full bool, err error) {
	v, err := reply.AsIntSlice()
	if err != nil {
		return limiter.Decision{}, false, fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	if err := refused(v); err != nil {
		return limiter.Decision{}, false, err
	}
	if len(v) != DecisionFields+1 {
		return limiter.Decision{}, false, fmt.Errorf("%w: unexpected reply %v", limiter.ErrUnavailable, v)
	}
	return DecisionOf(v, permits), v[DecisionFields] == 1, nil
}

// Available reports what key of shard i could take now, as Acquire would
// tell it of one permit, without taking anything, in one read-only
// script. A key without state has a full bucket, unless the shard holds
// its bound and cannot make room: then full is set.
func (t *Table) Available(ctx context.Context, i int, key, nowMicros string) (a limiter.Availability, full bool, err error) {
	v, err := availableKeyScript.Exec(ctx, t.client, t.keys(i), t.args(i, key, nowMicros, "", "")).AsIntSlice()
	if err != nil {
		return limiter.Availability{}, false, fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	if err := refused(v); err != nil {
		return limiter.Availability{}, false, err
	}
	if len(v) != 5 {
		return limiter.Availability{}, false, fmt.Errorf("%w: unexpected reply %v", limiter.ErrUnavailable, v)
	}
	return limiter.Availability{Remaining: v[0], Limit: v[1], ResetAfter: Duration(v[2], v[3])}, v[4] == 1, nil
}

// TableEntry is one key of a Lowest answer.
type TableEntry struct {
	Key string
	limiter.Availability
}

// candidate is one key of a shard's Lowest answer.
type candidate struct {
	key       string
	tat       limiter.TAT // GCRA only
	remaining int64       // sliding log only, counted at its shard's instant
	resetAt   int64       // sliding log only: when its log empties, in ns since the epoch
}

// Lowest returns up to k keys (1 <= k <= limiter.MaxLowest, checked by
// the caller) with the fewest permits left, in the order of
// memory.Keys.Lowest: Remaining ascending; ties under GCRA by TAT
// descending, under the sliding log by ResetAfter descending; then by key,
// bytewise. Keys with a full bucket are not listed.
//
// It sends one script per shard in one pipeline (each node receives its
// shards' scripts at once), and merges the shards' answers, each of which
// holds that shard's k lowest in Lowest's order: the k lowest overall are
// among them. A sliding log's shard whose walk ran out of budget is sent
// again, with the others in the same state, until every shard has
// answered or ctx is done. Each shard answers at its server's time, and
// the entries are given as seen at the latest of those instants (see
// entries).
func (t *Table) Lowest(ctx context.Context, k int, nowMicros string) ([]TableEntry, error) {
	n := len(t.shards)
	keys := make([][]string, n)
	args := make([][]string, n)
	pending := make([]int, n)
	for i := range n {
		keys[i] = t.keys(i)
		args[i] = t.args(i, "", nowMicros, strconv.Itoa(k), strconv.Itoa(t.budget))
		pending[i] = i
	}
	var all []candidate
	var at int64 // the latest instant a shard answered at, µs since the epoch
	for len(pending) > 0 {
		cmds := make(rueidis.Commands, len(pending))
		for j, i := range pending {
			cmds[j] = t.client.B().Evalsha().Sha1(lowestKeysSHA1).Numkeys(int64(len(keys[i]))).Key(keys[i]...).Arg(args[i]...).Build()
		}
		var again []int
		for j, res := range t.client.DoMulti(ctx, cmds...) {
			i := pending[j]
			if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
				// The server lost its script cache (a restart, a failover
				// or SCRIPT FLUSH): EVAL loads it again.
				res = lowestKeysScript.Exec(ctx, t.client, keys[i], args[i])
			}
			vals, err := res.ToArray()
			if err != nil {
				return nil, fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
			}
			if len(vals) == 1 {
				v, _ := vals[0].AsInt64()
				if err := refused([]int64{v}); err != nil {
					return nil, err
				}
			}
			done, now, cs, err := t.parseLowest(vals)
			if err != nil {
				return nil, fmt.Errorf("%w: shard %d: %w", limiter.ErrUnavailable, i, err)
			}
			if !done {
				again = append(again, i)
			}
			at = max(at, now)
			all = append(all, cs...)
		}
		pending = again
		t.reruns.Add(int64(len(again)))
	}
	return t.entries(all, k, at*1000), nil
}

// entries merges the shards' candidates into the k lowest as seen at now
// (ns since the epoch), the latest instant a shard answered at, so that
// one answer never mixes instants: each shard's script read its server's
// clock a little earlier or later than the others (by the time the
// scripts take, and in a Cluster by the skew between the nodes' clocks).
//
// Under GCRA this is exact: every entry is recomputed from its TAT at now,
// and a key full by then is left out, as is every key its shard did not
// list (their TATs are earlier still). Under the sliding log the reset
// instant is exact (the newest grant plus the period), keys whose log is
// empty by now are left out, and Remaining is the count at the shard's
// own instant: a grant that left the window between the two is still
// counted.
func (t *Table) entries(all []candidate, k int, now int64) []TableEntry {
	limit := t.policy.Limit
	out := make([]TableEntry, 0, min(k, len(all)))
	if t.policy.Algorithm == limiter.GCRA {
		slices.SortFunc(all, gcraOrder)
		for _, c := range all {
			if len(out) == k || c.tat.FullAt(now) {
				break
			}
			out = append(out, TableEntry{Key: c.key, Availability: t.rate.Available(c.tat, now)})
		}
		return out
	}
	slices.SortFunc(all, logOrder)
	for _, c := range all {
		if len(out) == k {
			break
		}
		if c.resetAt > now {
			out = append(out, TableEntry{Key: c.key, Availability: limiter.Availability{Remaining: c.remaining, Limit: limit, ResetAfter: time.Duration(c.resetAt - now)}})
		}
	}
	return out
}

// gcraOrder is Lowest's order under GCRA: latest TAT first (fewest permits
// left, and among equal counts the one that recovers last), then smallest
// key. The TAT order holds at every instant, so shards read at slightly
// different times still merge exactly.
func gcraOrder(a, b candidate) int {
	if c := b.tat.Compare(a.tat); c != 0 {
		return c
	}
	return cmp.Compare(a.key, b.key)
}

// logOrder is Lowest's order under the sliding log: fewest permits left,
// then latest reset, then smallest key.
func logOrder(a, b candidate) int {
	if c := cmp.Compare(a.remaining, b.remaining); c != 0 {
		return c
	}
	if c := cmp.Compare(b.resetAt, a.resetAt); c != 0 {
		return c
	}
	return cmp.Compare(a.key, b.key)
}

// parseLowest reads one shard's reply: whether it is an answer, the
// instant it answered at, then per key the key and either its TAT (GCRA)
// or what it holds and when it resets (sliding log). See
// lua/key_lowest.lua.
func (t *Table) parseLowest(vals []rueidis.RedisMessage) (done bool, now int64, cs []candidate, err error) {
	if len(vals) < 2 || (len(vals)-2)%t.fields() != 0 {
		return false, 0, nil, fmt.Errorf("reply of %d values", len(vals))
	}
	status, err1 := vals[0].AsInt64()
	now, err2 := vals[1].AsInt64()
	if err1 != nil || err2 != nil {
		return false, 0, nil, fmt.Errorf("malformed reply: %v, %v", err1, err2)
	}
	if status == 0 {
		return false, now, nil, nil
	}
	cs = make([]candidate, 0, (len(vals)-2)/t.fields())
	for i := 2; i < len(vals); i += t.fields() {
		key, err := vals[i].ToString()
		if err != nil {
			return false, 0, nil, err
		}
		a, err1 := vals[i+1].AsInt64()
		b, err2 := vals[i+2].AsInt64()
		if err1 != nil || err2 != nil {
			return false, 0, nil, fmt.Errorf("malformed entry for %q", key)
		}
		c := candidate{key: key}
		if t.policy.Algorithm == limiter.GCRA {
			// a µs plus b units of 1/limit ns.
			limit := t.policy.Limit
			c.tat = limiter.TAT{NS: a*1000 + b/limit, Frac: uint32(b % limit)}
		} else {
			ns, err := vals[i+3].AsInt64()
			if err != nil {
				return false, 0, nil, err
			}
			// a permits held, the log empty b µs plus ns after now.
			c.remaining = t.policy.Limit - a
			c.resetAt = now*1000 + int64(Duration(b, ns))
		}
		cs = append(cs, c)
	}
	return true, now, cs, nil
}

// fields is the number of values per key in a Lowest reply.
func (t *Table) fields() int {
	if t.policy.Algorithm == limiter.GCRA {
		return 3
	}
	return 4
}
