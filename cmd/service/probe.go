package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"
)

// probe is the `probe URL` subcommand: it sends one GET to URL and succeeds
// when the answer is 2xx. An https URL is verified against --ca-file, and
// --cert-file and --key-file present a client certificate to a service
// that requires one (--tls-client-ca-file). The image has no shell and no HTTP client, so
// health checks that run inside it (the Helm chart's test pod, a Docker or
// Compose healthcheck) call the service binary itself.
func probe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	caFile := fs.String("ca-file", "", "https: PEM bundle the server's certificate must chain to (empty: the system's)")
	serverName := fs.String("server-name", "", "https: name the server's certificate must hold (empty: the URL's host)")
	certFile := fs.String("cert-file", "", "https: PEM client certificate to present, for a service with --tls-client-ca-file")
	keyFile := fs.String("key-file", "", "https: PEM private key of --cert-file")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s probe [--timeout 5s] [--ca-file path] [--server-name name] [--cert-file path --key-file path] URL\n\n"+
			"Sends GET URL and exits 0 on a 2xx answer, 1 otherwise. For example:\n"+
			"  %s probe http://127.0.0.1:8080/readyz\n"+
			"  %s probe --ca-file ca.crt --server-name ratelimiter --cert-file tls.crt --key-file tls.key https://127.0.0.1:8080/readyz\n\n",
			serviceName, serviceName, serviceName)
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
	tlsConfig, err := probeTLS(*caFile, *serverName, *certFile, *keyFile)
	if err != nil {
		return &configError{fmt.Errorf("probe: %w", err)}
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true}}
	resp, err := client.Do(req)
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

// probeTLS returns the probe's TLS configuration: the certificate
// authorities of caFile (the system's when empty), the server name to
// verify (the URL's host when empty), and the client certificate of
// certFile and keyFile, both or neither.
func probeTLS(caFile, serverName, certFile, keyFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--ca-file %s holds no PEM certificate", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--cert-file and --key-file go together: set both or neither")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert-file and --key-file: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
