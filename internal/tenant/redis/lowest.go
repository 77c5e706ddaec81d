package redis

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// walkBudget bounds how many index members beyond 2k one run of a sliding
// log's Lowest script visits: about 15 ms of the server's time on a small
// machine (BenchmarkLowest reports the longest run), more for the largest
// k. A walk that needs more runs again, so no run holds the server for
// long.
const walkBudget = 1000

// candidate is one tenant of a shard's Lowest answer.
type candidate struct {
	key       uint64
	tat       limiter.TAT // GCRA only
	remaining int64       // sliding log only, counted at its shard's instant
	resetAt   int64       // sliding log only: when its log empties, in ns since the epoch
}

// lowest is Lowest at nowMicros, like acquire. It sends one script per
// shard in one pipeline (each node receives its shards' scripts at once),
// and merges the shards' answers, each of which holds that shard's k
// lowest in Lowest's order: the k lowest overall are among them. A sliding
// log's shard whose walk ran out of budget is sent again, with the others
// in the same state, until every shard has answered or ctx is done.
func (ts *Tenants) lowest(ctx context.Context, k int, nowMicros string) ([]tenant.Entry, error) {
	if k < 1 || k > tenant.MaxLowest {
		return nil, fmt.Errorf("redis: tenant lowest: %w: k must be between 1 and %d, got %d", tenant.ErrInvalidK, tenant.MaxLowest, k)
	}
	keys := make([][]string, numShards)
	args := make([][]string, numShards)
	pending := make([]int, numShards)
	for i := range ts.shards {
		sh := &ts.shards[i]
		keys[i] = []string{sh.idx}
		if ts.policy.Algorithm == limiter.SlidingLog {
			keys[i] = append(keys[i], sh.exp)
		}
		args[i] = ts.args(strconv.Itoa(k), sh.base, nowMicros, strconv.Itoa(ts.budget))
		pending[i] = i
	}
	var all []candidate
	var at int64 // the latest instant a shard answered at, µs since the epoch
	for len(pending) > 0 {
		cmds := make(rueidis.Commands, len(pending))
		for j, i := range pending {
			cmds[j] = ts.client.B().Evalsha().Sha1(lowestSHA).Numkeys(int64(len(keys[i]))).Key(keys[i]...).Arg(args[i]...).Build()
		}
		var again []int
		for j, res := range ts.client.DoMulti(ctx, cmds...) {
			i := pending[j]
			if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
				// The server lost its script cache (a restart, a failover
				// or SCRIPT FLUSH): EVAL loads it again.
				res = lowestScript.Exec(ctx, ts.client, keys[i], args[i])
			}
			vals, err := res.ToArray()
			if err != nil {
				return nil, fmt.Errorf("redis: tenant lowest: %w: %w", limiter.ErrUnavailable, err)
			}
			done, now, cs, err := ts.parseLowest(vals)
			if err != nil {
				return nil, fmt.Errorf("redis: tenant lowest: %w: shard %d: %w", limiter.ErrUnavailable, i, err)
			}
			if !done {
				again = append(again, i)
			}
			at = max(at, now)
			all = append(all, cs...)
		}
		pending = again
		ts.reruns.Add(int64(len(again)))
	}
	return ts.entries(all, k, at*1000), nil
}

// entries merges the shards' candidates into the k lowest as seen at now
// (ns since the epoch), the latest instant a shard answered at, so that
// one answer never mixes instants: each shard's script read its server's
// clock a little earlier or later than the others (by the time the
// scripts take, and in a Cluster by the skew between the nodes' clocks).
//
// Under GCRA this is exact: every entry is recomputed from its TAT at now,
// and a tenant full by then is left out, as is every tenant its shard did
// not list (their TATs are earlier still). Under the sliding log the reset
// instant is exact (the newest grant plus the period), tenants whose log
// is empty by now are left out, and Remaining is the count at the shard's
// own instant: a grant that left the window between the two is still
// counted.
func (ts *Tenants) entries(all []candidate, k int, now int64) []tenant.Entry {
	limit := ts.policy.Limit
	out := make([]tenant.Entry, 0, min(k, len(all)))
	if ts.policy.Algorithm == limiter.GCRA {
		slices.SortFunc(all, gcraOrder)
		for _, c := range all {
			if len(out) == k || c.tat.FullAt(now) {
				break
			}
			av := ts.rate.Available(c.tat, now)
			out = append(out, tenant.Entry{Tenant: tenant.KeyName(c.key, ts.bits), Remaining: av.Remaining, Limit: limit, ResetAfter: av.ResetAfter})
		}
		return out
	}
	slices.SortFunc(all, logOrder)
	for _, c := range all {
		if len(out) == k {
			break
		}
		if c.resetAt > now {
			out = append(out, tenant.Entry{Tenant: tenant.KeyName(c.key, ts.bits), Remaining: c.remaining, Limit: limit, ResetAfter: time.Duration(c.resetAt - now)})
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
// instant it answered at, then per tenant its key and either its TAT
// (GCRA) or what it holds and when it resets (sliding log). See
// lua/lowest.lua.
func (ts *Tenants) parseLowest(vals []rueidis.RedisMessage) (done bool, now int64, cs []candidate, err error) {
	if len(vals) < 2 || (len(vals)-2)%ts.fields() != 0 {
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
	cs = make([]candidate, 0, (len(vals)-2)/ts.fields())
	for i := 2; i < len(vals); i += ts.fields() {
		h, err := vals[i].ToString()
		if err != nil {
			return false, 0, nil, err
		}
		key, err := strconv.ParseUint(h, 16, 64)
		if err != nil {
			return false, 0, nil, err
		}
		a, err1 := vals[i+1].AsInt64()
		b, err2 := vals[i+2].AsInt64()
		if err1 != nil || err2 != nil {
			return false, 0, nil, fmt.Errorf("malformed entry for %s", h)
		}
		c := candidate{key: key}
		if ts.policy.Algorithm == limiter.GCRA {
			// a µs plus b units of 1/limit ns.
			limit := ts.policy.Limit
			c.tat = limiter.TAT{NS: a*1000 + b/limit, Frac: uint32(b % limit)}
		} else {
			ns, err := vals[i+3].AsInt64()
			if err != nil {
				return false, 0, nil, err
			}
			// a permits held, the log empty b µs plus ns after now.
			c.remaining = ts.policy.Limit - a
			c.resetAt = now*1000 + int64(limiterredis.Duration(b, ns))
		}
		cs = append(cs, c)
	}
	return true, now, cs, nil
}

// fields is the number of values per tenant in a Lowest reply.
func (ts *Tenants) fields() int {
	if ts.policy.Algorithm == limiter.GCRA {
		return 3
	}
	return 4
}
