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
// Policy.Validate, limiter.CheckGroup, limiter.CheckKeyed); Create does not
// check, and fills in the defaults (Definition.Normalize).
//
// A limiter is created as Put creates it: under its group's keys, and, for
// a keyed limiter, with its bound of keys and a new generation. Creating
// counts against the Store's maximum as Put does: each name is first
// reserved in the index (reserve.lua, one pipelined round trip for all),
// and a limiter for which the index has no room is not created; the error
// then wraps limiter.ErrTooManyLimiters. Then each reserved limiter's group
// is claimed in the directory, as Put claims it (see claim; two pipelined
// round trips), even when the Store believes it knows the group: a Redis
// that lost the limiter lost its directory entry too. A limiter the
// directory places in another group is not created, and never moved: the
// error then wraps limiter.ErrGroupConflict. The claimed ones take one more
// round trip: one script per limiter, which writes its definition if
// absent, atomically, then one ZADD of their names to the index, for a
// Delete that may have removed one meanwhile (see Put). (If the server
// lost its scripts, those answered NOSCRIPT are sent again with their
// source.) Otherwise the error wraps ErrUnavailable. The error is that of
// the first limiter of defs that Redis did not reserve, claim, create or
// confirm; the others' answers stand.
func (s *Store) Create(ctx context.Context, defs ...limiter.Definition) (created []string, err error) {
	created, errs := s.create(ctx, defs)
	for _, err := range errs {
		if err != nil {
			return created, err
		}
	}
	return created, nil
}

// create is Create, reporting the error of each of all, in their order:
// nil for a limiter that exists now.
func (s *Store) create(ctx context.Context, all []limiter.Definition) (created []string, errs []error) {
	errs = make([]error, len(all))
	defs := make([]limiter.Definition, len(all))
	for i, def := range all {
		defs[i] = def.Normalize()
	}
	todo := s.claimAll(ctx, defs, s.reserve(ctx, defs, errs), errs)
	if len(todo) == 0 {
		return nil, errs
	}
	c := s.client
	keys := make([][]string, len(todo))
	args := make([][]string, len(todo))
	cmds := make(rueidis.Commands, len(todo))
	for k, i := range todo {
		keys[k], args[k] = s.createCall(defs[i])
		cmds[k] = c.B().Evalsha().Sha1(createSHA1).Numkeys(int64(len(keys[k]))).Key(keys[k]...).Arg(args[k]...).Build()
	}
	replies := c.DoMulti(ctx, cmds...)
	// Creating is idempotent, so any reply answered NOSCRIPT runs again,
	// in any order.
	var again []int
	for k, reply := range replies {
		if isNoScript(reply) {
			again = append(again, k)
		}
	}
	if len(again) > 0 {
		evals := make(rueidis.Commands, len(again))
		for e, k := range again {
			evals[e] = c.B().Eval().Script(createLua).Numkeys(int64(len(keys[k]))).Key(keys[k]...).Arg(args[k]...).Build()
		}
		for e, reply := range c.DoMulti(ctx, evals...) {
			replies[again[e]] = reply
		}
	}
	for k, reply := range replies {
		i := todo[k]
		n, err := reply.AsInt64()
		switch {
		case err != nil:
			errs[i] = unavailable("create", defs[i].Name, err)
		case n == 1:
			created = append(created, defs[i].Name)
			// A limiter from the config file was counted in the budget
			// of keys when it was first put: it is counted again, never
			// refused.
			if defs[i].Keyed {
				if err := s.keyBudget(ctx, defs[i].Name, defs[i].MaxKeys, budgetForce); err != nil {
					errs[i] = err
				}
			}
		}
	}
	// The index after the definitions, as Put orders them (see Delete).
	zadd := c.B().Zadd().Key(s.names).ScoreMember()
	for _, i := range todo {
		zadd = zadd.ScoreMember(0, defs[i].Name)
	}
	if err := c.Do(ctx, zadd.Build()).Error(); err != nil {
		for _, i := range todo {
			if errs[i] == nil {
				errs[i] = unavailable("create", defs[i].Name, err)
			}
		}
	}
	return created, errs
}

// createCall returns the keys and arguments of create.lua for def, which
// is normalized: its keys where its group places them, its table's keys
// (which a plain limiter does not use), and its definition as Put writes
// it.
func (s *Store) createCall(def limiter.Definition) (keys, args []string) {
	keys = s.keysIn(def.Name, def.Group)
	idx, exp := tableKeys(keys[0])
	keys = append(keys, idx, exp)
	args = groupArgs(definitionArgs(def.Policy), def.Group)
	if def.Keyed {
		args = append(args, fieldMaxKeys, strconv.Itoa(def.MaxKeys))
	}
	return keys, append(args, fieldGen, newGeneration())
}

// claimAll claims the group of each of defs[i] for i in which in the
// directory, as claim does, in two pipelined round trips, and returns the
// indexes of those it claimed; it sets errs[i] for the others.
func (s *Store) claimAll(ctx context.Context, defs []limiter.Definition, which []int, errs []error) []int {
	if len(which) == 0 {
		return nil
	}
	c := s.client
	// A limiter made before the directory existed has no entry and lives
	// in no group: look for it where it would be.
	legacy := make(map[int]string, len(which))
	var probes rueidis.Commands
	var probed []int
	for _, i := range which {
		legacy[i] = "0"
		if defs[i].Group != "" {
			probes = append(probes, c.B().Exists().Key(s.defKey(defs[i].Name)).Build())
			probed = append(probed, i)
		}
	}
	if len(probes) > 0 {
		for p, reply := range c.DoMulti(ctx, probes...) {
			i := probed[p]
			n, err := reply.AsInt64()
			switch {
			case err != nil:
				errs[i] = unavailable("create", defs[i].Name, err)
				delete(legacy, i)
			case n == 1:
				legacy[i] = "1"
			}
		}
	}
	var execs []rueidis.LuaExec
	var sent []int
	for _, i := range which {
		if l, ok := legacy[i]; ok {
			execs = append(execs, rueidis.LuaExec{Keys: []string{s.directory}, Args: []string{defs[i].Name, defs[i].Group, l}})
			sent = append(sent, i)
		}
	}
	if len(execs) == 0 {
		return nil
	}
	var claimed []int
	for e, reply := range claimScript.ExecMulti(ctx, c, execs...) {
		i := sent[e]
		def := defs[i]
		cur, ok, err := claimAnswer(reply)
		switch {
		case err != nil:
			errs[i] = unavailable("create", def.Name, err)
		case ok:
			s.learn(def.Name, def.Group)
			claimed = append(claimed, i)
		default:
			s.learn(def.Name, cur)
			errs[i] = fmt.Errorf("redis: create %q: %w", def.Name, limiter.GroupConflict(cur, def.Group))
		}
	}
	return claimed
}

// claimAnswer reads claim.lua's reply: whether the limiter is in the group
// claimed, and otherwise the group it is in.
func claimAnswer(reply rueidis.RedisResult) (group string, ok bool, err error) {
	vals, err := reply.ToArray()
	if err != nil {
		return "", false, err
	}
	if len(vals) == 0 {
		return "", false, fmt.Errorf("claim: empty reply")
	}
	n, err := vals[0].AsInt64()
	if err != nil || n == 1 {
		return "", n == 1, err
	}
	if len(vals) < 2 {
		return "", false, fmt.Errorf("claim: no group in the reply")
	}
	group, err = vals[1].ToString()
	return group, false, err
}

// reserve makes room in the index for each of defs, as Put does, in one
// pipelined round trip, and returns the indexes of those it made room for;
// it sets errs[i], wrapping limiter.ErrTooManyLimiters or ErrUnavailable,
// for the others.
func (s *Store) reserve(ctx context.Context, defs []limiter.Definition, errs []error) (reserved []int) {
	if len(defs) == 0 {
		return nil
	}
	max := strconv.Itoa(s.max)
	execs := make([]rueidis.LuaExec, len(defs))
	for i, def := range defs {
		execs[i] = rueidis.LuaExec{Keys: []string{s.names}, Args: []string{def.Name, max}}
	}
	for i, reply := range reserveScript.ExecMulti(ctx, s.client, execs...) {
		room, err := reply.AsInt64()
		switch {
		case err != nil:
			errs[i] = unavailable("create", defs[i].Name, err)
		case room == 0:
			errs[i] = fmt.Errorf("redis: create %q: %w: the maximum is %d", defs[i].Name, limiter.ErrTooManyLimiters, s.max)
		default:
			reserved = append(reserved, i)
		}
	}
	return reserved
}

// Declare puts each declared limiter, so that the configuration's policy
// replaces any other: a replica that starts with a changed configuration
// applies it, group, keys and bound of keys included. It retries a limiter
// every second while Redis cannot answer, and logs one that fails
// otherwise, until ctx is done: among them one that exists in another group
// (or in a group when declared in none, or the reverse), which Put refuses
// to move (limiter.ErrGroupConflict) and leaves as it is.
func (l *Lazy) Declare(ctx context.Context, logger *slog.Logger) {
	for _, def := range l.declared.Load().list {
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
// limiter exists, and creates those that do not (see Store.Create: a few
// pipelined round trips, a tiny script per declared limiter); it logs the
// names it created, which tell that Redis lost them. A declared limiter it
// cannot create for another reason than an outage (one created in another
// group meanwhile, or no room under the maximum) is logged as Declare logs
// it, once for as long as the checks keep failing on it. A check Redis
// cannot answer is left to the next: the health watch reports outages.
// With no declared limiters a check does nothing: a reload may declare some.
func (l *Lazy) Keep(ctx context.Context, interval time.Duration, logger *slog.Logger) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	refused := make(map[string]bool) // logged as not created, by name
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		declared := l.declared.Load().list
		st, err := l.get()
		if err != nil || len(declared) == 0 {
			continue
		}
		cctx, cancel := l.bound(ctx)
		created, errs := st.create(cctx, declared)
		cancel()
		if len(created) > 0 {
			logger.Warn("declared limiters were missing from Redis and are created again", "names", created)
		}
		for i, err := range errs {
			name := declared[i].Name
			switch {
			case err == nil:
				delete(refused, name)
			case errors.Is(err, limiter.ErrUnavailable), refused[name]:
			default:
				refused[name] = true
				logger.Error("limiter from the config file not created", "name", name, "error", err)
			}
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
	def, ok := l.declared.Load().byName[name]
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
	byName := l.declared.Load().byName
	missing := make(map[string]bool) // declared limiters found missing by every request on them
	for i, r := range reqs {
		_, declared := byName[r.Name]
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
			defs = append(defs, byName[name])
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
