package redis

import (
	"context"
	"errors"
	"slices"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

var _ limiter.BatchStore = (*Store)(nil)

// AcquireBatch decides each reqs[i] into out[i] as Acquire would, with the
// same decision or the same error, in one pipelined round trip. A batch's
// requests on one limiter go together as one run of Acquire's script
// (EVALSHA) that decides each of them in the order given, as if alone, up
// to maxGroup per run; a request naming a key of a keyed limiter is a run
// of AcquireKey's script of its own. The runs are all sent together.
// The batch is not atomic: other clients' commands may run between its
// runs, and one request's failure does not fail the others on other
// limiters. When the server has lost its scripts (a restart, a failover,
// SCRIPT FLUSH) the runs answered NOSCRIPT are sent again with the script's
// source (EVAL) in a second round trip, as Acquire does for one; see
// rerunnable for the ones that are not. As with Acquire nothing else is
// retried: a request whose error wraps ErrUnavailable may or may not have
// taken its permits.
//
// len(out) must be len(reqs). Requests should be valid (limiter.CheckName,
// limiter.CheckPermits); one with invalid permits fails on its own, with
// Acquire's error, and is not sent.
//
// The requests on a limiter that every one of them found missing, where
// the Store believed it lived, are decided again, in order, if the
// directory places it elsewhere (see groups.go): their runs found no
// definition and so changed nothing.
func (s *Store) AcquireBatch(ctx context.Context, reqs []limiter.Request, out []limiter.Result) {
	s.acquireBatch(ctx, reqs, out)
	missing := make(map[string]bool) // limiters every request on found missing
	for i, r := range reqs {
		gone := errors.Is(out[i].Err, limiter.ErrNotFound)
		if was, seen := missing[r.Name]; !seen || was {
			missing[r.Name] = gone
		}
	}
	var names, was []string
	for name, gone := range missing {
		if gone {
			names, was = append(names, name), append(was, s.groupOf(name))
		}
	}
	if len(names) == 0 {
		return
	}
	groups, err := s.lookup(ctx, names...)
	if err != nil {
		return
	}
	moved := make(map[string]bool)
	for k, name := range names {
		moved[name] = groups[k] != was[k]
	}
	var again []int
	for i, r := range reqs {
		if moved[r.Name] {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return
	}
	sub := make([]limiter.Request, len(again))
	for k, i := range again {
		sub[k] = reqs[i]
	}
	res := make([]limiter.Result, len(again))
	s.acquireBatch(ctx, sub, res)
	for k, i := range again {
		out[i] = res[k]
	}
}

// acquireBatch is AcquireBatch where the Store believes each limiter lives.
func (s *Store) acquireBatch(ctx context.Context, reqs []limiter.Request, out []limiter.Result) {
	// rueidis's Lua.ExecMulti is not used: it sends SCRIPT LOAD to every
	// node and waits for all of them before each batch, a second round trip
	// every time, and one node that cannot answer fails every request, even
	// those whose limiters live elsewhere.
	//
	// The order of a limiter's runs holds because rueidis (v1.0.79) writes
	// the commands one DoMulti sends down one connection as one run, in the
	// order given (pipe.DoMulti queues them as one entry of its ring, which
	// a single goroutine writes out). A standalone client sends the whole
	// batch down one connection (mux.pipelineMulti); a cluster client
	// groups the commands by the master of their slot, keeping their order
	// (clusterClient._pickMulti), and sends each group down one connection
	// to that master. Redis runs a connection's commands in order, and a
	// limiter's two keys share a slot. A command redirected by MOVED or ASK
	// (resharding) is sent again to the new owner after its limiter's
	// earlier commands have run on the old one.
	runs := make([]run, 0, len(reqs))
	open := make(map[string]int) // a limiter's last run, while it has room
	for i, r := range reqs {
		if err := checkPermits(r.Name, r.Permits); err != nil {
			out[i] = limiter.Result{Err: err}
			continue
		}
		if r.Key != "" {
			// A key's script decides one acquisition: its runs hold one.
			runs = append(runs, run{name: r.Name, key: r.Key, reqs: []int{i}, permits: []int64{r.Permits}})
			continue
		}
		j, ok := open[r.Name]
		if !ok || len(runs[j].permits) == maxGroup {
			j = len(runs)
			open[r.Name] = j
			runs = append(runs, run{name: r.Name})
		}
		runs[j].reqs = append(runs[j].reqs, i)
		runs[j].permits = append(runs[j].permits, r.Permits)
	}
	if len(runs) == 0 {
		return
	}
	cmds := make(rueidis.Commands, len(runs))
	for j, r := range runs {
		cmds[j] = s.evalsha(r)
	}
	replies := s.client.DoMulti(ctx, cmds...)
	if again := rerunnable(runs, replies); len(again) > 0 {
		evals := make(rueidis.Commands, len(again))
		for k, j := range again {
			evals[k] = s.eval(runs[j])
		}
		for k, reply := range s.client.DoMulti(ctx, evals...) {
			replies[again[k]] = reply
		}
	}
	results := make([]limiter.Result, maxGroup)
	for j, r := range runs {
		if r.key != "" {
			d, full, err := keyDecision(replies[j], r.permits[0])
			if err != nil {
				err = keyErr("acquire", r.name, err)
			}
			out[r.reqs[0]] = limiter.Result{Decision: d, KeysFull: full, Err: err}
			continue
		}
		res := results[:len(r.permits)]
		decisions(r.name, r.permits, replies[j], res)
		for k, i := range r.reqs {
			out[i] = res[k]
		}
	}
}

// run is a batch's requests on one limiter (or one key of a keyed
// limiter: then one request) that one script call decides.
type run struct {
	name    string
	key     string
	reqs    []int // indexes in the batch
	permits []int64
}

// bucket names what r decides on: its limiter, or its limiter's key.
func (r run) bucket() string { return r.name + "\x00" + r.key }

// evalsha is Acquire's script (AcquireKey's for a key) run by its digest,
// taking r's permits at the server's time.
func (s *Store) evalsha(r run) rueidis.Completed {
	if r.key != "" {
		t := s.keyTable(r.name)
		keys := t.keys(0)
		return s.client.B().Evalsha().Sha1(acquireKeySHA1).Numkeys(int64(len(keys))).
			Key(keys...).Arg(t.acquireArgs(0, r.key, r.permits[0], "")...).Build()
	}
	keys := s.keys(r.name)
	return s.client.B().Evalsha().Sha1(acquireSHA1).Numkeys(int64(len(keys))).
		Key(keys...).Arg(acquireArgs(r.permits, "")...).Build()
}

// eval is evalsha with the script's source, which the server runs and
// caches when it does not know the digest.
func (s *Store) eval(r run) rueidis.Completed {
	if r.key != "" {
		t := s.keyTable(r.name)
		keys := t.keys(0)
		return s.client.B().Eval().Script(acquireKeySource).Numkeys(int64(len(keys))).
			Key(keys...).Arg(t.acquireArgs(0, r.key, r.permits[0], "")...).Build()
	}
	keys := s.keys(r.name)
	return s.client.B().Eval().Script(acquireSource).Numkeys(int64(len(keys))).
		Key(keys...).Arg(acquireArgs(r.permits, "")...).Build()
}

// rerunnable returns, in increasing order, the indexes of the replies that
// are NOSCRIPT errors and may be sent again as EVAL: those followed by no
// other reply on the same limiter. If the script came back between two of
// a limiter's runs (another client's EVAL or SCRIPT LOAD), the first
// answered NOSCRIPT and the second ran: running the first now would decide
// its requests after the second's. They keep the error instead, which
// wraps ErrUnavailable as Acquire's errors from Redis do, and nothing was
// taken. Usually every run after the script went away answers NOSCRIPT,
// and all of them run again, in order.
func rerunnable(runs []run, replies []rueidis.RedisResult) []int {
	if !slices.ContainsFunc(replies, isNoScript) {
		return nil
	}
	var again []int
	ran := make(map[string]bool) // buckets with a later run that may have run
	for j := len(replies) - 1; j >= 0; j-- {
		b := runs[j].bucket()
		switch {
		case !isNoScript(replies[j]):
			ran[b] = true
		case !ran[b]:
			again = append(again, j)
		}
	}
	slices.Reverse(again)
	return again
}

// isNoScript reports whether the server answered that it does not know the
// script's digest.
func isNoScript(reply rueidis.RedisResult) bool {
	err, ok := rueidis.IsRedisErr(reply.Error())
	return ok && err.IsNoScript()
}
