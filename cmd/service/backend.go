package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"golang.org/x/time/rate"

	"github.com/ratelimiter/ratelimiter/internal/config"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
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
	// close releases the backend once the server has stopped.
	close func()
}

// healthInterval is how often the Redis backend checks that Redis answers.
const healthInterval = time.Second

// newBackend builds the configured backend. The Redis backend starts even
// while Redis is unreachable, and connects in the background until ctx is
// done: meanwhile decisions follow the failure mode, as in any outage.
func newBackend(ctx context.Context, cfg config.Config, logger *slog.Logger) (*backend, error) {
	if cfg.Backend != config.BackendRedis {
		registry, err := tenant.New(cfg.Tenants, time.Now)
		if err != nil {
			return nil, &configError{fmt.Errorf("per-IP policy: %w", err)}
		}
		b := &backend{
			limiters: limiter.NewService(memory.New(time.Now)),
			tenants:  tenant.NewService(registry, limiter.ServiceOptions{}),
			registry: registry,
			healthy:  func() bool { return true },
			close:    func() {},
		}
		for _, def := range cfg.Limiters {
			if _, err := b.limiters.Put(ctx, def); err != nil {
				return nil, fmt.Errorf("create limiter from %s: %w", cfg.ConfigFile, err)
			}
		}
		return b, nil
	}

	opts, err := redisOptions(cfg.Redis)
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
		store   = &swapStore{}
		tenants = &swapTenants{policy: cfg.Tenants.Policy, bits: cfg.Tenants.IPv6Prefix}
		up      atomic.Bool
	)
	// Not ended by ctx, run's signal: the server keeps serving through its
	// shutdown delay and drain after the signal, and its decisions need
	// Redis until then. run's close ends it once the server has stopped.
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	b := &backend{
		limiters: limiter.NewServiceWith(store, svcOpts),
		tenants:  tenant.NewService(tenants, svcOpts),
		healthy:  func() bool { return mode == limiter.FailOpen || up.Load() },
		close: func() {
			cancel()
			<-done
		},
	}
	go func() {
		defer close(done)
		client := connect(cctx, opts, cfg.Redis.Addrs, logger)
		if client == nil {
			return // ctx done before Redis answered
		}
		defer client.Close()
		ls, err := limiterredis.New(client, cfg.Redis.KeyPrefix)
		if err == nil {
			var ts *tenantredis.Tenants
			if ts, err = tenantredis.New(client, cfg.Redis.KeyPrefix, cfg.Tenants); err == nil {
				store.set(ls)
				tenants.set(ts)
			}
		}
		if err != nil {
			logger.Error("Redis backend unusable", "error", err)
			return
		}
		declare(cctx, b.limiters, cfg, logger)
		watch(cctx, client, &up, cfg.Redis, logger)
	}()
	return b, nil
}

// redisOptions turns the Redis settings into client options.
func redisOptions(c config.Redis) (rueidis.ClientOption, error) {
	opts := rueidis.ClientOption{
		InitAddress: c.Addrs,
		Username:    c.Username,
		Password:    c.Password,
		Dialer:      net.Dialer{Timeout: c.DialTimeout},
		// A connection that cannot write for this long is broken; decisions
		// give up far sooner, by their own timeout.
		ConnWriteTimeout: max(c.DialTimeout, time.Second),
		// The scripts read their keys on the server; nothing is cached here.
		DisableCache:      true,
		PipelineMultiplex: pipelineMultiplex(c.ConnsPerNode),
	}
	if c.TLS {
		// No ServerName: each connection checks the certificate against the
		// host it dials, which differs between the nodes of a Cluster.
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLSCAFile != "" {
			pem, err := os.ReadFile(c.TLSCAFile)
			if err != nil {
				return opts, fmt.Errorf("Redis TLS CA file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return opts, fmt.Errorf("Redis TLS CA file %s holds no PEM certificate", c.TLSCAFile)
			}
			opts.TLSConfig.RootCAs = pool
		}
	}
	return opts, nil
}

// pipelineMultiplex turns n connections per node, a power of two or 0, into
// rueidis's ClientOption.PipelineMultiplex, which asks for 2^PipelineMultiplex
// connections. Its zero value is rueidis's default, which n = 0 keeps; but
// for a standalone server that default is chosen by GOMAXPROCS, so a single
// connection is asked for with a negative value, which every client reads
// as one connection.
func pipelineMultiplex(n int) int {
	switch n {
	case 0:
		return 0
	case 1:
		return -1
	}
	return bits.Len(uint(n)) - 1
}

// connect makes the Redis client, retrying with backoff until Redis answers
// or ctx is done (then it returns nil).
func connect(ctx context.Context, opts rueidis.ClientOption, addrs []string, logger *slog.Logger) rueidis.Client {
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		client, err := rueidis.NewClient(opts)
		if err == nil {
			logger.Info("connected to Redis", "addrs", addrs)
			return client
		}
		if attempt == 1 || attempt%10 == 0 {
			logger.Warn("cannot reach Redis; retrying", "addrs", addrs, "attempt", attempt, "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// declare creates the limiters of the config file, retrying while Redis
// cannot answer.
func declare(ctx context.Context, limiters *limiter.Service, cfg config.Config, logger *slog.Logger) {
	for _, def := range cfg.Limiters {
		for {
			_, err := limiters.Put(ctx, def)
			if err == nil {
				break
			}
			if !errors.Is(err, limiter.ErrUnavailable) || ctx.Err() != nil {
				logger.Error("limiter from the config file not created", "name", def.Name, "file", cfg.ConfigFile, "error", err)
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// watch pings Redis every healthInterval until ctx is done, keeping up
// current and logging each change. Redis is down after two pings in a row
// went unanswered, so that one slow answer under load does not make the
// replica unready, and up again after one answered.
//
// A ping waits no longer than a decision: when the connection is down, the
// ping may be the call that dials Redis again, and the client makes
// decisions arriving meanwhile wait for that dial, whatever their own
// deadline; a longer ping would hold them past the Redis timeout.
func watch(ctx context.Context, client rueidis.Client, up *atomic.Bool, c config.Redis, logger *slog.Logger) {
	ticker := time.NewTicker(healthInterval)
	defer ticker.Stop()
	failed := 0 // pings unanswered in a row
	for {
		pctx, cancel := context.WithTimeout(ctx, c.Timeout)
		err := client.Do(pctx, client.B().Ping().Build()).Error()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failed++
		} else {
			failed = 0
		}
		switch was := up.Load(); {
		case err == nil && !was:
			up.Store(true)
			logger.Info("Redis answers", "addrs", c.Addrs)
		case failed >= 2 && was:
			up.Store(false)
			logger.Warn("Redis does not answer", "addrs", c.Addrs, "failure_mode", c.FailureMode, "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// swapStore is a limiter.Store that is unavailable until set.
type swapStore struct {
	p atomic.Pointer[limiterredis.Store]
}

var _ limiter.BatchStore = (*swapStore)(nil)

var errNotConnected = fmt.Errorf("%w: not connected to Redis yet", limiter.ErrUnavailable)

func (s *swapStore) set(st *limiterredis.Store) { s.p.Store(st) }

func (s *swapStore) get() (*limiterredis.Store, error) {
	if st := s.p.Load(); st != nil {
		return st, nil
	}
	return nil, errNotConnected
}

func (s *swapStore) Put(ctx context.Context, def limiter.Definition) (bool, error) {
	st, err := s.get()
	if err != nil {
		return false, err
	}
	return st.Put(ctx, def)
}

func (s *swapStore) Get(ctx context.Context, name string) (limiter.Definition, error) {
	st, err := s.get()
	if err != nil {
		return limiter.Definition{}, err
	}
	return st.Get(ctx, name)
}

func (s *swapStore) List(ctx context.Context, after string, max int) ([]limiter.Definition, error) {
	st, err := s.get()
	if err != nil {
		return nil, err
	}
	return st.List(ctx, after, max)
}

func (s *swapStore) Delete(ctx context.Context, name string) error {
	st, err := s.get()
	if err != nil {
		return err
	}
	return st.Delete(ctx, name)
}

func (s *swapStore) Acquire(ctx context.Context, name string, permits int64) (limiter.Decision, error) {
	st, err := s.get()
	if err != nil {
		return limiter.Decision{}, err
	}
	return st.Acquire(ctx, name, permits)
}

func (s *swapStore) AcquireBatch(ctx context.Context, reqs []limiter.Request, out []limiter.Result) {
	st, err := s.get()
	if err != nil {
		for i := range out {
			out[i] = limiter.Result{Err: err}
		}
		return
	}
	st.AcquireBatch(ctx, reqs, out)
}

func (s *swapStore) Available(ctx context.Context, name string) (limiter.Availability, error) {
	st, err := s.get()
	if err != nil {
		return limiter.Availability{}, err
	}
	return st.Available(ctx, name)
}

// swapTenants is a tenant.Backend that is unavailable until set. It knows
// the policy and names tenants by itself, so that answers made without
// Redis name the right tenant.
type swapTenants struct {
	p      atomic.Pointer[tenantredis.Tenants]
	policy limiter.Policy
	bits   int
}

var _ tenant.Backend = (*swapTenants)(nil)

func (s *swapTenants) set(t *tenantredis.Tenants) { s.p.Store(t) }

func (s *swapTenants) Policy() limiter.Policy { return s.policy }

func (s *swapTenants) Tenant(ip string) (string, error) {
	_, name, err := tenant.Key(ip, s.bits)
	return name, err
}

func (s *swapTenants) Acquire(ctx context.Context, ip string, permits int64) (tenant.Decision, error) {
	if t := s.p.Load(); t != nil {
		return t.Acquire(ctx, ip, permits)
	}
	return tenant.Decision{}, errNotConnected
}

func (s *swapTenants) Available(ctx context.Context, ip string) (tenant.Availability, error) {
	if t := s.p.Load(); t != nil {
		return t.Available(ctx, ip)
	}
	return tenant.Availability{}, errNotConnected
}

func (s *swapTenants) Lowest(ctx context.Context, k int) ([]tenant.Entry, error) {
	if t := s.p.Load(); t != nil {
		return t.Lowest(ctx, k)
	}
	return nil, errNotConnected
}
