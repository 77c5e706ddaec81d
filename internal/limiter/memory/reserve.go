package memory

import (
	"context"
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// reservations holds the reservations made and not yet settled, at most
// limiter.MaxReservations of them, spread over shards by a keyed hash of
// their IDs. Settling one holds its shard's lock from finding it to
// forgetting it, so that it is settled once.
type reservations struct {
	seed   maphash.Seed
	count  atomic.Int64 // held, plus reservations being made
	shards [onceShards]reservationShard
}

type reservationShard struct {
	mu sync.Mutex
	m  map[string]reservation
	_  [48]byte // keeps neighbouring shards' locks off one cache line
}

// reservation is what was reserved from each limiter (and key), by
// limiter.Parts, what each bucket holds of it (see limiter.Held), and the
// generation of each limiter's definition then (see entry): a part whose
// limiter has been replaced since is not settled, since what it reserved
// went with the definition it was made on.
type reservation struct {
	parts   []limiter.Item
	holds   []limiter.Held
	gens    []uint64
	expires int64
}

func newReservations() *reservations {
	r := &reservations{seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i].m = make(map[string]reservation)
	}
	return r
}

func (r *reservations) shard(id string) *reservationShard {
	return &r.shards[maphash.String(r.seed, id)%onceShards]
}

// claim makes room for one more reservation, forgetting those past their
// TTL first when the table is full, or reports that there is none.
func (r *reservations) claim(now int64) bool {
	swept := false
	for {
		c := r.count.Load()
		if c >= limiter.MaxReservations {
			if swept {
				return false
			}
			r.expire(now)
			swept = true
			continue
		}
		if r.count.CompareAndSwap(c, c+1) {
			return true
		}
	}
}

// expire forgets every reservation past its TTL, shard by shard.
func (r *reservations) expire(now int64) {
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		for id, x := range s.m {
			if x.expires <= now {
				delete(s.m, id)
				r.count.Add(-1)
			}
		}
		s.mu.Unlock()
	}
}

// Reserve takes items as Decide does under Take and, when they fit, holds
// them as a reservation for ttl. A reservation beyond
// limiter.MaxReservations is refused with an error wrapping
// limiter.ErrTooManyReservations, and nothing is taken.
func (s *Store) Reserve(_ context.Context, items []limiter.Item, ttl time.Duration, once string) (limiter.Verdict, error) {
	j, err := s.joint(items)
	if err != nil {
		return limiter.Verdict{}, err
	}
	reserve := func() (limiter.Verdict, error) {
		now := s.clock.Now()
		if !s.rsv.claim(now) {
			return limiter.Verdict{}, limiter.ErrTooManyReservations
		}
		var found []limiter.Check
		if j.keyed {
			found = j.decideKeys(s.clock, limiter.Take, nil, nil)
		} else {
			found = limiter.DecideAll(now, j.ls, j.totals, limiter.Take)
		}
		v := limiter.NewVerdict(items, found, j.index)
		if !v.Allowed {
			s.rsv.count.Add(-1)
			return v, nil
		}
		v.Reservation = limiter.NewReservationID(j.scope)
		parts, _ := limiter.Parts(items)
		holds := make([]limiter.Held, len(found))
		for k, c := range found {
			holds[k] = c.Held()
		}
		sh := s.rsv.shard(v.Reservation)
		sh.mu.Lock()
		sh.m[v.Reservation] = reservation{parts: parts, holds: holds, gens: j.gens, expires: now + int64(ttl)}
		sh.mu.Unlock()
		return v, nil
	}
	if once == "" {
		return reserve()
	}
	return s.once.do(j.scope+"\x00"+once, reserveFingerprint(items, ttl), s.clock.Now(), reserve)
}

// reserveFingerprint is what an idempotency key remembers of a Reserve:
// unlike any Decide's.
func reserveFingerprint(items []limiter.Item, ttl time.Duration) string {
	return "reserve " + strconv.FormatInt(int64(ttl), 10) + " " + limiter.Fingerprint(items, limiter.Take)
}

// Settle settles or cancels the reservation id; see limiter.Store.
func (s *Store) Settle(_ context.Context, id string, actual []limiter.Item, once string) (limiter.Verdict, error) {
	scope, _, err := limiter.ParseReservationID(id)
	if err != nil {
		return limiter.Verdict{}, err
	}
	if err := limiter.CheckSettlementScope(scope, id, actual); err != nil {
		return limiter.Verdict{}, err
	}
	settle := func() (limiter.Verdict, error) {
		now := s.clock.Now()
		sh := s.rsv.shard(id)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		x, ok := sh.m[id]
		if !ok || x.expires <= now {
			if ok {
				delete(sh.m, id)
				s.rsv.count.Add(-1)
			}
			return limiter.Verdict{}, limiter.ErrReservationNotFound
		}
		items := actual
		if items == nil {
			items = make([]limiter.Item, len(x.parts))
			for k, p := range x.parts {
				items[k] = limiter.Item{Name: p.Name, Key: p.Key}
			}
		}
		parts, _ := limiter.Parts(items)
		held := make([]int, len(parts))
		for k, p := range parts {
			held[k] = slices.IndexFunc(x.parts, func(held limiter.Item) bool { return held.Name == p.Name && held.Key == p.Key })
			if held[k] < 0 {
				return limiter.Verdict{}, limiter.InvalidSettlement(id, p)
			}
		}
		j, err := s.joint(items)
		if err != nil {
			return limiter.Verdict{}, err
		}
		deltas, holds := make([]int64, len(parts)), make([]limiter.Held, len(parts))
		for k, p := range parts {
			if r := held[k]; j.gens[k] == x.gens[r] {
				deltas[k], holds[k] = p.Permits-x.parts[r].Permits, x.holds[r]
			} // else the limiter was replaced: it is reported as it stands
		}
		var found []limiter.Check
		if j.keyed {
			found = j.decideKeys(s.clock, limiter.Charge, deltas, holds)
			for _, c := range found {
				if c.KeysFull {
					// The charge found no room for its key: nothing
					// was settled, and the reservation stays.
					return limiter.NewVerdict(items, found, j.index), nil
				}
			}
		} else {
			found = limiter.AdjustAll(now, j.ls, deltas, holds)
		}
		delete(sh.m, id)
		s.rsv.count.Add(-1)
		return limiter.NewVerdict(items, found, j.index), nil
	}
	if once == "" {
		return settle()
	}
	return s.once.do(scope+"\x00"+once, settleFingerprint(id, actual), s.clock.Now(), settle)
}

// settleFingerprint is what an idempotency key remembers of a Settle.
func settleFingerprint(id string, actual []limiter.Item) string {
	if actual == nil {
		return "cancel " + id
	}
	return "settle " + id + " " + limiter.Fingerprint(actual, limiter.Take)
}
