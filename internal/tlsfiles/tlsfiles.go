// Package tlsfiles serves TLS from PEM files that may be replaced while
// the service runs, as cert-manager and Kubernetes Secret volumes replace
// them: a handshake uses the certificate the files hold, re-read when
// their contents change, checked at most once a second.
package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// CheckEvery is the shortest time between two reads of the files.
const CheckEvery = time.Second

// Files is a certificate and key, and optionally a bundle of client
// certificate authorities, read from files and re-read when they change.
// A set of files that does not load (a key that does not match its
// certificate, a half-written file) is logged and the previous one kept.
// Its methods are safe for concurrent use.
type Files struct {
	certFile, keyFile, caFile string
	logger                    *slog.Logger
	now                       func() time.Time

	loaded atomic.Pointer[loaded]

	mu      sync.Mutex // held while checking the files
	checked time.Time
	read    [3][]byte // the files' contents at the last check, loaded or not
}

// loaded is what one read of the files gave.
type loaded struct {
	cert *tls.Certificate
	pool *x509.CertPool // nil without a client CA file
}

// Load reads the certificate chain in certFile, its private key in
// keyFile and, when caFile is not empty, the certificate authorities that
// client certificates must chain to, and returns them, or why they do not
// load. logger receives a record for each later change of the files.
func Load(certFile, keyFile, caFile string, logger *slog.Logger) (*Files, error) {
	f := &Files{certFile: certFile, keyFile: keyFile, caFile: caFile, logger: logger, now: time.Now}
	contents, err := f.readFiles()
	if err != nil {
		return nil, err
	}
	l, err := f.parse(contents)
	if err != nil {
		return nil, err
	}
	f.loaded.Store(l)
	f.read, f.checked = contents, f.now()
	return f, nil
}

// ServerConfig returns the TLS configuration of a listener served from
// the files: TLS 1.2 or later, the files' current certificate at each
// handshake and, with a client CA file, a client certificate required and
// verified against its current bundle. nextProtos are the ALPN protocols
// the listener speaks (the HTTP and gRPC servers add their own).
func (f *Files) ServerConfig(nextProtos ...string) *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			f.check()
			return f.loaded.Load().cert, nil
		},
	}
	if f.caFile != "" {
		// crypto/tls verifies against a fixed ClientCAs; this verifies
		// the same way against the bundle the files hold now, on resumed
		// sessions too (VerifyPeerCertificate is skipped on those), so
		// that a CA taken out of the bundle admits no one.
		c.ClientAuth = tls.RequireAnyClientCert
		c.VerifyConnection = func(cs tls.ConnectionState) error { return f.verifyClient(cs.PeerCertificates) }
	}
	return c
}

// Certificate returns the certificate handshakes use now.
func (f *Files) Certificate() *tls.Certificate {
	f.check()
	return f.loaded.Load().cert
}

// verifyClient verifies a client's chain against the client CA bundle,
// for client authentication, as crypto/tls does with ClientCAs.
func (f *Files) verifyClient(certs []*x509.Certificate) error {
	if len(certs) == 0 {
		return errors.New("tlsfiles: the client sent no certificate")
	}
	opts := x509.VerifyOptions{
		Roots:         f.loaded.Load().pool,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return fmt.Errorf("tlsfiles: client certificate: %w", err)
	}
	return nil
}

// check re-reads the files if CheckEvery has passed since the last read,
// and loads them if their contents changed.
func (f *Files) check() {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if now.Sub(f.checked) < CheckEvery {
		return
	}
	f.checked = now
	contents, err := f.readFiles()
	if err != nil {
		f.logger.Error("TLS files unreadable: serving the previous certificate", "error", err)
		return
	}
	if bytes.Equal(contents[0], f.read[0]) && bytes.Equal(contents[1], f.read[1]) && bytes.Equal(contents[2], f.read[2]) {
		return
	}
	f.read = contents
	l, err := f.parse(contents)
	if err != nil {
		f.logger.Error("TLS files changed but do not load: serving the previous certificate", "error", err)
		return
	}
	f.loaded.Store(l)
	f.logger.Info("TLS files reloaded", "cert_file", f.certFile, "subject", l.cert.Leaf.Subject.String(),
		"not_after", l.cert.Leaf.NotAfter, "client_ca_file", f.caFile)
}

// readFiles returns the contents of the certificate, key and CA files.
func (f *Files) readFiles() ([3][]byte, error) {
	var contents [3][]byte
	for i, path := range []string{f.certFile, f.keyFile, f.caFile} {
		if path == "" {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return contents, fmt.Errorf("tlsfiles: %w", err)
		}
		contents[i] = b
	}
	return contents, nil
}

// parse loads the certificate, key and CA bundle of contents.
func (f *Files) parse(contents [3][]byte) (*loaded, error) {
	cert, err := tls.X509KeyPair(contents[0], contents[1])
	if err != nil {
		return nil, fmt.Errorf("tlsfiles: certificate %s and key %s: %w", f.certFile, f.keyFile, err)
	}
	l := &loaded{cert: &cert}
	if f.caFile != "" {
		l.pool = x509.NewCertPool()
		if !l.pool.AppendCertsFromPEM(contents[2]) {
			return nil, fmt.Errorf("tlsfiles: client CA file %s holds no PEM certificate", f.caFile)
		}
	}
	return l, nil
}
