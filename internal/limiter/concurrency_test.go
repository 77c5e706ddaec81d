package limiter_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Many goroutines hammering one limiter at one instant must be granted
// exactly its capacity: never more (over-admission), never less.
func TestConcurrentAcquireGrantsExactlyTheCapacity(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			const limit = 1000
			l := mustNew(t, limiter.Policy{Limit: limit, Period: time.Hour, Algorithm: alg})
			var granted atomic.Int64
			var wg sync.WaitGroup
			for g := range 32 {
				wg.Go(func() {
					for i := range 200 {
						n := int64(1 + (g+i)%3)
						d, err := l.Acquire(limiter.Nanos(t0), n)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							granted.Add(n)
						}
					}
				})
			}
			wg.Wait()
			// 32×200 requests of 1–3 permits ask far more than the limit; the
			// last grants may leave up to 2 permits that no 3-permit request fits.
			got := granted.Load()
			if got > limit || got < limit-2 {
				t.Errorf("granted %d permits, want %d (at most 2 short)", got, limit)
			}
			if rem := l.Available(limiter.Nanos(t0)).Remaining; got+rem != limit {
				t.Errorf("granted %d + remaining %d, want %d", got, rem, limit)
			}
		})
	}
}

// Past MaxLogEntries acquisitions in a window the log merges its oldest
// entries; that may deny early but must never grant more than the limit in
// any window.
func TestSlidingLogBoundedNeverOverAdmits(t *testing.T) {
	const limit = 3 * limiter.MaxLogEntries
	p := limiter.Policy{Limit: limit, Period: time.Second, Algorithm: limiter.SlidingLog}
	l := mustNew(t, p)
	var grants []grant
	now := t0.UnixNano()
	step := int64(time.Second) / (2 * limiter.MaxLogEntries)
	for i := range 4 * limiter.MaxLogEntries {
		if d := acquire(t, l, time.Unix(0, now), 1); d.Allowed {
			grants = append(grants, grant{now, 1})
		}
		now += step
		if i%limiter.MaxLogEntries == 0 {
			now += int64(time.Second) / 3
		}
	}
	if len(grants) == 0 {
		t.Fatal("nothing granted")
	}
	checkContract(t, p.Normalize(), grants)
}
