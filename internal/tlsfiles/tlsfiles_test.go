package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/tlsfiles/testpki"
)

// The certificate served follows the files: a change is read at the first
// handshake a second or more after the last read, and a pair that does
// not load leaves the previous one in place, logged.
func TestReload(t *testing.T) {
	ca := testpki.NewCA(t, "test CA")
	dir := t.TempDir()
	first := ca.Server(t, "first")
	certFile, keyFile := first.Write(t, dir)
	var logs bytes.Buffer
	f, err := Load(certFile, keyFile, "", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	f.now = func() time.Time { return now }
	f.checked = now
	served := func() string { return f.Certificate().Leaf.Subject.CommonName }

	second := ca.Server(t, "second")
	second.Write(t, dir)
	if got, want := served(), "first"; got != want {
		t.Errorf("before a second has passed: got %q, want %q", got, want)
	}
	now = now.Add(CheckEvery)
	if got, want := served(), "second"; got != want {
		t.Errorf("a second later: got %q, want %q", got, want)
	}

	// A certificate whose key is another's: refused, the second kept.
	third := ca.Server(t, "third")
	testpki.WriteFile(t, certFile, third.CertPEM)
	now = now.Add(CheckEvery)
	if got, want := served(), "second"; got != want {
		t.Errorf("after a mismatched pair: got %q, want %q", got, want)
	}
	if !strings.Contains(logs.String(), "do not load") {
		t.Errorf("logs %q: want the mismatched pair reported", logs.String())
	}
	// Its key arrives: the pair now loads.
	testpki.WriteFile(t, keyFile, third.KeyPEM)
	now = now.Add(CheckEvery)
	if got, want := served(), "third"; got != want {
		t.Errorf("once the key matches: got %q, want %q", got, want)
	}
}

func TestLoadRefuses(t *testing.T) {
	ca := testpki.NewCA(t, "test CA")
	dir := t.TempDir()
	a, b := ca.Server(t, "a"), ca.Server(t, "b")
	certFile, keyFile := a.Write(t, dir)
	otherKey := filepath.Join(dir, "other-key.pem")
	testpki.WriteFile(t, otherKey, b.KeyPEM)
	notPEM := filepath.Join(dir, "ca.pem")
	testpki.WriteFile(t, notPEM, []byte("not a certificate"))
	tests := []struct {
		name                      string
		certFile, keyFile, caFile string
		want                      string
	}{
		{name: "missing certificate", certFile: filepath.Join(dir, "none.pem"), keyFile: keyFile, want: "no such file"},
		{name: "key of another certificate", certFile: certFile, keyFile: otherKey, want: "private key does not match"},
		{name: "CA file without a certificate", certFile: certFile, keyFile: keyFile, caFile: notPEM, want: "no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.certFile, tt.keyFile, tt.caFile, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// With a client CA file, a client must present a certificate that chains
// to it.
func TestClientCertificates(t *testing.T) {
	ca, other := testpki.NewCA(t, "clients"), testpki.NewCA(t, "another CA")
	dir := t.TempDir()
	certFile, keyFile := ca.Server(t, "server").Write(t, dir)
	caFile := filepath.Join(dir, "clients.pem")
	testpki.WriteFile(t, caFile, ca.PEM)
	f, err := Load(certFile, keyFile, caFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	pair := func(p testpki.Pair) []tls.Certificate {
		c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{c}
	}
	tests := []struct {
		name   string
		certs  []tls.Certificate
		wantOK bool
	}{
		{name: "from the client CA", certs: pair(ca.Client(t, "envoy")), wantOK: true},
		{name: "none"},
		{name: "from another CA", certs: pair(other.Client(t, "mallory"))},
		{name: "a server certificate of the client CA", certs: pair(ca.Server(t, "not a client"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc, cc := net.Pipe()
			defer sc.Close()
			defer cc.Close()
			server := tls.Server(sc, f.ServerConfig())
			errs := make(chan error, 1)
			go func() { errs <- server.Handshake() }()
			client := tls.Client(cc, &tls.Config{RootCAs: roots, ServerName: "localhost", Certificates: tt.certs})
			// The client reads on after its handshake, so that the server's
			// alert, if any, does not block on the unbuffered pipe.
			go func() {
				if client.Handshake() == nil {
					io.Copy(io.Discard, client)
				}
			}()
			// TLS 1.3 clients finish before the server has checked them:
			// the server's side tells.
			err := <-errs
			if got := err == nil; got != tt.wantOK {
				t.Errorf("server handshake: got error %v, want success %v", err, tt.wantOK)
			}
		})
	}
}

// A client CA taken out of the bundle admits none of its clients, not
// even on a session resumed from before the change.
func TestRemovedClientCARefusesResumedSessions(t *testing.T) {
	ca, other := testpki.NewCA(t, "clients"), testpki.NewCA(t, "another CA")
	dir := t.TempDir()
	certFile, keyFile := ca.Server(t, "server").Write(t, dir)
	caFile := filepath.Join(dir, "clients.pem")
	testpki.WriteFile(t, caFile, ca.PEM)
	f, err := Load(certFile, keyFile, caFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	f.now = func() time.Time { return now }
	f.checked = now
	server := f.ServerConfig()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	client := &tls.Config{
		RootCAs: roots, ServerName: "localhost", Certificates: []tls.Certificate{keyPairOf(t, ca.Client(t, "envoy"))},
		ClientSessionCache: tls.NewLRUClientSessionCache(1),
	}
	// connect handshakes once and has the client read the server's byte,
	// which takes in the session ticket sent before it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	connect := func() (resumed bool, serverErr error) {
		cc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		sc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		errs := make(chan error, 1)
		go func() {
			s := tls.Server(sc, server)
			err := s.Handshake()
			if err == nil {
				_, err = s.Write([]byte{1})
			}
			errs <- err
		}()
		c := tls.Client(cc, client)
		read := make(chan struct{})
		go func() {
			defer close(read)
			if c.Handshake() == nil {
				c.Read(make([]byte, 1))
			}
		}()
		err = <-errs
		<-read
		return c.ConnectionState().DidResume, err
	}
	if _, err := connect(); err != nil {
		t.Fatalf("first connection: %v", err)
	}
	if resumed, err := connect(); err != nil || !resumed {
		t.Fatalf("second connection: resumed %v, error %v; want a resumed session", resumed, err)
	}
	testpki.WriteFile(t, caFile, other.PEM)
	now = now.Add(CheckEvery)
	f.Certificate() // the check a handshake makes
	if _, err := connect(); err == nil {
		t.Errorf("a resumed session of a client of a CA taken out of the bundle: admitted, want refused")
	}
}

func keyPairOf(t *testing.T, p testpki.Pair) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
