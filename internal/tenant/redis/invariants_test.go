package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// checkIndex reads every state and index of ts on a standalone server and
// checks, at now (µs), what Lowest relies on: each tenant whose bucket is
// not full has exactly one index member that has not expired, named after
// its state (GCRA: its whole TAT; sliding log: its newest grant), and under
// the sliding log that member's bound is at least what the log holds and
// its expiry member says when the log empties. Index members of full
// tenants may linger until trimmed, but never look unexpired.
func checkIndex(t *testing.T, c rueidis.Client, ts *Tenants, now int64) {
	t.Helper()
	ctx := context.Background()
	gcra := ts.policy.Algorithm == limiter.GCRA
	pu := (int64(ts.policy.Period) + 999) / 1000
	for i := range ts.shards {
		sh := &ts.shards[i]
		scores := func(key string) map[string]int64 {
			t.Helper()
			zs, err := c.Do(ctx, c.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
			if err != nil {
				t.Fatalf("ZRANGE %s: %v", key, err)
			}
			m := make(map[string]int64, len(zs))
			for _, z := range zs {
				m[z.Member] = int64(z.Score)
			}
			return m
		}
		idx, exp := scores(sh.Idx), scores(sh.Exp)
		live := map[string]bool{} // members of tenants whose bucket is not full
		for _, key := range scan(t, c, sh.Base+"*") {
			h := strings.TrimPrefix(key, sh.Base)
			if h == "idx" || h == "exp" {
				continue
			}
			k, err := strconv.ParseUint(h, 16, 64)
			if err != nil {
				t.Fatalf("state key %s: %v", key, err)
			}
			av, err := ts.available(ctx, tenant.KeyName(k, ts.bits), us(now))
			if err != nil {
				t.Fatal(err)
			}
			if av.ResetAfter == 0 || av.RegistryFull {
				continue // full (forgotten, and perhaps with no room back): no member needed
			}
			var member string
			if gcra {
				st, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
				if err != nil {
					t.Fatal(err)
				}
				var tatUS, r int64
				if _, err := fmt.Sscanf(st, "%d %d", &tatUS, &r); err != nil {
					t.Fatalf("state %s = %q: %v", key, st, err)
				}
				member = fmt.Sprintf("%012d%s", 999_999_999_999-r, h)
				if score, ok := idx[member]; !ok || score != -tatUS {
					t.Fatalf("now %dµs: tenant %s (TAT %q) has index member %q with score %d (present %v), want %d", now, h, st, member, score, ok, -tatUS)
				}
			} else {
				newest, err := c.Do(ctx, c.B().Zrange().Key(key).Min("-1").Max("-1").Build()).AsStrSlice()
				if err != nil || len(newest) != 1 {
					t.Fatalf("newest grant of %s: %v, %v", key, newest, err)
				}
				at, _ := strconv.ParseInt(newest[0], 10, 64)
				member = fmt.Sprintf("%016d%s", int64(1)<<53-at, h)
				used := av.Limit - av.Remaining
				if bound, ok := idx[member]; !ok || -bound < used {
					t.Fatalf("now %dµs: tenant %s holds %d permits, its index member %q has bound %d (present %v)", now, h, used, member, -bound, ok)
				}
				if e, ok := exp[member]; !ok || e != at+pu {
					t.Fatalf("now %dµs: tenant %s: expiry member %q scored %d (present %v), want %d", now, h, member, e, ok, at+pu)
				}
			}
			live[member] = true
		}
		for m, score := range idx {
			unexpired := -score > now || -score == now && !strings.HasPrefix(m, "999999999999")
			if !gcra {
				at := int64(1)<<53 - mustAtoi(t, m[:16])
				unexpired = at+pu > now
			}
			if unexpired && !live[m] {
				t.Fatalf("now %dµs: shard %d: unexpired index member %q (score %d) names no tenant that holds permits", now, i, m, score)
			}
		}
	}
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
