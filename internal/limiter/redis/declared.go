package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Create creates each limiter of defs that does not exist, and leaves any
// that does exist as it is, whatever its policy: it never reverts a limiter
// replaced since, as Put would. It returns the names it created, in the
// order of defs. Each def must be valid (limiter.CheckName,
// Policy.Validate); Create does not check.
//
// Creating counts against the Store's maximum as Put does: each name is
// first reserved in the index (reserve.lua, one pipelined round trip for
// all), and a limiter for which the index has no room is not created; the
// error then wraps limiter.ErrTooManyLimiters. The reserved ones take one
// more round trip: one script per limiter, which writes its definition if
// absent, atomically, then one ZADD of their names to the index, for a
// Delete that may have removed one meanwhile (see Put). (If the server
// lost its scripts, those answered NOSCRIPT are sent again with their
// source.) Otherwise the error wraps ErrUnavailable, for the first limiter
// Redis did not reserve, create or confirm; the others' answers stand.
func (s *Store) Create(ctx context.Context, all ...limiter.Definition) (created []string, err error) {
	defs, err := s.reserve(ctx, all)
	defs, err = s.claimAll(ctx, defs, err)
	if len(defs) == 0 {
		return nil, err
	}
	c := s.client
	cmds := make(rueidis.Commands, len(defs))
	for i, def := range defs {
		keys := s.keysIn(def.Name, def.Group)
		cmds[i] = c.B().Evalsha().Sha1(createSHA1).Numkeys(int64(len(keys))).
			Key(keys...).Arg(groupArgs(definitionArgs(def.Policy.Normalize()), def.Group)...).Build()
	}
	replies := c.DoMulti(ctx, cmds...)
	// Creating is idempotent, so any reply answered NOSCRIPT runs again,
	// in any order.
	var again []int
	for i, reply := range replies {
		if isNoScript(reply) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		evals := make(rueidis.Commands, len(again))
		for k, i := range again {
			keys := s.keysIn(defs[i].Name, defs[i].Group)
			evals[k] = c.B().Eval().Script(createLua).Numkeys(int64(len(keys))).
				Key(keys...).Arg(groupArgs(definitionArgs(defs[i].Policy.Normalize()), defs[i].Group)...).Build()
		}
		for k, reply := range c.DoMulti(ctx, evals...) {
			replies[again[k]] = reply
		}
	}
	for i, reply := range replies {
		n, rerr := reply.AsInt64()
		switch {
		case rerr != nil && err == nil:
			err = unavailable("create", defs[i].Name, rerr)
		case rerr == nil && n == 1:
			created = append(created, defs[i].Name)
		}
	}
	// The index after the definitions, as Put orders them (see Delete).
	zadd := c.B().Zadd().Key(s.names).ScoreMember()
	for _, def := range defs {
		zadd = zadd.ScoreMember(0, def.Name)
	}
	if zerr := c.Do(ctx, zadd.Build()).Error(); zerr != nil && err == nil {
		err = unavailable("create", defs[0].Name, zerr)
	}
	return created, err
}

// claimAll claims each of defs's groups in the directory (see claim),
// except those the Store already knows in theirs, and returns the defs it
// claimed; err is the first error so far, kept unless nil.
func (s *Store) claimAll(ctx context.Context, defs []limiter.Definition, err error) ([]limiter.Definition, error) {
	kept := defs[:0:0]
	for _, def := range defs {
		if g, ok := s.known(def.Name); ok && g == def.Group {
			kept = append(kept, def)
			continue
		}
		if cerr := s.claim(ctx, def); cerr != nil {
			if err == nil {
				err = cerr
			}
			continue
		}
		kept = append(kept, def)
	}
	return kept, err
}

// reserve makes room in the index for each of defs, as Put does, in one
// pipelined round trip, and returns those it made room for. The error
// wraps limiter.ErrTooManyLimiters, or ErrUnavailable, for the first one
// it could not.
func (s *Store) reserve(ctx context.Context, defs []limiter.Definition) (reserved []limiter.Definition, err error) {
	if len(defs) == 0 {
		return nil, nil
	}
	max := strconv.Itoa(s.max)
	execs := make([]rueidis.LuaExec, len(defs))
	for i, def := range defs {
		execs[i] = rueidis.LuaExec{Keys: []string{s.names}, Args: []string{def.Name, max}}
	}
	for i, reply := range reserveScript.ExecMulti(ctx, s.client, execs...) {
		room, rerr := reply.AsInt64()
		switch {
		case rerr != nil:
			if err == nil {
				err = unavailable("create", defs[i].Name, rerr)
			}
		case room == 0:
			if err == nil {
				err = fmt.Errorf("redis: create %q: %w: the maximum is %d", defs[i].Name, limiter.ErrTooManyLimiters, s.max)
			}
		default:
			reserved = append(reserved, defs[i])
		}
	}
	return reserved, err
}

// Declare puts each declared limiter, so that the configuration's policy
// replaces any other: a replica that starts with a changed configuration
// applies it. It retries a limiter every second while Redis cannot answer,
// and logs one that fails otherwise, until ctx is done.
func (l *Lazy) Declare(ctx context.Context, logger *slog.Logger) {
	for _, def := range l.declared {
		for {
			pctx, cancel := l.bound(ctx)
			_, err := l.Put(pctx, def)
			cancel()
			if err == nil {
				break
			}
			if !errors.Is(err, limiter.ErrUnavailable) || ctx.Err() != nil {
				logger.Error("limiter from the config file not created", "name", def.Name, "error", err)
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// Keep checks every interval, until ctx is done, that each declared
// limiter exists, and creates those that do not (see Store.Create: one
// round trip, a tiny script per declared limiter); it logs the names it
// created, which tell that Redis lost them. A check Redis cannot answer is
// left to the next: the health watch reports outages. With no declared
// limiters Keep returns at once.
func (l *Lazy) Keep(ctx context.Context, interval time.Duration, logger *slog.Logger) {
	if len(l.declared) == 0 {
		return
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		st, err := l.get()
		if err != nil {
			continue
		}
		cctx, cancel := l.bound(ctx)
		created, _ := st.Create(cctx, l.declared...)
		cancel()
		if len(created) > 0 {
			logger.Warn("declared limiters were missing from Redis and are created again", "names", created)
		}
	}
}

// restore creates name's limiter if it is declared and absent, after a
// call on st found it missing, and reports whether the call should be made
// again: whether the limiter exists now.
func (l *Lazy) restore(ctx context.Context, st *Store, name string, err error) bool {
	if !errors.Is(err, limiter.ErrNotFound) {
		return false
	}
	def, ok := l.byName[name]
	if !ok {
		return false
	}
	_, cerr := st.Create(ctx, def)
	return cerr == nil
}

// restoreBatch is restore for a batch that st decided into out: it
// creates the missing declared limiters and decides their requests again.
// A limiter that one of the batch's requests found and another did not
// (created meanwhile by another caller) keeps its results: deciding the
// missing ones now would decide them after later requests on the same
// limiter, against the batch's order.
func (l *Lazy) restoreBatch(ctx context.Context, st *Store, reqs []limiter.Request, out []limiter.Result) {
	missing := make(map[string]bool) // declared limiters found missing by every request on them
	for i, r := range reqs {
		_, declared := l.byName[r.Name]
		if !declared {
			continue
		}
		gone := errors.Is(out[i].Err, limiter.ErrNotFound)
		if was, seen := missing[r.Name]; !seen || was {
			missing[r.Name] = gone
		}
	}
	var defs []limiter.Definition
	for name, gone := range missing {
		if gone {
			defs = append(defs, l.byName[name])
		}
	}
	if len(defs) == 0 {
		return
	}
	if _, err := st.Create(ctx, defs...); err != nil {
		return
	}
	var again []int
	for i, r := range reqs {
		if missing[r.Name] {
			again = append(again, i)
		}
	}
	sub := make([]limiter.Request, len(again))
	for k, i := range again {
		sub[k] = reqs[i]
	}
	res := make([]limiter.Result, len(again))
	st.AcquireBatch(ctx, sub, res)
	for k, i := range again {
		out[i] = res[k]
	}
}
