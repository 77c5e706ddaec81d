package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ratelimiter/ratelimiter/internal/config"
	"github.com/ratelimiter/ratelimiter/internal/connlimit"
	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/tlsfiles"
)

// Bounds of the gRPC server that are not settings. Envoy keeps a few
// HTTP/2 connections to its rate limit service and multiplexes its calls
// over them, each call a message of a few hundred bytes.
const (
	// grpcConnStreams is the most calls in flight on one connection, the
	// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS the server announces (100,
	// as RFC 9113 recommends at least); a client waits for a stream to
	// end before it opens another.
	grpcConnStreams = 100
	// grpcMaxHeaderListSize bounds a call's metadata, as --max-header-bytes
	// bounds an HTTP request's headers by default (grpc-go's own bound is
	// 16 MiB).
	grpcMaxHeaderListSize = 16 << 10
	// grpcHandshakeTimeout is the time a new connection has to finish its
	// TLS handshake, if any, and HTTP/2 preface; grpc-go's default is 120s.
	grpcHandshakeTimeout = 10 * time.Second
	// grpcPingMinTime is the shortest interval between a client's
	// keepalive pings, with or without calls in flight; a client pinging
	// more often is sent GOAWAY. Envoy's connection_keepalive intervals
	// are tens of seconds.
	grpcPingMinTime = 10 * time.Second
	// grpcPingTime and grpcPingTimeout: a connection silent for
	// grpcPingTime is pinged, and closed if the ping is not answered
	// within grpcPingTimeout, so that a vanished peer's connection does
	// not hold its place.
	grpcPingTime    = time.Minute
	grpcPingTimeout = 20 * time.Second
	// grpcStreamWindow and grpcConnWindow are the HTTP/2 flow-control
	// windows, fixed: grpc-go otherwise grows them up to 16 MiB a
	// connection from its estimate of the bandwidth.
	grpcStreamWindow = 64 << 10
	grpcConnWindow   = 1 << 20
	// grpcBufferBytes is the size of each connection's read and write
	// buffers (grpc-go's default is 32 KiB each): RLS messages are small,
	// and idle connections are many.
	grpcBufferBytes = 16 << 10
	// httpConnStreams is the most requests in flight on one HTTP/2
	// connection of the HTTP listener (Go's default is 250).
	httpConnStreams = 100
	// httpWindow is the HTTP/2 flow-control window of a connection and
	// of a stream of the HTTP listener, the most bytes of request bodies
	// it buffers ahead of its handlers (Go's default is 1 MiB each).
	httpWindow = 64 << 10
)

// boundHTTP2 answers 503, with a problem, an HTTP/2 request that arrives
// while max are in flight, except the health checks (GET /livez and
// /readyz), which have no body and must be answered under load.
func boundHTTP2(next http.Handler, max int64, logger *slog.Logger) http.Handler {
	var inFlight atomic.Int64
	refused := &refusals{logger: logger, now: time.Now, msg: "HTTP/2 request limit reached: answering 503", attrs: []any{"max_requests", max}}
	busy, _ := json.Marshal(gen.Problem{
		Type: "about:blank", Title: http.StatusText(http.StatusServiceUnavailable), Status: http.StatusServiceUnavailable,
		Detail: ptr("The service has too many requests in flight. Retry in a second."),
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor < 2 || r.Method == http.MethodGet && (r.URL.Path == "/livez" || r.URL.Path == "/readyz") {
			next.ServeHTTP(w, r)
			return
		}
		defer inFlight.Add(-1)
		if inFlight.Add(1) > max {
			refused.add()
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write(busy)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func ptr[T any](v T) *T { return &v }

// grpcBounds returns the gRPC server options that bound what a client can
// make the server hold: message size, streams per connection and over
// all connections, metadata, flow-control windows, buffers, the handshake,
// and idle connections.
func grpcBounds(l config.Listeners, logger *slog.Logger) []grpc.ServerOption {
	calls := &callLimit{max: int64(l.GRPCMaxStreams), refused: &refusals{
		logger: logger, now: time.Now, msg: "gRPC call limit reached: refusing calls with RESOURCE_EXHAUSTED",
		attrs: []any{"max_streams", l.GRPCMaxStreams},
	}}
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(l.GRPCMaxMessageBytes),
		grpc.MaxConcurrentStreams(grpcConnStreams),
		grpc.MaxHeaderListSize(grpcMaxHeaderListSize),
		grpc.ConnectionTimeout(grpcHandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcPingMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: l.GRPCIdleTimeout, Time: grpcPingTime, Timeout: grpcPingTimeout,
		}),
		grpc.StaticStreamWindowSize(grpcStreamWindow),
		grpc.StaticConnWindowSize(grpcConnWindow),
		grpc.ReadBufferSize(grpcBufferBytes),
		grpc.WriteBufferSize(grpcBufferBytes),
		grpc.InTapHandle(calls.tap),
	}
}

// callLimit bounds the gRPC calls in flight over all connections. A call
// counts from its headers until its stream ends, however it ends, so that
// calls whose message never completes count too.
type callLimit struct {
	max     int64
	open    atomic.Int64
	refused *refusals
}

// tap admits a new call, or refuses it with RESOURCE_EXHAUSTED when max
// are in flight. It runs before the call's message is read.
func (c *callLimit) tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	if c.open.Add(1) > c.max {
		c.open.Add(-1)
		c.refused.add()
		return nil, status.Error(codes.ResourceExhausted, "too many calls in flight; retry later")
	}
	// grpc-go cancels a stream's context when the stream ends.
	context.AfterFunc(ctx, func() { c.open.Add(-1) })
	return ctx, nil
}

// refusals counts the requests a bound refuses and logs them, at most
// once every 10 seconds, with how many since the last record.
type refusals struct {
	logger *slog.Logger
	now    func() time.Time
	msg    string
	attrs  []any

	mu     sync.Mutex
	logged time.Time
	count  int
}

func (r *refusals) add() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.count++
	if now := r.now(); now.Sub(r.logged) >= 10*time.Second {
		r.logger.Warn(r.msg, append(r.attrs, "refused", r.count)...)
		r.logged, r.count = now, 0
	}
}

// newErrorLog returns the HTTP server's error log: its lines as warnings,
// but for the TLS handshakes that fail (a scanner, a plain-text client, a
// client without a certificate), which are counted and logged at most
// once every 10 seconds, so that they cannot flood the log.
func newErrorLog(logger *slog.Logger) *log.Logger {
	return log.New(&errorLog{
		out:        slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		handshakes: &refusals{logger: logger, now: time.Now, msg: "TLS handshakes failed", attrs: []any{"listener", "http"}},
	}, "", 0)
}

// errorLog is the writer of newErrorLog's logger: one line per Write.
type errorLog struct {
	out        *log.Logger
	handshakes *refusals
}

func (e *errorLog) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("http: TLS handshake error")) {
		e.handshakes.add()
	} else {
		e.out.Print(string(p))
	}
	return len(p), nil
}

// listeners is the service's listening side: the TLS files, when TLS is
// on, and the connection bounds of both listeners.
type listeners struct {
	cfg    config.Listeners
	tls    *tlsfiles.Files // nil without TLS
	logger *slog.Logger
}

// newListeners reads the TLS files, if any.
func newListeners(cfg config.Listeners, logger *slog.Logger) (*listeners, error) {
	l := &listeners{cfg: cfg, logger: logger}
	if cfg.TLSCertFile != "" {
		f, err := tlsfiles.Load(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSClientCAFile, logger)
		if err != nil {
			return nil, &configError{err}
		}
		l.tls = f
	}
	return l, nil
}

// http bounds ln to the HTTP listener's connections and sets up srv to
// serve it, with TLS when it is on; serve then serves srv on the listener
// it returns.
func (l *listeners) http(srv *http.Server, ln net.Listener) (bounded net.Listener, serve func() error) {
	capped := connlimit.New(ln, l.cfg.MaxConnections, "http", l.logger)
	// A connection serving a request is closed to make room only when
	// every one is.
	srv.ConnState = func(c net.Conn, st http.ConnState) { capped.SetBusy(c, st == http.StateActive) }
	// HTTP/1 holds one request a connection; HTTP/2 would multiply the
	// requests, and their bodies, by its streams: they are bounded over
	// all connections as HTTP/1's are, and the bytes a connection buffers
	// ahead of its handlers to one window.
	srv.HTTP2 = &http.HTTP2Config{
		MaxConcurrentStreams:          httpConnStreams,
		MaxReceiveBufferPerConnection: httpWindow,
		MaxReceiveBufferPerStream:     httpWindow,
	}
	srv.Handler = boundHTTP2(srv.Handler, int64(l.cfg.MaxConnections), l.logger)
	if l.tls == nil {
		return capped, func() error { return srv.Serve(capped) }
	}
	srv.TLSConfig = l.tls.ServerConfig()
	return capped, func() error { return srv.ServeTLS(capped, "", "") }
}

// grpc bounds ln to the gRPC listener's connections and returns the
// server options of the bounds, and of TLS when it is on.
func (l *listeners) grpc(ln net.Listener) (net.Listener, []grpc.ServerOption) {
	opts := grpcBounds(l.cfg, l.logger)
	if l.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(l.tls.ServerConfig())))
	}
	return connlimit.New(ln, l.cfg.GRPCMaxConnections, "grpc", l.logger), opts
}
