package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/ratelimiter/ratelimiter/internal/config"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/bolt"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
	"github.com/ratelimiter/ratelimiter/internal/redisconn"
	"github.com/ratelimiter/ratelimiter/internal/rls"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
	tenantredis "github.com/ratelimiter/ratelimiter/internal/tenant/redis"
)

// backend is where the service keeps its limits.
type backend struct {
	limiters *limiter.Service
	tenants  *tenant.Service
	// registry is the in-memory per-IP registry, nil on Redis.
	registry *tenant.Registry
	// healthy reports whether the backend can decide as configured: always
	// on memory; on Redis, whether Redis answered its last health check,
	// or always with fail-open, which decides without it.
	healthy func() bool
	// up reports whether the backend answers, whatever the failure mode:
	// always on memory; on Redis, whether it answered its health checks.
	up func() bool
	// close releases the backend once the server has stopped.
	close func()
	// redeclare makes defs the limiters the service declares, as a reload
	// of its configuration declares them: on Redis, the ones it keeps
	// there (see limiterredis.Lazy); nothing on memory, where nothing is
	// lost behind the service's back.
	redeclare func(defs []limiter.Definition)
}

// newMemoryBackend builds the embedded backend: the limiters and the
// per-IP tenants in this process, on one Clock, and with a data directory
// kept on disk as well (see package bolt).
func newMemoryBackend(ctx context.Context, cfg config.Config, logger *slog.Logger) (*backend, error) {
	clock := limiter.NewClock()
	registry, err := tenant.New(cfg.Tenants, clock)
	if err != nil {
		return nil, &configError{fmt.Errorf("per-IP policy: %w", err)}
	}
	mem := memory.New(clock, cfg.MaxLimiters)
	var (
		store limiter.Store = mem
		disk  *bolt.Store
	)
	closeStore := func() {}
	if cfg.DataDir != "" {
		opts := bolt.Options{Clock: clock, Tenants: registry, OnLockWait: func() {
			logger.Warn("waiting for another process to let go of the data file (the instance this one replaces, still shutting down?)",
				"dir", cfg.DataDir, "up_to", bolt.DefaultLockWait.String())
		}}
		if disk, err = bolt.Open(cfg.DataDir, mem, opts); err != nil {
			return nil, err
		}
		store = disk
		closeStore = func() {
			if err := disk.Close(); err != nil {
				logger.Error("closing the data file", "path", disk.Path(), "error", err)
			}
		}
	}
	b := &backend{
		limiters:  limiter.NewService(store),
		tenants:   tenant.NewService(registry, limiter.ServiceOptions{}),
		registry:  registry,
		healthy:   func() bool { return true },
		up:        func() bool { return true },
		close:     closeStore,
		redeclare: func([]limiter.Definition) {},
	}
	for _, def := range cfg.Limiters {
		if _, err := b.limiters.Put(ctx, def); err != nil {
			closeStore()
			return nil, fmt.Errorf("create limiter from %s: %w", cfg.ConfigFile, err)
		}
	}
	if err := rls.Apply(ctx, b.limiters, cfg.Envoy); err != nil {
		closeStore()
		return nil, fmt.Errorf("create limiter from %s: %w", cfg.EnvoyConfigPath, err)
	}
	if disk == nil {
		return b, nil
	}
	// The state last, once every limiter it may hold state for exists.
	r, err := disk.Restore(func(err error) { logger.Error("saving the limiters' state", "error", err) })
	if err != nil {
		closeStore()
		return nil, err
	}
	defs, _ := mem.List(ctx, "", cfg.MaxLimiters)
	attrs := []any{"path", disk.Path(), "limiters", len(defs), "state_bytes", r.Bytes, "crashed", r.Crashed}
	if !r.SavedAt.IsZero() {
		attrs = append(attrs, "saved_at", r.SavedAt.UTC().Format(time.RFC3339Nano))
	}
	if r.Crashed {
		logger.Warn("the previous run ended without shutting down: every limiter and key starts exhausted, as if it had granted everything it held at this restart", attrs...)
	} else {
		logger.Info("state restored from the data directory", attrs...)
	}
	return b, nil
}

// declaredInterval is how often the Redis backend checks that the limiters
// of the config file are in Redis. Decisions on a missing one create it at
// once; the check brings back the others, for List.
const declaredInterval = 5 * time.Second

// newBackend builds the configured backend. The Redis backend starts even
// while Redis is unreachable, and connects in the background until ctx is
// done: meanwhile decisions follow the failure mode, as in any outage.
func newBackend(ctx context.Context, cfg config.Config, logger *slog.Logger) (*backend, error) {
	if cfg.Backend != config.BackendRedis {
		return newMemoryBackend(ctx, cfg, logger)
	}

	opts, err := redisconn.Options(cfg.Redis)
	if err != nil {
		return nil, &configError{err}
	}
	mode := limiter.FailClosed
	if cfg.Redis.FailureMode == config.FailOpen {
		mode = limiter.FailOpen
	}
	// An outage fails every decision alike: log one in a while, with how
	// many failed since the last record.
	var failures, logged atomic.Int64
	throttle := rate.Sometimes{Interval: 10 * time.Second}
	svcOpts := limiter.ServiceOptions{
		FailureMode: mode,
		Timeout:     cfg.Redis.Timeout,
		OnUnavailable: func(err error) {
			n := failures.Add(1)
			throttle.Do(func() {
				logger.Warn("decided without Redis", "failure_mode", cfg.Redis.FailureMode,
					"error", err, "decisions_since_last_record", n-logged.Swap(n))
			})
		},
	}

	var (
		store   = limiterredis.NewLazy(cfg.Declared(), cfg.Redis.Timeout)
		tenants = tenantredis.NewLazy(cfg.Tenants.Policy, cfg.Tenants.IPv6Prefix)
		up      atomic.Bool
	)
	// Not ended by ctx, run's signal: the server keeps serving through its
	// shutdown delay and drain after the signal, and its decisions need
	// Redis until then. run's close ends it once the server has stopped.
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	b := &backend{
		limiters:  limiter.NewServiceWith(store, svcOpts),
		tenants:   tenant.NewService(tenants, svcOpts),
		healthy:   func() bool { return mode == limiter.FailOpen || up.Load() },
		up:        up.Load,
		redeclare: store.Redeclare,
		close: func() {
			cancel()
			<-done
		},
	}
	go func() {
		defer close(done)
		client := redisconn.Connect(cctx, opts, logger)
		if client == nil {
			return // ctx done before Redis answered
		}
		defer client.Close()
		ls, err := limiterredis.New(client, cfg.Redis.KeyPrefix, cfg.MaxLimiters)
		if err == nil {
			ls.CacheDenials(cfg.Redis.DenyCache)
			var ts *tenantredis.Tenants
			if ts, err = tenantredis.New(client, cfg.Redis.KeyPrefix, cfg.Tenants); err == nil {
				store.Set(ls)
				tenants.Set(ts)
			}
		}
		if err != nil {
			logger.Error("Redis backend unusable", "error", err)
			return
		}
		declared := logger.With("file", cfg.ConfigFile)
		store.Declare(cctx, declared)
		var keep sync.WaitGroup
		keep.Go(func() { store.Keep(cctx, declaredInterval, declared) })
		redisconn.Watch(cctx, client, &up, cfg.Redis, logger)
		keep.Wait()
	}()
	return b, nil
}
