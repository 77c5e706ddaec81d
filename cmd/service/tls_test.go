package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/ratelimiter/ratelimiter/internal/tlsfiles/testpki"
)

// tlsService is the service started with TLS on both listeners.
type tlsService struct {
	addr, grpcAddr    string // host:port
	certFile, keyFile string
	logs              *logs
	roots             *x509.CertPool
}

// startTLS starts the service serving the certificate cert of ca, with
// args besides.
func startTLS(t *testing.T, ca *testpki.CA, cert testpki.Pair, args ...string) *tlsService {
	t.Helper()
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	certFile, keyFile := cert.Write(t, t.TempDir())
	args = append([]string{"--listen", "127.0.0.1:0", "--tls-cert-file", certFile, "--tls-key-file", keyFile}, args...)
	base, stderr, _, _ := start(t, args, nil)
	s := &tlsService{addr: strings.TrimPrefix(base, "http://"), certFile: certFile, keyFile: keyFile, logs: stderr, roots: x509.NewCertPool()}
	s.grpcAddr = grpcAddr(t, stderr)
	s.roots.AddCert(ca.Cert)
	return s
}

// get sends GET path over a new TLS connection presenting certs, and
// returns the answer (its body closed).
func (s *tlsService) get(path string, certs ...tls.Certificate) (*http.Response, error) {
	c := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: s.roots, Certificates: certs},
		ForceAttemptHTTP2: true, DisableKeepAlives: true,
	}, Timeout: 10 * time.Second}
	resp, err := c.Get("https://" + s.addr + path)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	return resp, nil
}

// grpcHealth checks the gRPC server's health over a new TLS connection
// presenting certs, and returns the certificate the server presented.
func (s *tlsService) grpcHealth(t *testing.T, certs ...tls.Certificate) (*x509.Certificate, error) {
	t.Helper()
	creds := credentials.NewTLS(&tls.Config{RootCAs: s.roots, ServerName: "localhost", Certificates: certs})
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var p peer.Peer
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
	if err != nil {
		return nil, err
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health over TLS: got %v, want SERVING", resp.Status)
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, errors.New("the gRPC call was not over TLS")
	}
	return info.State.PeerCertificates[0], nil
}

// keyPair returns p as a tls.Certificate.
func keyPair(t *testing.T, p testpki.Pair) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Both listeners serve TLS, HTTP/2 on the HTTP listener, and pick up new
// certificate files without a restart; files that do not load leave the
// previous certificate served.
func TestTLS(t *testing.T) {
	ca := testpki.NewCA(t, "server CA")
	s := startTLS(t, ca, ca.Server(t, "first"))

	resp, err := s.get("/livez")
	if err != nil {
		t.Fatalf("GET /livez over TLS: %v", err)
	}
	if resp.StatusCode != http.StatusOK || resp.Proto != "HTTP/2.0" {
		t.Errorf("GET /livez over TLS: got %d over %s, want 200 over HTTP/2.0", resp.StatusCode, resp.Proto)
	}
	plain, err := http.Get("http://" + s.addr + "/livez")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK {
			t.Errorf("GET /livez in plain HTTP on the TLS listener: got 200, want a refusal")
		}
	}
	cert, err := s.grpcHealth(t)
	if err != nil {
		t.Fatalf("gRPC health over TLS: %v", err)
	}
	if got, want := cert.Subject.CommonName, "first"; got != want {
		t.Errorf("gRPC server certificate: got %q, want %q", got, want)
	}

	// New files: within seconds, new handshakes on both listeners get the
	// new certificate.
	second := ca.Server(t, "second")
	second.Write(t, filepath.Dir(s.certFile))
	served := func() (httpCN, grpcCN string) {
		if resp, err := s.get("/livez"); err == nil {
			httpCN = resp.TLS.PeerCertificates[0].Subject.CommonName
		}
		if cert, err := s.grpcHealth(t); err == nil {
			grpcCN = cert.Subject.CommonName
		}
		return httpCN, grpcCN
	}
	var httpCN, grpcCN string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if httpCN, grpcCN = served(); httpCN == "second" && grpcCN == "second" {
			break
		}
	}
	if httpCN != "second" || grpcCN != "second" {
		t.Fatalf("after the files changed: HTTP serves %q, gRPC %q, want both %q", httpCN, grpcCN, "second")
	}
	if !slicesContain(s.logs.messages(), "TLS files reloaded") {
		t.Errorf("logs %q: want the reload reported", s.logs.messages())
	}

	// A key that is not the certificate's: the second stays.
	testpki.WriteFile(t, s.keyFile, ca.Server(t, "third").KeyPEM)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if slicesContain(s.logs.messages(), "TLS files changed but do not load: serving the previous certificate") {
			break
		}
		served()
	}
	if !slicesContain(s.logs.messages(), "TLS files changed but do not load: serving the previous certificate") {
		t.Errorf("logs %q: want the broken pair reported", s.logs.messages())
	}
	if httpCN, grpcCN = served(); httpCN != "second" || grpcCN != "second" {
		t.Errorf("after a broken pair: HTTP serves %q, gRPC %q, want both %q", httpCN, grpcCN, "second")
	}
}

// With --tls-client-ca-file, both listeners refuse a client without a
// certificate or with one from another authority, and serve one with a
// certificate of the client CA; the probe subcommand presents one.
func TestMutualTLS(t *testing.T) {
	serverCA, clientCA, otherCA := testpki.NewCA(t, "server CA"), testpki.NewCA(t, "client CA"), testpki.NewCA(t, "another CA")
	dir := t.TempDir()
	caFile := filepath.Join(dir, "clients.pem")
	testpki.WriteFile(t, caFile, clientCA.PEM)
	s := startTLS(t, serverCA, serverCA.Server(t, "server"), "--tls-client-ca-file", caFile)

	good, stranger := keyPair(t, clientCA.Client(t, "envoy")), keyPair(t, otherCA.Client(t, "mallory"))
	tests := []struct {
		name   string
		certs  []tls.Certificate
		wantOK bool
	}{
		{name: "client CA", certs: []tls.Certificate{good}, wantOK: true},
		{name: "no certificate"},
		{name: "another CA", certs: []tls.Certificate{stranger}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := s.get("/readyz", tt.certs...)
			if got := err == nil && resp.StatusCode == http.StatusOK; got != tt.wantOK {
				t.Errorf("HTTP: got answered %v (error %v), want %v", got, err, tt.wantOK)
			}
			_, err = s.grpcHealth(t, tt.certs...)
			if got := err == nil; got != tt.wantOK {
				t.Errorf("gRPC: got answered %v (error %v), want %v", got, err, tt.wantOK)
			}
		})
	}

	// The probe, as a Kubernetes exec probe or the chart's test runs it.
	roots := filepath.Join(dir, "server-ca.pem")
	testpki.WriteFile(t, roots, serverCA.PEM)
	client := clientCA.Client(t, "probe")
	certFile, keyFile := client.Write(t, t.TempDir())
	url := "https://" + s.addr + "/readyz"
	var stdout, stderr bytes.Buffer
	args := []string{"probe", "--ca-file", roots, "--server-name", "localhost", "--cert-file", certFile, "--key-file", keyFile, url}
	if err := run(t.Context(), args, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Errorf("probe with a client certificate: %v (stderr %q)", err, stderr.String())
	}
	args = []string{"probe", "--ca-file", roots, url}
	err := run(t.Context(), args, func(string) string { return "" }, &stdout, &stderr)
	var cerr *configError
	if err == nil || errors.As(err, &cerr) {
		t.Errorf("probe without a client certificate: got %v, want a failure that is not a usage error", err)
	}
}

// A start-up with TLS files that do not load is refused as a
// configuration error, naming the file.
func TestTLSFilesThatDoNotLoad(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	args := []string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--tls-cert-file", missing, "--tls-key-file", missing}
	var stderr bytes.Buffer
	// A service that started anyway stops after a while, and fails the test.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := run(ctx, args, func(string) string { return "" }, &bytes.Buffer{}, &stderr)
	if code := exitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), "missing.pem") {
		t.Errorf("got exit status %d, stderr %q; want 2 and the file named", code, stderr.String())
	}
}

// HTTP/2 requests in flight over all connections are bounded by
// --max-connections, as HTTP/1's are by the connections: one more is
// answered 503 with a problem, and the health checks are still answered.
func TestHTTP2RequestBound(t *testing.T) {
	ca := testpki.NewCA(t, "server CA")
	s := startTLS(t, ca, ca.Server(t, "server"), "--max-connections", "2")
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots}, ForceAttemptHTTP2: true}}
	t.Cleanup(c.CloseIdleConnections)
	put := func(body io.Reader) (*http.Response, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, "https://"+s.addr+"/v1/limiters/held", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		return c.Do(req)
	}
	// Two requests whose bodies never end hold the bound.
	for range 2 {
		r, w := io.Pipe()
		t.Cleanup(func() { w.Close() })
		go func() {
			if resp, err := put(r); err == nil {
				resp.Body.Close()
			}
		}()
		w.Write([]byte(`{"limit":`))
	}
	var resp *http.Response
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		resp, err = put(strings.NewReader(`{"limit":1,"period":"1s"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			break
		}
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Proto != "HTTP/2.0" ||
		resp.Header.Get("Content-Type") != "application/problem+json" || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("a third HTTP/2 request with 2 held and --max-connections 2: got %d over %s (%s, Retry-After %q), want 503 problem+json over HTTP/2.0 with Retry-After 1",
			resp.StatusCode, resp.Proto, resp.Header.Get("Content-Type"), resp.Header.Get("Retry-After"))
	}
	if !slicesContain(s.logs.messages(), "HTTP/2 request limit reached: answering 503") {
		t.Errorf("logs %q: want the refusal reported", s.logs.messages())
	}
	health, err := c.Get("https://" + s.addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	health.Body.Close()
	if health.StatusCode != http.StatusOK {
		t.Errorf("GET /readyz at the bound: got %d, want 200", health.StatusCode)
	}
}

// Failed TLS handshakes on the HTTP listener (here, clients that send
// bytes that are not TLS) are counted in one warning at most every 10
// seconds rather than logged one by one, so that a scanner cannot flood
// the log.
func TestFailedHandshakesAreNotLoggedOneByOne(t *testing.T) {
	ca := testpki.NewCA(t, "server CA")
	s := startTLS(t, ca, ca.Server(t, "server"))
	const clients = 20
	for range clients {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("not a TLS client hello\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		// The server logs the failure before it closes the connection.
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.Copy(io.Discard, c)
		c.Close()
	}
	var oneByOne, counted int
	for _, m := range s.logs.messages() {
		switch {
		case strings.Contains(m, "TLS handshake error"):
			oneByOne++
		case m == "TLS handshakes failed":
			counted++
		}
	}
	if oneByOne != 0 || counted != 1 {
		t.Errorf("after %d failed handshakes: got %d logged one by one and %d counted warnings, want 0 and 1", clients, oneByOne, counted)
	}
}
