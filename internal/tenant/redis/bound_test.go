package redis

import (
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

func TestTenantBytes(t *testing.T) {
	tests := []struct {
		alg   limiter.Algorithm
		limit int64
		want  int64
	}{
		{limiter.GCRA, 1, 384},
		{limiter.GCRA, limiter.MaxLimit, 384},
		{limiter.SlidingLog, 1, 512 + 16*2},
		{limiter.SlidingLog, 100, 512 + 16*101},
		{limiter.SlidingLog, 127, 512 + 16*128}, // the largest listpack
		{limiter.SlidingLog, 128, 512 + 160*129},
		{limiter.SlidingLog, limiter.MaxLimit, 512 + 160*4097}, // older grants merge
	}
	for _, tt := range tests {
		p := limiter.Policy{Limit: tt.limit, Period: time.Hour, Algorithm: tt.alg}
		if got := TenantBytes(p); got != tt.want {
			t.Errorf("TenantBytes(%s, limit %d): got %d, want %d", tt.alg, tt.limit, got, tt.want)
		}
	}
}

func TestShardMax(t *testing.T) {
	for _, tt := range []struct{ bound, want int }{{1, 1}, {16, 1}, {17, 2}, {699_050, 43_691}} {
		if got := shardMax(tt.bound); got != tt.want {
			t.Errorf("shardMax(%d): got %d, want %d", tt.bound, got, tt.want)
		}
	}
}
