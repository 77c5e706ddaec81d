package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// grpcOpenLoad is an open-loop load of ShouldRateLimit calls: one call
// every 1/rate seconds, whether or not the earlier ones were answered, each
// timed from the instant it was due, so that a server that falls behind is
// charged for the wait of every call queued behind it (no coordinated
// omission).
type grpcOpenLoad struct {
	rate int // calls per second
}

func (g grpcOpenLoad) String() string {
	return fmt.Sprintf("this harness's own open-loop generator, %d calls per second over %d gRPC connections, each timed from the instant it was due", g.rate, grpcConns)
}

// run calls ShouldRateLimit at the load's rate with the requests next
// makes, through clients in turn, for d, and measures the servers' CPU
// around it. Any error, and any answer but OK, fails the run.
func (g grpcOpenLoad) run(clients []rlsv3.RateLimitServiceClient, next func(*rand.Rand) *rlsv3.RateLimitRequest, d time.Duration, servers ...*proc) (sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	n := int(d.Seconds() * float64(g.rate))
	interval := time.Second / time.Duration(g.rate)
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	r := rand.New(rand.NewPCG(7919, 1))
	measure := cpuOf(servers)
	self := selfCPU()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(due))
		req, client := next(r), clients[i%len(clients)]
		wg.Go(func() {
			resp, err := client.ShouldRateLimit(ctx, req)
			lat[i] = time.Since(due)
			switch {
			case err != nil:
				errs[i] = err
			case resp.OverallCode != rlsv3.RateLimitResponse_OK:
				errs[i] = fmt.Errorf("answered %v", resp)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	loadCPU := selfCPU() - self
	serverCPU, err := measure()
	if err != nil {
		return sample{}, err
	}
	failed := 0
	var first error
	for _, err := range errs {
		if err != nil {
			failed++
			first = cmpOr(first, err)
		}
	}
	if failed > 0 {
		return sample{}, fmt.Errorf("%d of %d calls failed; the first: %v", failed, n, first)
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[int(p/100*float64(len(lat)-1))].Nanoseconds()) / 1e3
	}
	return sample{
		requests: float64(n), rps: float64(n) / elapsed.Seconds(),
		p50: pct(50), p99: pct(99), p999: pct(99.9),
		serverCPU: perRequest(serverCPU, float64(n)), loadCPU: perRequest(loadCPU, float64(n)),
		rss: rssOf(servers),
	}, nil
}

// cmpOr returns the first of a and b that is not nil.
func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
