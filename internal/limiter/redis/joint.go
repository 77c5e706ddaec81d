package redis

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Decide decides items together, all or nothing, in one atomic script
// (decide.lua) at the Redis server's time (or charges or refunds them all,
// unconditionally, by mode): the limiters of one decision
// share a group, and so a Cluster slot. The groups are checked first, from
// what the Store knows of them; the limiters it has not met are looked up
// in the directory, in one round trip, before that. A limiter not found
// where the Store believed it lived is looked up again, and the decision
// made once more if it moved: the first run found no definition and so
// changed nothing. As with Acquire nothing else is retried: when the error
// wraps ErrUnavailable the permits may or may not have been taken.
//
// A decision with once remembers it for limiter.OnceTTL under
// <prefix>{<tag>}#once:<once>, in the slot of its limiters (tag is their
// group, or the one limiter's name), checked and written by the same
// script: a retry is answered from it and decides nothing.
func (s *Store) Decide(ctx context.Context, items []limiter.Item, mode limiter.Mode, once string) (limiter.Verdict, error) {
	return s.decideAt(ctx, items, mode, once, "")
}

// decideAt is Decide at nowMicros (see acquire); only tests pass one.
func (s *Store) decideAt(ctx context.Context, items []limiter.Item, mode limiter.Mode, once, nowMicros string) (limiter.Verdict, error) {
	names, totals, index := limiter.Totals(items)
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
		keys := make([]string, 0, 2*len(names))
		for j, name := range names {
			keys = append(keys, s.keysIn(name, groups[j])...)
		}
		args := make([]string, 2, 2+len(totals))
		args[0], args[1] = nowMicros, mode.String() // decide.lua's names
		for _, n := range totals {
			args = append(args, strconv.FormatInt(n, 10))
		}
		if once != "" {
			tag := groups[0]
			if tag == "" {
				tag = names[0]
			}
			keys = append(keys, s.prefix+"{"+tag+"}#once:"+once)
			args = append(args, limiter.Fingerprint(items, mode), strconv.FormatInt(limiter.OnceTTL.Milliseconds(), 10))
		}
		v, err := decideScript.Exec(ctx, s.client, keys, args).AsIntSlice()
		if err != nil {
			return limiter.Verdict{}, unavailable("decide", names[0], err)
		}
		if len(v) == 1 && v[0] == -1 {
			return limiter.Verdict{}, fmt.Errorf("redis: decide: %w", limiter.ErrOnceMismatch)
		}
		replayed := len(v) > 0 && v[0] == 2
		if replayed {
			v[0] = 1
		}
		if len(v) == 2 && v[0] == 0 && v[1] >= 1 && v[1] <= int64(len(names)) {
			missing := names[v[1]-1]
			if again && s.relocated(ctx, missing) {
				continue
			}
			return limiter.Verdict{}, fmt.Errorf("redis: decide: %w", &limiter.MissingError{Name: missing})
		}
		if len(v) != 1+DecisionFields*len(names) || v[0] != 1 {
			return limiter.Verdict{}, unavailable("decide", names[0], fmt.Errorf("unexpected reply %v", v))
		}
		found := make([]limiter.Check, len(names))
		for j := range names {
			f := v[1+DecisionFields*j:]
			found[j] = limiter.Check{
				Fits: f[0] == 1, Remaining: f[1], Limit: f[2],
				RetryAfter: Duration(f[3], f[4]), ResetAfter: Duration(f[5], f[6]),
				ExceedsCapacity: f[7] == 1,
			}
		}
		verdict := limiter.NewVerdict(items, found, index)
		verdict.Replayed = replayed
		return verdict, nil
	}
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
