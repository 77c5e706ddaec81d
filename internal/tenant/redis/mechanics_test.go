package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

var algorithms = []limiter.Algorithm{limiter.GCRA, limiter.SlidingLog}

func policy(limit int64, period time.Duration, alg limiter.Algorithm) tenant.Config {
	return tenant.Config{Policy: limiter.Policy{Limit: limit, Period: period, Algorithm: alg}}
}

func us(now int64) string { return strconv.FormatInt(now, 10) }

// members sums the sizes of the shards' indexes and expiry indexes.
func members(t *testing.T, c rueidis.Client, ts *Tenants) (idx, exp int64) {
	t.Helper()
	ctx := context.Background()
	for i := range ts.shards {
		a, err1 := c.Do(ctx, c.B().Zcard().Key(ts.shards[i].Idx).Build()).AsInt64()
		b, err2 := c.Do(ctx, c.B().Zcard().Key(ts.shards[i].Exp).Build()).AsInt64()
		if err1 != nil || err2 != nil {
			t.Fatalf("ZCARD: %v, %v", err1, err2)
		}
		idx, exp = idx+a, exp+b
	}
	return idx, exp
}

func mustAcquire(t *testing.T, ts *Tenants, ip string, n, now int64) tenant.Decision {
	t.Helper()
	d, err := ts.acquire(context.Background(), ip, n, us(now))
	if err != nil || !d.Allowed {
		t.Fatalf("Acquire(%q, %d) at %dµs: got %+v, %v, want allowed", ip, n, now, d, err)
	}
	return d
}

func mustLowest(t *testing.T, ts *Tenants, k int, now int64) []tenant.Entry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	es, err := ts.lowest(ctx, k, us(now))
	if err != nil {
		t.Fatalf("Lowest(%d) at %dµs: %v", k, now, err)
	}
	return es
}

// testTrim: once tenants are full, the operations of their shards remove
// their index members, 16 at a time, and Lowest never lists them.
func testTrim(t *testing.T, c rueidis.Client) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			ts := newTenants(t, c, policy(2, time.Second, alg))
			t0 := int64(epochUS)
			const old = 300
			for i := range old {
				mustAcquire(t, ts, fmt.Sprintf("10.0.%d.%d", i/256, i%256), 1, t0)
			}
			wantMembers(t, c, ts, alg, old)
			// Two seconds later every old tenant is full. Three fresh
			// acquisitions per shard and one Lowest trim up to 64 expired
			// members per shard.
			t1 := t0 + 2_000_000
			if es := mustLowest(t, ts, tenant.MaxLowest, t1); len(es) != 0 {
				t.Fatalf("Lowest once every tenant is full: got %d tenants, want none", len(es))
			}
			var perShard [numShards]int
			fresh := 0
			for i := 0; fresh < 3*numShards; i++ {
				ip := fmt.Sprintf("10.1.%d.%d", i/256, i%256)
				key, _, _ := tenant.Key(ip, 64)
				if s := shardOf(key); perShard[s] < 3 {
					perShard[s]++
					fresh++
					mustAcquire(t, ts, ip, 2, t1)
				}
			}
			wantMembers(t, c, ts, alg, fresh)
			es := mustLowest(t, ts, tenant.MaxLowest, t1)
			if len(es) != fresh || es[0].Remaining != 0 || es[len(es)-1].Remaining != 0 {
				t.Errorf("Lowest: got %d tenants (%+v...), want the %d fresh ones with nothing left", len(es), es[0], fresh)
			}
		})
	}
}

func wantMembers(t *testing.T, c rueidis.Client, ts *Tenants, alg limiter.Algorithm, want int) {
	t.Helper()
	idx, exp := members(t, c, ts)
	wantExp := int64(want)
	if alg == limiter.GCRA {
		wantExp = 0
	}
	if idx != int64(want) || exp != wantExp {
		t.Errorf("index members: got %d, expiry members %d, want %d and %d", idx, exp, want, wantExp)
	}
}

// testStaleMembers: a state lost while its index member stays (evicted
// under memory pressure) forgives the tenant; Lowest neither lists the
// stale member nor lists the tenant twice once it acquires again, and drops
// the stale member.
func testStaleMembers(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	const ip = "192.0.2.33"
	key, _, _ := tenant.Key(ip, 64)
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			ts := newTenants(t, c, policy(10, time.Hour, alg))
			state := ts.shards[shardOf(key)].Base + hexKey(key)
			lose := func() {
				t.Helper()
				if err := c.Do(ctx, c.B().Del().Key(state).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			t0 := int64(epochUS)
			mustAcquire(t, ts, ip, 3, t0)
			lose()
			mustAcquire(t, ts, ip, 1, t0+10)
			es := mustLowest(t, ts, 10, t0+20)
			if len(es) != 1 || es[0].Tenant != ip || es[0].Remaining != 9 {
				t.Errorf("Lowest after the state was lost and taken from again: got %+v, want %s once with 9 left", es, ip)
			}
			wantMembers(t, c, ts, alg, 1)
			lose()
			if es := mustLowest(t, ts, 10, t0+30); len(es) != 0 {
				t.Errorf("Lowest after the state was lost: got %+v, want none", es)
			}
			wantMembers(t, c, ts, alg, 0)
		})
	}
}

// testNoScript empties the server's script cache before each call: every
// script still runs, through EVAL, and is cached again.
func testNoScript(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	flushScripts := func() {
		t.Helper()
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
	}
	for _, alg := range algorithms {
		ts := newTenants(t, c, policy(3, time.Hour, alg))
		flushScripts()
		if d, err := ts.Acquire(ctx, "192.0.2.1", 2); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("%s: Acquire after SCRIPT FLUSH: got %+v, %v, want allowed with 1 remaining", alg, d, err)
		}
		flushScripts()
		if a, err := ts.Available(ctx, "192.0.2.1"); err != nil || a.Remaining != 1 {
			t.Fatalf("%s: Available after SCRIPT FLUSH: got %+v, %v, want 1 remaining", alg, a, err)
		}
		flushScripts()
		if es, err := ts.Lowest(ctx, 5); err != nil || len(es) != 1 || es[0].Remaining != 1 {
			t.Fatalf("%s: Lowest after SCRIPT FLUSH: got %+v, %v, want the tenant with 1 remaining", alg, es, err)
		}
	}
}

// testExpiry: at the server's own time, a tenant's state and its shard's
// indexes live as long as some bucket is not full, and no longer.
func testExpiry(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	// Long enough that the keys are still there when the test reads their
	// TTLs on a loaded machine, short enough to watch them go.
	const period = 300 * time.Millisecond
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			ts := newTenants(t, c, policy(5, period, alg))
			pattern := ts.shards[0].Base[:strings.IndexByte(ts.shards[0].Base, '{')] + "*"
			var last tenant.Decision
			var ip string
			for i := range 40 {
				ip = fmt.Sprintf("198.18.0.%d", i)
				d, err := ts.Acquire(ctx, ip, 1+int64(i%5))
				if err != nil || !d.Allowed {
					t.Fatalf("Acquire(%q): got %+v, %v", ip, d, err)
				}
				last = d
			}
			key, _, _ := tenant.Key(ip, 64)
			sh := ts.shards[shardOf(key)]
			pttl := func(k string) time.Duration {
				ms, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				return time.Duration(ms) * time.Millisecond
			}
			// The expiry is an instant rounded up to a millisecond.
			if ttl := pttl(sh.Base + hexKey(key)); ttl <= 0 || ttl > last.ResetAfter+time.Millisecond {
				t.Errorf("state TTL %s, want within ResetAfter %s", ttl, last.ResetAfter)
			}
			if ttl := pttl(sh.Idx); ttl <= 0 || ttl > period+time.Millisecond {
				t.Errorf("index TTL %s, want within the period %s", ttl, period)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				keys := scan(t, c, pattern)
				if len(keys) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("keys still there 5s after every bucket was full again: %v", keys)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if a, err := ts.Available(ctx, ip); err != nil || a.Remaining != 5 {
				t.Errorf("Available after expiry: got %+v, %v, want 5", a, err)
			}
			if es, err := ts.Lowest(ctx, 10); err != nil || len(es) != 0 {
				t.Errorf("Lowest after expiry: got %+v, %v, want none", es, err)
			}
		})
	}
}

// scan lists the keys matching pattern on a standalone server.
func scan(t *testing.T, c rueidis.Client, pattern string) []string {
	t.Helper()
	var keys []string
	var cursor uint64
	for {
		e, err := c.Do(context.Background(), c.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatalf("SCAN: %v", err)
		}
		keys = append(keys, e.Elements...)
		if cursor = e.Cursor; cursor == 0 {
			return keys
		}
	}
}
