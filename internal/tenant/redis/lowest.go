package redis

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
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
	key uint64
	tat limiter.TAT // GCRA only
	av  limiter.Availability
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
			done, cs, err := ts.parseLowest(vals)
			if err != nil {
				return nil, fmt.Errorf("redis: tenant lowest: %w: shard %d: %w", limiter.ErrUnavailable, i, err)
			}
			if !done {
				again = append(again, i)
			}
			all = append(all, cs...)
		}
		pending = again
		ts.reruns.Add(int64(len(again)))
	}
	if ts.policy.Algorithm == limiter.GCRA {
		slices.SortFunc(all, gcraOrder)
	} else {
		slices.SortFunc(all, logOrder)
	}
	all = all[:min(k, len(all))]
	entries := make([]tenant.Entry, len(all))
	for i, c := range all {
		entries[i] = tenant.Entry{
			Tenant:     tenant.KeyName(c.key, ts.bits),
			Remaining:  c.av.Remaining,
			Limit:      c.av.Limit,
			ResetAfter: c.av.ResetAfter,
		}
	}
	return entries, nil
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
	if c := cmp.Compare(a.av.Remaining, b.av.Remaining); c != 0 {
		return c
	}
	if c := cmp.Compare(b.av.ResetAfter, a.av.ResetAfter); c != 0 {
		return c
	}
	return cmp.Compare(a.key, b.key)
}

// parseLowest reads one shard's reply: whether it is an answer, the
// instant it answered at, then per tenant its key and either its TAT
// (GCRA) or what it holds and when it resets (sliding log). See
// lua/lowest.lua.
func (ts *Tenants) parseLowest(vals []rueidis.RedisMessage) (done bool, cs []candidate, err error) {
	if len(vals) < 2 || (len(vals)-2)%ts.fields() != 0 {
		return false, nil, fmt.Errorf("reply of %d values", len(vals))
	}
	status, err1 := vals[0].AsInt64()
	now, err2 := vals[1].AsInt64()
	if err1 != nil || err2 != nil {
		return false, nil, fmt.Errorf("malformed reply: %v, %v", err1, err2)
	}
	if status == 0 {
		return false, nil, nil
	}
	cs = make([]candidate, 0, (len(vals)-2)/ts.fields())
	for i := 2; i < len(vals); i += ts.fields() {
		h, err := vals[i].ToString()
		if err != nil {
			return false, nil, err
		}
		key, err := strconv.ParseUint(h, 16, 64)
		if err != nil {
			return false, nil, err
		}
		a, err1 := vals[i+1].AsInt64()
		b, err2 := vals[i+2].AsInt64()
		if err1 != nil || err2 != nil {
			return false, nil, fmt.Errorf("malformed entry for %s", h)
		}
		c := candidate{key: key}
		if ts.policy.Algorithm == limiter.GCRA {
			// a µs plus b units of 1/limit ns.
			limit := ts.policy.Limit
			c.tat = limiter.TAT{NS: a*1000 + b/limit, Frac: uint32(b % limit)}
			c.av = ts.rate.Available(c.tat, now*1000)
		} else {
			ns, err := vals[i+3].AsInt64()
			if err != nil {
				return false, nil, err
			}
			// a permits held, resetting after b µs plus ns.
			c.av = limiter.Availability{Remaining: ts.policy.Limit - a, Limit: ts.policy.Limit, ResetAfter: duration(b, ns)}
		}
		cs = append(cs, c)
	}
	return true, cs, nil
}

// fields is the number of values per tenant in a Lowest reply.
func (ts *Tenants) fields() int {
	if ts.policy.Algorithm == limiter.GCRA {
		return 3
	}
	return 4
}
