// Command service runs ratelimiter, the rate-limiting HTTP service. Run it
// with --help for its settings.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Set at build time with
// -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD)".
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, a second one stops the process at once.
		<-ctx.Done()
		stop()
	}()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}
