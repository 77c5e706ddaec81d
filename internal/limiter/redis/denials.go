package redis

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The denial cache answers, without asking Redis, a decision that Redis
// would deny. Each reply to a Take or a Peek says of every limiter (or key)
// it decided how long until one permit more than it had left would fit if
// nobody took any (decide.lua's next). Taking only makes that later, and so
// does time run on Redis no faster than here: a request for more than
// what was left, made before that long has passed here since the request
// that learnt it was sent, would be denied by Redis too. Measuring from
// before the send, not from the reply, is what makes it exact: Redis
// decided at some instant after the send, so its clock now reads at most
// that instant plus the time passed here.
//
// What can make a key hold more than that bound: a refund, a new policy or
// a deleted limiter. Those made through this Store forget what they touch,
// and answers to requests sent before they returned are not learnt. Those
// made through another replica are not seen here until the entry ends:
// an entry proves nothing after maxDenialAge. A key of a keyed limiter is
// learnt only when it had no permit left, since one with permits left may
// be evicted by other keys and start full (see limiter.Definition.MaxKeys).
//
// A hot key whose entry no longer proves a denial sends one decision to
// Redis at a time from this Store (see flight): the others wait for its
// answer, which is most often a new proof. Keys with permits left never
// wait for one another.

// maxDenialAge is how long an entry is used after the request that taught
// it was sent: the longest that a change made through another replica (a
// refund, a policy, a deletion) goes unseen here.
const maxDenialAge = time.Second

// denialSlack covers what the bound does not measure: Redis resolves
// microseconds, so its decision instant may lie up to 1µs before the
// instant it decided at, and the scripts round waits up to whole
// nanoseconds.
const denialSlack = 2 * time.Microsecond

// denials is a Store's denial cache. It is safe for concurrent use.
type denials struct {
	max int
	now func() time.Time // with a monotonic reading; time.Now but in tests

	mu     sync.Mutex
	byName map[string]map[string]*denial // limiter name, then key ("" for a plain limiter)
	size   int
	gen    uint64 // counts forgets: an answer to a request sent before one is not learnt
	swept  time.Time

	local atomic.Uint64 // decisions answered here
}

// denial is what the cache knows of one limiter or key.
type denial struct {
	sent time.Time // when the request that taught it was sent
	// n is the fewest permits the entry proves denied, while less than
	// wait has passed since sent; 0 when it proves nothing.
	n    int64
	wait time.Duration
	// check is what the reply said of the limiter or key, for a verdict
	// made here.
	check limiter.Check
	// flight is closed when the decision in flight that may teach the
	// entry returns; nil when there is none.
	flight chan struct{}
}

func newDenials(max int, now func() time.Time) *denials {
	return &denials{max: max, now: now, byName: make(map[string]map[string]*denial)}
}

// elapsed is how long has passed on Redis, at most, since e was sent,
// allowing its clock a rate a thousandth faster than this one's.
func (e *denial) elapsed(now time.Time) time.Duration {
	d := now.Sub(e.sent)
	return d + d>>10 + denialSlack
}

// proves reports whether e proves that a request for permits is denied at
// now.
func (e *denial) proves(permits int64, now time.Time) bool {
	return e.n > 0 && permits >= e.n && e.elapsed(now) < e.wait
}

// decide answers a decision on parts, the limiters and keys of items, from
// the cache when one of them proves it denied: v is then the verdict.
// Otherwise, when a limited key of it has a decision in flight, wait is
// closed once that returns, to look again; otherwise the caller asks Redis
// and calls done with the outcome, which ends the flights it started.
func (d *denials) decide(items, parts []limiter.Item, index []int) (v *limiter.Verdict, wait <-chan struct{}, done func(error), gen uint64) {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	entries := make([]*denial, len(parts))
	complete, denied := true, false
	for j, p := range parts {
		e := d.byName[p.Name][p.Key]
		if e != nil && now.Sub(e.sent) >= maxDenialAge && e.flight == nil {
			d.drop(p.Name, p.Key)
			e = nil
		}
		entries[j] = e
		complete = complete && e != nil
		denied = denied || e != nil && e.proves(p.Permits, now)
	}
	if denied && complete {
		d.local.Add(1)
		found := make([]limiter.Check, len(parts))
		for j, p := range parts {
			e := entries[j]
			c := limiter.Check{Fits: true, Remaining: e.check.Remaining, Limit: e.check.Limit}
			age := now.Sub(e.sent)
			c.ResetAfter = max(0, e.check.ResetAfter-age)
			if e.proves(p.Permits, now) {
				c.Fits = false
				c.RetryAfter = max(time.Nanosecond, e.wait-age)
			}
			found[j] = c
		}
		verdict := limiter.NewVerdict(items, found, index)
		verdict.Local = true
		return &verdict, nil, nil, 0
	}
	for _, e := range entries {
		if e != nil && e.n == 1 && e.flight != nil {
			return nil, e.flight, nil, 0
		}
	}
	var mine []*denial
	for _, e := range entries {
		if e != nil && e.n == 1 {
			e.flight = make(chan struct{})
			mine = append(mine, e)
		}
	}
	gen = d.gen
	return nil, nil, func(err error) {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, e := range mine {
			close(e.flight)
			e.flight = nil
		}
		if err != nil {
			// Let whoever waited go at once rather than one at a time: a
			// failing Redis would otherwise hold each of them a timeout
			// longer than the one before.
			for _, p := range parts {
				if slices.Contains(mine, d.byName[p.Name][p.Key]) {
					d.drop(p.Name, p.Key)
				}
			}
		}
	}, gen
}

// learn records what a reply said of parts: found[j] of parts[j], and
// next[j], how long until one permit more than found[j].Remaining fits, or
// a negative duration when the reply does not say. sent is when the
// request was sent and gen the cache's generation then.
func (d *denials) learn(parts []limiter.Item, found []limiter.Check, next []time.Duration, sent time.Time, gen uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if gen != d.gen {
		return
	}
	for j, p := range parts {
		c := found[j]
		var n int64
		var wait time.Duration
		keyed := p.Key != ""
		switch {
		case c.KeysFull:
		case next[j] >= 0 && (!keyed || c.Remaining == 0):
			n, wait = c.Remaining+1, next[j]
		case !c.Fits && !c.ExceedsCapacity && !keyed:
			n, wait = p.Permits, c.RetryAfter
		}
		e := d.byName[p.Name][p.Key]
		if e == nil {
			if d.size >= d.max && !d.sweep() {
				continue // the entry is not learnt: nothing is lost but a round trip
			}
			e = &denial{}
			keys := d.byName[p.Name]
			if keys == nil {
				keys = make(map[string]*denial)
				d.byName[p.Name] = keys
			}
			keys[p.Key] = e
			d.size++
		} else if sent.Before(e.sent) {
			continue // a later request taught it already
		}
		e.sent, e.n, e.wait, e.check = sent, n, wait, c
	}
}

// forget drops what the cache knows of parts, and of every limiter in
// names, after a change that may have given them permits back; answers to
// requests sent before it are not learnt.
func (d *denials) forget(parts []limiter.Item, names ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	for _, p := range parts {
		d.drop(p.Name, p.Key)
	}
	for _, name := range names {
		for key := range d.byName[name] {
			d.drop(name, key)
		}
	}
}

// drop removes one entry; a decision in flight for it ends as if it had
// none.
func (d *denials) drop(name, key string) {
	keys := d.byName[name]
	e := keys[key]
	if e == nil {
		return
	}
	delete(keys, key)
	if len(keys) == 0 {
		delete(d.byName, name)
	}
	d.size--
}

// sweepEvery is the least time between two sweeps of a full cache: a
// sweep reads every entry, and a cache full of entries that still prove
// something would otherwise be swept at every reply.
const sweepEvery = 10 * time.Millisecond

// sweep drops every entry that proves nothing any more and has no
// decision in flight, at most once every sweepEvery, and reports whether
// there is room.
func (d *denials) sweep() bool {
	now := d.now()
	if now.Sub(d.swept) < sweepEvery {
		return false
	}
	d.swept = now
	for name, keys := range d.byName {
		for key, e := range keys {
			if e.flight == nil && (now.Sub(e.sent) >= maxDenialAge || e.n == 0 || e.elapsed(now) >= e.wait) {
				d.drop(name, key)
			}
		}
	}
	return d.size < d.max
}

// CacheDenials makes the Store answer, without asking Redis, the Takes and
// Peeks of Decide that Redis would deny, from what its replies to earlier
// ones prove (see denials.go), remembering at most size limiters and keys;
// 0 turns it off. Call it before the Store is used. Such a verdict has
// Local set.
//
// It is exact as long as permits are refunded, limiters replaced and
// limiters deleted through this Store: those made through another Store
// reach this one's denials within one second.
func (s *Store) CacheDenials(size int) {
	if size <= 0 {
		s.denials = nil
		return
	}
	s.denials = newDenials(size, time.Now)
}

// LocalDenials counts the decisions the Store's denial cache has answered.
func (s *Store) LocalDenials() uint64 {
	if s.denials == nil {
		return 0
	}
	return s.denials.local.Load()
}

// decideCached is Decide under Take or Peek with the denial cache, at
// nowMicros (see acquire).
func (s *Store) decideCached(ctx context.Context, items []limiter.Item, c call, nowMicros string) (limiter.Verdict, error) {
	parts, index := limiter.Parts(items)
	for {
		v, wait, done, gen := s.denials.decide(items, parts, index)
		if v != nil {
			return *v, nil
		}
		if wait != nil {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return limiter.Verdict{}, unavailable("decide", parts[0].Name, ctx.Err())
			}
		}
		c.gen = gen
		verdict, err := s.decideAt(ctx, items, c, nowMicros)
		done(err)
		return verdict, err
	}
}
