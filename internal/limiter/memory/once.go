package memory

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// onceTable remembers the decisions made with an idempotency key for
// limiter.OnceTTL, at most limiter.MaxOnce of them. Keys are spread over
// shards by a keyed hash; a decision with a key holds its shard's lock
// while it looks the key up, decides and records it, so that two calls
// with one key never both decide. Since every record lives the same TTL,
// each shard expires its records in the order it made them, from a queue.
type onceTable struct {
	seed   maphash.Seed
	count  atomic.Int64
	shards [onceShards]onceShard
}

const onceShards = 64

type onceShard struct {
	mu    sync.Mutex
	m     map[string]onceRecord
	queue []onceQueued // in order of expiry
	_     [40]byte     // keeps neighbouring shards' locks off one cache line
}

type onceRecord struct {
	fingerprint string
	v           limiter.Verdict
	expires     int64
}

type onceQueued struct {
	key     string
	expires int64
}

func newOnceTable() *onceTable {
	t := &onceTable{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].m = make(map[string]onceRecord)
	}
	return t
}

// do answers the decision fingerprint under key at now: the recorded
// answer when there is one (an error for another fingerprint), otherwise
// what decide answers, recorded when it succeeds.
func (t *onceTable) do(key, fingerprint string, now int64, decide func() (limiter.Verdict, error)) (limiter.Verdict, error) {
	if t.count.Load() >= limiter.MaxOnce {
		// Records expire shard by shard, as their shards are used: at the
		// bound, forget the expired ones of every shard first.
		for i := range t.shards {
			o := &t.shards[i]
			o.mu.Lock()
			o.expire(t, now)
			o.mu.Unlock()
		}
	}
	s := &t.shards[maphash.String(t.seed, key)%onceShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(t, now)
	if r, ok := s.m[key]; ok {
		if r.fingerprint != fingerprint {
			return limiter.Verdict{}, limiter.ErrOnceMismatch
		}
		v := r.v
		v.Checks = append([]limiter.Check(nil), v.Checks...)
		v.Replayed = true
		return v, nil
	}
	if t.count.Load() >= limiter.MaxOnce {
		return limiter.Verdict{}, limiter.ErrTooManyOnce
	}
	v, err := decide()
	if err != nil {
		return v, err
	}
	exp := now + int64(limiter.OnceTTL)
	s.m[key] = onceRecord{fingerprint: fingerprint, v: v, expires: exp}
	s.queue = append(s.queue, onceQueued{key, exp})
	t.count.Add(1)
	return v, nil
}

// expire forgets the records whose time is up.
func (s *onceShard) expire(t *onceTable, now int64) {
	n := 0
	for n < len(s.queue) && s.queue[n].expires <= now {
		delete(s.m, s.queue[n].key)
		n++
	}
	if n == 0 {
		return
	}
	t.count.Add(-int64(n))
	s.queue = append(s.queue[:0:0], s.queue[n:]...)
	if len(s.m) == 0 {
		s.m = make(map[string]onceRecord) // give back what a burst grew
	}
}
