package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/config"
	"github.com/ratelimiter/ratelimiter/internal/rls"
)

// reloadInterval is how often the Envoy configuration's files are checked
// for changes.
const reloadInterval = time.Second

// sweepInterval is how often the limiters the Envoy rules no longer need
// are swept (see rls.Service.Sweep), besides at start and after each
// reload: one goes at the first sweep that finds it has held no counts
// for rls.SweepGrace, so within two intervals of its keys being full
// again.
const sweepInterval = rls.SweepGrace

// reloader keeps the rate limit service on the Envoy configuration's files
// as they change, without a restart.
type reloader struct {
	cfg    config.Config // the configuration in force
	b      *backend
	svc    *rls.Service
	logger *slog.Logger
	seen   string // the files' fingerprint when last loaded, or tried
	failed string // the last error logged, not to repeat it every check
	// nextSweep is when the next sweep is due: at once on start, again
	// at each check until one succeeds, then every sweepInterval.
	nextSweep time.Time
	sweepErr  string // the last sweep error logged
	// now reads the time of sweeps; nil: time.Now.
	now func() time.Time
}

// clock returns the time of sweeps.
func (r *reloader) clock() time.Time {
	if r.now == nil {
		return time.Now()
	}
	return r.now()
}

// run reloads the configuration whenever its files change (checked every
// reloadInterval) and whenever hup receives, until ctx is done. A change
// made after the configuration in force was read is seen, however soon.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	r.seen = r.cfg.Envoy.Digest
	t := time.NewTicker(reloadInterval)
	defer t.Stop()
	// At start, the limiters of rules removed while the service was down
	// go, on a backend that keeps them (a data directory, Redis).
	r.sweep(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.logger.Info("reloading the envoy configuration", "reason", "SIGHUP")
			r.reload(ctx)
		case <-t.C:
			if fp := fingerprint(r.cfg.EnvoyConfigPath); fp != r.seen {
				r.reload(ctx)
			} else if !r.clock().Before(r.nextSweep) {
				r.sweep(ctx)
			}
		}
	}
}

// sweep deletes the limiters that the rules in force no longer need and
// that hold no counts (see rls.Service.Sweep). A sweep that fails (the
// backend unavailable) is logged once and tried again at the next check.
func (r *reloader) sweep(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	now := r.clock()
	sw, err := r.svc.Sweep(sctx, now)
	if sw.Deleted > 0 {
		r.logger.Info("envoy limiters no longer needed deleted", "deleted", sw.Deleted, "kept_while_holding_counts", sw.Kept)
	}
	if err != nil {
		if msg := err.Error(); msg != r.sweepErr {
			r.sweepErr = msg
			r.logger.Warn("envoy limiters not swept; tried again in a second", "error", msg)
		}
		r.nextSweep = now.Add(reloadInterval)
		return
	}
	r.sweepErr = ""
	r.nextSweep = now.Add(sweepInterval)
}

// reload loads the configuration and puts it in force; a configuration it
// cannot load, or whose limiters it cannot put, is logged and leaves the
// one in force as it is.
func (r *reloader) reload(ctx context.Context) {
	fp := fingerprint(r.cfg.EnvoyConfigPath)
	err := r.apply(ctx)
	if err == nil {
		// What was loaded, which may be newer than fp.
		r.seen, r.failed = r.cfg.Envoy.Digest, ""
		// The limiters of the rules it removed or renamed go now.
		r.sweep(ctx)
		return
	}
	if msg := err.Error(); msg != r.failed {
		r.failed = msg
		r.logger.Error("envoy configuration not reloaded; the previous one stays in force", "path", r.cfg.EnvoyConfigPath, "error", msg)
	}
	// A broken file stays broken until it changes; a backend that did not
	// answer is tried again at the next check.
	if _, ok := err.(*loadError); ok {
		r.seen = fp
	}
}

// loadError is a configuration that could not be read or is refused.
type loadError struct{ err error }

func (e *loadError) Error() string { return e.err.Error() }

func (r *reloader) apply(ctx context.Context) error {
	envoy, err := rls.Load(r.cfg.EnvoyConfigPath)
	if err != nil {
		return &loadError{err}
	}
	next, err := r.cfg.WithEnvoy(envoy)
	if err != nil {
		return &loadError{err}
	}
	// The limiters first, then the rules that use them.
	r.b.redeclare(next.Declared())
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rls.Apply(actx, r.b.limiters, envoy); err != nil {
		return fmt.Errorf("put the limiters of the rules: %w", err)
	}
	r.svc.SetConfig(envoy)
	r.cfg = next
	r.logger.Info("envoy configuration reloaded", "path", r.cfg.EnvoyConfigPath, "domains", envoy.Domains(), "rules", len(envoy.Limiters()))
	return nil
}

// fingerprint sums up the files of the configuration at path as they are
// now (see rls.Digest); one that cannot be read has a fingerprint of its
// own, so that it is tried, and its error logged.
func fingerprint(path string) string {
	d, err := rls.Digest(path)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	return d
}
