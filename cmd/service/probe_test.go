package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestProbe(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(http.StatusOK)
		case "/no-content":
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)

	// An address nothing listens on: a listener opened and closed again.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String() + "/readyz"
	l.Close()

	tests := []struct {
		name       string
		args       []string
		wantErr    bool
		wantConfig bool   // the error is a usage error (exit status 2)
		wantOut    string // substring of stdout
	}{
		{name: "200", args: []string{srv.URL + "/ok"}, wantOut: "200 OK"},
		{name: "204", args: []string{"--timeout", "1s", srv.URL + "/no-content"}, wantOut: "204 No Content"},
		{name: "503", args: []string{srv.URL + "/readyz"}, wantErr: true, wantOut: "503 Service Unavailable"},
		{name: "connection refused", args: []string{closed}, wantErr: true},
		{name: "no URL", args: nil, wantErr: true, wantConfig: true},
		{name: "two URLs", args: []string{srv.URL, srv.URL}, wantErr: true, wantConfig: true},
		{name: "not http", args: []string{"ftp://example.invalid/"}, wantErr: true, wantConfig: true},
		{name: "no host", args: []string{"http:///readyz"}, wantErr: true, wantConfig: true},
		{name: "zero timeout", args: []string{"--timeout", "0s", srv.URL}, wantErr: true, wantConfig: true},
		{name: "unknown flag", args: []string{"--nope", srv.URL}, wantErr: true, wantConfig: true},
		{name: "client certificate without key", args: []string{"--cert-file", "tls.crt", srv.URL}, wantErr: true, wantConfig: true},
		{name: "CA file missing", args: []string{"--ca-file", "/nonexistent/ca.crt", srv.URL}, wantErr: true, wantConfig: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"probe"}, tt.args...)
			err := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr)
			if gotErr := err != nil; gotErr != tt.wantErr {
				t.Fatalf("run(%q) error = %v, want error: %v", args, err, tt.wantErr)
			}
			var cerr *configError
			if got := errors.As(err, &cerr); got != tt.wantConfig {
				t.Errorf("run(%q) error %v is a usage error: %v, want %v", args, err, got, tt.wantConfig)
			}
			if !strings.Contains(stdout.String(), tt.wantOut) {
				t.Errorf("stdout = %q, want it to contain %q", stdout.String(), tt.wantOut)
			}
			if code := exitCode(err, &stderr); tt.wantConfig && code != 2 || !tt.wantConfig && tt.wantErr && code != 1 {
				t.Errorf("exit status = %d for error %v", code, err)
			}
		})
	}
}

// The probe reaches a real service: the readiness endpoint the chart's test
// pod and a container healthcheck point at.
func TestProbeAgainstService(t *testing.T) {
	base, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0"}, nil)
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"probe", base + "/readyz"}, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("probe %s/readyz: %v (stderr %q)", base, err, stderr.String())
	}
	if err := run(context.Background(), []string{"probe", base + "/v1/limiters/missing"}, func(string) string { return "" }, &stdout, &stderr); err == nil {
		t.Errorf("probe of a missing limiter succeeded, want an error for its 404")
	}
}
