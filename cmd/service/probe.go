package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// probe is the `probe URL` subcommand: it sends one GET to URL and succeeds
// when the answer is 2xx. The image has no shell and no HTTP client, so
// health checks that run inside it (the Helm chart's test pod, a Docker or
// Compose healthcheck) call the service binary itself.
func probe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s probe [--timeout 5s] URL\n\n"+
			"Sends GET URL and exits 0 on a 2xx answer, 1 otherwise. For example:\n"+
			"  %s probe http://127.0.0.1:8080/readyz\n\n", serviceName, serviceName)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return &configError{fmt.Errorf("probe: %w", err)}
	}
	if fs.NArg() != 1 {
		return &configError{errors.New("probe: want exactly one URL")}
	}
	target := fs.Arg(0)
	if u, err := url.Parse(target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return &configError{fmt.Errorf("probe: %q is not an http or https URL", target)}
	}
	if *timeout <= 0 {
		return &configError{fmt.Errorf("probe: --timeout must be positive, got %v", *timeout)}
	}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return &configError{fmt.Errorf("probe: %w", err)}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	fmt.Fprintf(stdout, "%s %s\n", target, resp.Status)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("probe: %s answered %s", target, resp.Status)
	}
	return nil
}
