package redisconn

import (
	"testing"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/config"
)

// rueidis opens 2^PipelineMultiplex connections per node; 0 is its default,
// chosen by GOMAXPROCS for a standalone server, and a negative value one
// connection.
func TestOptionsPipelineMultiplex(t *testing.T) {
	tests := []struct {
		name string
		n    int
		want int
	}{
		{name: "default", n: 0, want: 0},
		{name: "one", n: 1, want: -1},
		{name: "two", n: 2, want: 1},
		{name: "four", n: 4, want: 2},
		{name: "eight", n: 8, want: 3},
		{name: "sixteen", n: 16, want: 4},
		{name: "thirty-two", n: 32, want: 5},
		{name: "sixty-four", n: 64, want: 6},
		{name: "one hundred twenty-eight", n: 128, want: 7},
		{name: "most", n: config.MaxConnsPerNode, want: rueidis.MaxPipelineMultiplex},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := Options(config.Redis{Addrs: []string{"redis:6379"}, ConnsPerNode: tt.n})
			if err != nil {
				t.Fatalf("Options: %v", err)
			}
			if opts.PipelineMultiplex != tt.want {
				t.Errorf("ConnsPerNode %d: got PipelineMultiplex %d, want %d", tt.n, opts.PipelineMultiplex, tt.want)
			}
		})
	}
}
