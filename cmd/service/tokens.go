package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/auth"
	"github.com/ratelimiter/ratelimiter/internal/config"
	"github.com/ratelimiter/ratelimiter/internal/httpapi"
)

// tokensInterval is how often the tokens file is checked for changes.
const tokensInterval = time.Second

// startGuard returns the guard of the service's tokens: the admin token,
// with the admin scope, and those of the tokens file, which it rereads
// every tokensInterval until ctx is done. It warns of every scope no
// token holds, open to every caller. A tokens file that cannot be read at
// start-up is a configuration error.
func startGuard(ctx context.Context, cfg config.Config, logger *slog.Logger) (*auth.Guard, error) {
	var fixed []auth.Token
	if cfg.AdminToken != "" {
		fixed = append(fixed, auth.NewToken(httpapi.AdminTokenName, cfg.AdminToken, auth.Admin))
	}
	w, err := auth.NewWatcher(auth.Source{Fixed: fixed, Path: cfg.TokensFile}, logger)
	if err != nil {
		return nil, &configError{err}
	}
	if open := w.Guard.Open(); open != 0 {
		auth.WarnOpen(logger, open)
	}
	if cfg.TokensFile != "" {
		go w.Run(ctx, tokensInterval)
	}
	return w.Guard, nil
}
