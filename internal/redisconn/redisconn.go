// Package redisconn is the service's connection to Redis: the client
// options made from the settings, a connection made in the background with
// backoff, and a health watch. What the service keeps in Redis lives in the
// backends, limiter/redis and tenant/redis, which take the client made here.
package redisconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/config"
)

// HealthInterval is how often Watch checks that Redis answers.
const HealthInterval = time.Second

// Options turns the Redis settings into client options. Its error is a
// configuration error: the TLS CA file cannot be read or holds no
// certificate.
func Options(c config.Redis) (rueidis.ClientOption, error) {
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

// Connect makes the Redis client, retrying with backoff (100 ms doubling up
// to 5 s) until Redis answers, or returns nil once ctx is done. It logs the
// first failure and every tenth.
func Connect(ctx context.Context, opts rueidis.ClientOption, logger *slog.Logger) rueidis.Client {
	addrs := opts.InitAddress
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

// Watch pings Redis every HealthInterval until ctx is done, keeping up
// current and logging each change. Redis is down after two pings in a row
// went unanswered, so that one slow answer under load does not make the
// replica unready, and up again after one answered.
//
// A ping waits no longer than a decision, c.Timeout: when the connection is
// down, the ping may be the call that dials Redis again, and the client
// makes decisions arriving meanwhile wait for that dial, whatever their own
// deadline; a longer ping would hold them past the Redis timeout.
func Watch(ctx context.Context, client rueidis.Client, up *atomic.Bool, c config.Redis, logger *slog.Logger) {
	ticker := time.NewTicker(HealthInterval)
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
