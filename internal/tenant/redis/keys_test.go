package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// crc16 is Redis Cluster's key hash (CRC-16/XMODEM).
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// TestShardTags: tag i hashes into the i-th sixteenth of the slots.
func TestShardTags(t *testing.T) {
	if got := crc16("123456789"); got != 0x31c3 {
		t.Fatalf("crc16 check value: got %#x, want 0x31c3", got)
	}
	for i, tag := range shardTags {
		if slot := int(crc16(tag)) % 16384; slot/1024 != i {
			t.Errorf("tag %q of shard %d: slot %d, want one in [%d, %d)", tag, i, slot, 1024*i, 1024*(i+1))
		}
	}
}

// TestShardOfSpreads: consecutive addresses, the usual pattern of a
// scanner, spread evenly.
func TestShardOfSpreads(t *testing.T) {
	var counts [numShards]int
	const n = 1 << 14
	for i := range n {
		counts[shardOf(0xff00_0000_0a00_0000|uint64(i))]++
	}
	for i, c := range counts {
		if c < n/numShards*3/4 || c > n/numShards*5/4 {
			t.Errorf("shard %d holds %d of %d consecutive IPv4 tenants, want about %d", i, c, n, n/numShards)
		}
	}
}

func TestKeys(t *testing.T) {
	ts, err := New(rueidisStub{}, "app:", tenant.Config{Policy: limiter.Policy{Limit: 100, Period: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	pid := policyID(ts.policy)
	key, _, _ := tenant.Key("192.0.2.1", 64)
	sh := ts.shards[shardOf(key)]
	for _, tc := range []struct{ got, want string }{
		{sh.Base + hexKey(key), "app:t:" + pid + "{" + shardTags[shardOf(key)] + "}:ff000000c0000201"},
		{sh.Idx, "app:t:" + pid + "{" + shardTags[shardOf(key)] + "}:idx"},
		{sh.Exp, "app:t:" + pid + "{" + shardTags[shardOf(key)] + "}:exp"},
		{hexKey(1), "0000000000000001"},
	} {
		if tc.got != tc.want {
			t.Errorf("key: got %q, want %q", tc.got, tc.want)
		}
	}
	if len(pid) != 12 || strings.ContainsAny(pid, "{}:") {
		t.Errorf("policy ID %q: want 12 hex digits", pid)
	}
	// Every field of the policy makes a policy ID of its own.
	base := limiter.Policy{Limit: 100, Period: time.Minute, Algorithm: limiter.GCRA, Burst: 100}
	ids := map[string]limiter.Policy{}
	for _, p := range []limiter.Policy{
		base,
		{Limit: 101, Period: time.Minute, Algorithm: limiter.GCRA, Burst: 100},
		{Limit: 100, Period: time.Minute + 1, Algorithm: limiter.GCRA, Burst: 100},
		{Limit: 100, Period: time.Minute, Algorithm: limiter.GCRA, Burst: 99},
		{Limit: 100, Period: time.Minute, Algorithm: limiter.SlidingLog},
	} {
		id := policyID(p)
		if q, dup := ids[id]; dup {
			t.Errorf("policies %+v and %+v share the ID %s", p, q, id)
		}
		ids[id] = p
	}
	if policyID(limiter.Policy{Limit: 100, Period: time.Minute}.Normalize()) != policyID(base) {
		t.Error("a policy and its normalized form have different IDs")
	}
}
