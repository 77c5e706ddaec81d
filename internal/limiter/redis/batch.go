package redis

import (
	"context"
	"slices"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

var _ limiter.BatchStore = (*Store)(nil)

// AcquireBatch decides each reqs[i] into out[i] as Acquire would, with the
// same decision or the same error, in one pipelined round trip: each
// request is one run of Acquire's script (EVALSHA), and all of them are
// sent together. The batch is not atomic: other clients' commands may run
// between its requests, and one request's failure does not fail the
// others. Requests on one limiter are decided in the order given. When the
// server has lost its scripts (a restart, a failover, SCRIPT FLUSH) the
// requests answered NOSCRIPT are sent again with the script's source (EVAL)
// in a second round trip, as Acquire does for one; see rerunnable for the
// ones that are not. As with Acquire nothing else is retried: a request
// whose error wraps ErrUnavailable may or may not have taken its permits.
//
// len(out) must be len(reqs). Requests should be valid (limiter.CheckName,
// limiter.CheckPermits); one with invalid permits fails on its own, with
// Acquire's error, and is not sent.
func (s *Store) AcquireBatch(ctx context.Context, reqs []limiter.Request, out []limiter.Result) {
	// rueidis's Lua.ExecMulti is not used: it sends SCRIPT LOAD to every
	// node and waits for all of them before each batch, a second round trip
	// every time, and one node that cannot answer fails every request, even
	// those whose limiters live elsewhere.
	//
	// The order of a limiter's requests holds because rueidis (v1.0.79)
	// writes the commands one DoMulti sends down one connection as one run,
	// in the order given (pipe.DoMulti queues them as one entry of its ring,
	// which a single goroutine writes out). A standalone client sends the
	// whole batch down one connection (mux.pipelineMulti); a cluster client
	// groups the commands by the master of their slot, keeping their order
	// (clusterClient._pickMulti), and sends each group down one connection
	// to that master. Redis runs a connection's commands in order, and a
	// limiter's two keys share a slot. A command redirected by MOVED or ASK
	// (resharding) is sent again to the new owner after its limiter's
	// earlier commands have run on the old one.
	cmds := make(rueidis.Commands, 0, len(reqs))
	sent := make([]int, 0, len(reqs)) // cmds[j] decides reqs[sent[j]]
	for i, r := range reqs {
		if err := checkPermits(r.Name, r.Permits); err != nil {
			out[i] = limiter.Result{Err: err}
			continue
		}
		cmds = append(cmds, s.evalsha(r))
		sent = append(sent, i)
	}
	if len(cmds) == 0 {
		return
	}
	replies := s.client.DoMulti(ctx, cmds...)
	if again := rerunnable(reqs, sent, replies); len(again) > 0 {
		evals := make(rueidis.Commands, len(again))
		for k, j := range again {
			evals[k] = s.eval(reqs[sent[j]])
		}
		for k, reply := range s.client.DoMulti(ctx, evals...) {
			replies[again[k]] = reply
		}
	}
	for j, i := range sent {
		d, err := decision(reqs[i].Name, reqs[i].Permits, replies[j])
		out[i] = limiter.Result{Decision: d, Err: err}
	}
}

// evalsha is Acquire's script run by its digest, taking r.Permits from the
// limiter r.Name at the server's time.
func (s *Store) evalsha(r limiter.Request) rueidis.Completed {
	keys := s.keys(r.Name)
	return s.client.B().Evalsha().Sha1(acquireSHA1).Numkeys(int64(len(keys))).
		Key(keys...).Arg(acquireArgs(r.Permits, "")...).Build()
}

// eval is evalsha with the script's source, which the server runs and
// caches when it does not know the digest.
func (s *Store) eval(r limiter.Request) rueidis.Completed {
	keys := s.keys(r.Name)
	return s.client.B().Eval().Script(acquireSource).Numkeys(int64(len(keys))).
		Key(keys...).Arg(acquireArgs(r.Permits, "")...).Build()
}

// rerunnable returns, in increasing order, the indexes of the replies that
// are NOSCRIPT errors and may be sent again as EVAL: those followed by no
// other reply on the same limiter. If the script came back between two of
// a limiter's requests (another client's EVAL or SCRIPT LOAD), the first
// answered NOSCRIPT and the second ran: running the first now would decide
// it after the second. It keeps its error instead, which wraps
// ErrUnavailable as Acquire's errors from Redis do, and nothing was taken.
// Usually every request after the script went away answers NOSCRIPT, and
// all of them run again, in order.
func rerunnable(reqs []limiter.Request, sent []int, replies []rueidis.RedisResult) []int {
	if !slices.ContainsFunc(replies, isNoScript) {
		return nil
	}
	var again []int
	ran := make(map[string]bool) // limiters with a later request that may have run
	for j := len(replies) - 1; j >= 0; j-- {
		name := reqs[sent[j]].Name
		switch {
		case !isNoScript(replies[j]):
			ran[name] = true
		case !ran[name]:
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
