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

// reloader keeps the rate limit service on the Envoy configuration's files
// as they change, without a restart.
type reloader struct {
	cfg    config.Config // the configuration in force
	b      *backend
	svc    *rls.Service
	logger *slog.Logger
	seen   string // the files' fingerprint when last loaded, or tried
	failed string // the last error logged, not to repeat it every check
}

// run reloads the configuration whenever its files change (checked every
// reloadInterval) and whenever hup receives, until ctx is done. A change
// made after the configuration in force was read is seen, however soon.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	r.seen = r.cfg.Envoy.Digest
	t := time.NewTicker(reloadInterval)
	defer t.Stop()
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
			}
		}
	}
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
