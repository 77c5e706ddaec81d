package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"google.golang.org/grpc"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/config"
	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/heapfloor"
	"github.com/ratelimiter/ratelimiter/internal/httpapi"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/rls"
	"github.com/ratelimiter/ratelimiter/internal/telemetry"
)

// serviceName names the service in usage text and telemetry.
const serviceName = "ratelimiter"

// configError is an error in the configuration: the process exits with
// status 2 and points at --help.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// exitCode reports err on stderr and returns the exit status for it: 0 for
// nil, 2 for a configuration error, 1 for any other.
func exitCode(err error, stderr io.Writer) int {
	var cerr *configError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &cerr):
		fmt.Fprintf(stderr, "%s: %v\nRun %s --help to list the settings.\n", serviceName, err, serviceName)
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", serviceName, err)
		return 1
	}
}

// run is the service: it reads its configuration from args and getenv, serves
// HTTP until ctx is done, then shuts down gracefully. It writes --help and
// --version to stdout and its logs to stderr, and returns nil after a clean
// shutdown; errors met while stopping are joined. With "probe" as its first
// argument it runs the probe subcommand instead.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	if len(args) > 0 && args[0] == "probe" {
		return probe(ctx, args[1:], stdout, stderr)
	}
	cfg, err := config.Load(args, getenv)
	switch {
	case errors.Is(err, flag.ErrHelp):
		config.Usage(stdout, serviceName)
		return nil
	case err != nil:
		return &configError{err}
	case cfg.ShowVersion:
		fmt.Fprintf(stdout, "%s %s (commit %s, %s)\n", serviceName, version, commit, runtime.Version())
		return nil
	}

	logger := newLogger(cfg, stderr)
	logger.Info("starting", "version", version, "commit", commit, "go", runtime.Version(), "config", cfg)
	guard, err := startGuard(ctx, cfg, logger)
	if err != nil {
		return err
	}
	switch gogc := getenv("GOGC"); {
	case cfg.GCMinHeap == 0:
	case gogc != "":
		logger.Info("GOGC is set, so --gc-min-heap does not apply", "GOGC", gogc)
	default:
		defer heapfloor.Start(uint64(cfg.GCMinHeap))()
	}

	tel, err := telemetry.Setup(ctx, telemetry.Options{
		ServiceName: serviceName, Version: version, Logger: logger,
		MaxSeries: httpapi.DecisionSeries(cfg.MetricsMaxLimiters),
	})
	if err != nil {
		// In practice Setup fails only on OTEL_* variables it cannot use.
		return &configError{err}
	}
	// From here on every return flushes telemetry, within the shutdown
	// deadline once shutdown has begun.
	var deadline time.Time
	defer func() {
		if deadline.IsZero() {
			deadline = time.Now().Add(cfg.ShutdownTimeout)
		}
		sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		defer cancel()
		err = errors.Join(err, tel.Shutdown(sctx))
		if err != nil {
			logger.Error("stopped", "error", err)
			return
		}
		logger.Info("stopped")
	}()

	b, err := newBackend(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer b.close()
	for _, def := range cfg.Limiters {
		logger.Debug("limiter declared", "name", def.Name, "limit", def.Policy.Limit,
			"period", limiter.FormatPeriod(def.Policy.Period), "algorithm", def.Policy.Algorithm,
			"group", def.Group, "keyed", def.Keyed, "max_keys", def.MaxKeys)
	}
	if err := tel.ObserveBackend(cfg.Backend, b.up); err != nil {
		return err
	}
	if b.registry != nil {
		err = tel.ObserveTenants(func() (int64, int64) {
			s := b.registry.Stats()
			return int64(s.Tenants), int64(s.IndexEntries)
		})
		if err != nil {
			return err
		}
	}

	var ready atomic.Bool
	var forward *forwardauth.Service
	if cfg.ForwardAuth != nil {
		// The limiter service applies the failure mode to decisions;
		// this is the answer to one that fails otherwise.
		failOpen := cfg.Backend == config.BackendRedis && cfg.Redis.FailureMode == config.FailOpen
		forward = forwardauth.NewService(*cfg.ForwardAuth, b.limiters, failOpen)
	}
	handler, err := httpapi.New(httpapi.Options{
		Limiters:           b.limiters,
		ForwardAuth:        forward,
		Tenants:            b.tenants,
		Guard:              guard,
		MaxBodyBytes:       cfg.MaxBodyBytes,
		MetricsMaxLimiters: cfg.MetricsMaxLimiters,
		Logger:             logger,
		TracerProvider:     tel.TracerProvider,
		MeterProvider:      tel.MeterProvider,
		Metrics:            tel.Metrics,
		// Ready while not shutting down and while the backend can decide
		// as configured.
		Ready: func() bool { return ready.Load() && b.healthy() },
	})
	if err != nil {
		return fmt.Errorf("http handler: %w", err)
	}
	srv := &http.Server{
		Handler:           closeWhenStopping(handler, &ready),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    serverMaxHeaderBytes(cfg.MaxHeaderBytes),
		ErrorLog:          newErrorLog(logger),
	}

	lns, err := newListeners(cfg.Listeners, logger)
	if err != nil {
		return err
	}
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	ln, serveHTTP := lns.http(srv, ln)
	// The gRPC server's health follows readiness until the shutdown
	// begins; hctx ends with it.
	hctx, stopHealth := context.WithCancel(ctx)
	defer stopHealth()
	var (
		gsrv   *grpc.Server
		gln    net.Listener
		gerved = make(chan error, 1)
	)
	ready.Store(true)
	if cfg.GRPCListen != "" {
		if gln, err = new(net.ListenConfig).Listen(ctx, "tcp", cfg.GRPCListen); err != nil {
			ln.Close()
			return fmt.Errorf("listen for gRPC: %w", err)
		}
		svc, err := rls.NewService(b.limiters, cfg.Envoy, rls.Options{Logger: logger, MeterProvider: tel.MeterProvider, Headers: cfg.EnvoyHeaders})
		if err != nil {
			ln.Close()
			gln.Close()
			return err
		}
		var bounds []grpc.ServerOption
		gln, bounds = lns.grpc(gln)
		opts := append(bounds, grpcTelemetry(tel.TracerProvider)...)
		gsrv = newGRPCServer(hctx, svc, func() bool { return ready.Load() && b.healthy() }, append(opts, grpcAuth(guard))...)
		if cfg.EnvoyConfigPath != "" {
			// Reloaded when its files change, and on SIGHUP.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			r := &reloader{cfg: cfg, b: b, svc: svc, logger: logger}
			go r.run(hctx, hup)
		}
	}
	served := make(chan error, 1)
	go func() { served <- serveHTTP() }()
	if gsrv != nil {
		go func() { gerved <- gsrv.Serve(gln) }()
		logger.Info("serving gRPC", "address", gln.Addr().String(), "domains", cfg.Envoy.Domains(), "rules", len(cfg.Envoy.Limiters()))
	}
	logger.Info("listening", "address", ln.Addr().String(), "limiters", len(cfg.Limiters), "tls", lns.tls != nil)

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case err := <-gerved:
		return fmt.Errorf("serve gRPC: %w", err)
	case <-ctx.Done():
	}
	stopHealth()

	// Stop advertising readiness first, and keep serving for the delay, so
	// that load balancers route new requests elsewhere before the listener
	// closes; meanwhile every answer closes its connection
	// (closeWhenStopping).
	ready.Store(false)
	logger.Info("shutting down", "delay", cfg.ShutdownDelay.String(), "timeout", cfg.ShutdownTimeout.String())
	delay := time.NewTimer(cfg.ShutdownDelay)
	select {
	case err := <-served:
		delay.Stop()
		return fmt.Errorf("serve: %w", err)
	case <-delay.C:
	}

	deadline = time.Now().Add(cfg.ShutdownTimeout)
	sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	var errs []error
	// The gRPC server stops alongside the HTTP server, within the same
	// deadline.
	gdone := make(chan bool, 1)
	if gsrv != nil {
		go func() { gdone <- stopGRPC(sctx, gsrv) }()
	} else {
		gdone <- true
	}
	if err := srv.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("in-flight requests did not finish within %s: %w", cfg.ShutdownTimeout, err))
		errs = append(errs, srv.Close())
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		errs = append(errs, fmt.Errorf("serve: %w", err))
	}
	if !<-gdone {
		errs = append(errs, fmt.Errorf("in-flight gRPC calls did not finish within %s", cfg.ShutdownTimeout))
	}
	return errors.Join(errs...)
}

// closeWhenStopping makes every answer given once the service is stopping,
// during the shutdown delay, close its connection ("Connection: close"). A
// client holding a kept-alive connection to this replica then opens its
// next one through the load balancer, which by then routes elsewhere,
// instead of sending a request on a connection that the server closes as
// idle when the delay ends: a request lost that way cannot be retried by
// the client unless it is idempotent.
func closeWhenStopping(next http.Handler, ready *atomic.Bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// goHeaderSlack is how many bytes of a request Go's HTTP server reads
// past http.Server.MaxHeaderBytes before it refuses the header section
// with 431 (the size of its read buffer; see initialReadLimitSize in
// net/http).
const goHeaderSlack = 4096

// serverMaxHeaderBytes is the http.Server.MaxHeaderBytes that refuses
// exactly the header sections longer than limit bytes; limit is at least
// config.MinHeaderBytes. TestMaxHeaderBytesIsWhatTheFlagSays holds it to
// that.
func serverMaxHeaderBytes(limit int) int {
	return max(1, limit-goHeaderSlack)
}

// newLogger returns the service's logger, writing to w in the configured
// format from the configured level up.
func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == config.LogText {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
