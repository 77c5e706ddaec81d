package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
)

// redisClient is one way of sending the acquire script.
type redisClient struct {
	name  string
	exec  func(ctx context.Context) error
	close func()
}

// clientRun is what one client did in one round.
type clientRun struct {
	ops                float64 // per second
	clientCPU, servCPU float64 // µs per operation
}

// redisClients compares the two maintained Go Redis clients sending the
// service's acquire script from many goroutines, as the service's handlers
// do: rueidis, which pipelines concurrent commands onto one connection by
// itself, and go-redis, which gives each command a pooled connection.
func redisClients(cfg config, rig *redisRig, rep *report) error {
	script, keys, args := limiterredis.AcquireCall(keyPrefix, benchLimiter, 1)

	ru, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{rig.redis.addr}, DisableCache: true})
	if err != nil {
		return err
	}
	ruScript := rueidis.NewLuaScript(script)
	gr := goredis.NewClient(&goredis.Options{Addr: rig.redis.addr})
	grScript := goredis.NewScript(script)
	grArgs := make([]any, len(args))
	for i, a := range args {
		grArgs[i] = a
	}
	clients := []redisClient{
		{"rueidis v1 (auto-pipelining, the service's client)", func(ctx context.Context) error {
			return ruScript.Exec(ctx, ru, keys, args).Error()
		}, ru.Close},
		{"go-redis v9 (connection pool, defaults)", func(ctx context.Context) error {
			return grScript.Run(ctx, gr, keys, grArgs...).Err()
		}, func() { gr.Close() }},
	}
	defer func() {
		for _, c := range clients {
			c.close()
		}
	}()

	sec := rep.section("Redis client: rueidis against go-redis")
	sec.printf("Both clients send the service's acquire script (EVALSHA) to the same Redis from G goroutines in this process, each sending its next command when the last is answered, for %s per round; %d interleaved rounds; median (min–max). CPU is this process's (the client's) and Redis's, per operation.\n\n",
		cfg.duration, cfg.rounds)
	sec.printf("| goroutines | client | operations/s | client CPU µs/op | Redis CPU µs/op |\n|---|---|---|---|---|\n")
	for _, g := range []int{1, 64} {
		runs := make([][]clientRun, len(clients))
		for _, c := range clients { // warm up: connections, script loaded
			if _, err := driveClient(c, g, time.Second, rig.redis); err != nil {
				return err
			}
		}
		var speedup []float64
		for round := range cfg.rounds {
			for i, c := range clients {
				r, err := driveClient(c, g, cfg.duration, rig.redis)
				if err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
				runs[i] = append(runs[i], r)
				cfg.progress("round %d  %-56s G=%-3d %9.0f/s  client %5.1f µs/op  Redis %5.1f µs/op", round+1, c.name, g, r.ops, r.clientCPU, r.servCPU)
			}
			speedup = append(speedup, runs[0][round].ops/runs[1][round].ops)
		}
		for i, c := range clients {
			col := func(f func(clientRun) float64, format string) string {
				xs := make([]float64, len(runs[i]))
				for j, r := range runs[i] {
					xs[j] = f(r)
				}
				return stat(xs, format)
			}
			sec.printf("| %d | %s | %s | %s | %s |\n", g, c.name,
				col(func(r clientRun) float64 { return r.ops }, "%.0f"),
				col(func(r clientRun) float64 { return r.clientCPU }, "%.1f"),
				col(func(r clientRun) float64 { return r.servCPU }, "%.1f"))
		}
		rep.facts = append(rep.facts, fmt.Sprintf("Redis clients, rueidis ÷ go-redis operations/s with %d concurrent callers: %s", g, stat(speedup, "%.2f×")))
		sec.printf("| %d | rueidis ÷ go-redis, operations/s per round | %s | | |\n", g, stat(speedup, "%.2f×"))
	}
	return nil
}

// driveClient runs c from g goroutines for d.
func driveClient(c redisClient, g int, d time.Duration, redis *proc) (clientRun, error) {
	var (
		ops      atomic.Int64
		stop     atomic.Bool
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	measure := cpuOf([]*proc{redis})
	self := selfCPU()
	start := time.Now()
	time.AfterFunc(d, func() { stop.Store(true) })
	for range g {
		wg.Go(func() {
			for !stop.Load() {
				if err := c.exec(context.Background()); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	clientCPU := selfCPU() - self
	servCPU, err := measure()
	if err != nil {
		return clientRun{}, err
	}
	if firstErr != nil {
		return clientRun{}, firstErr
	}
	n := float64(ops.Load())
	return clientRun{ops: n / elapsed.Seconds(), clientCPU: perRequest(clientCPU, n), servCPU: perRequest(servCPU, n)}, nil
}
