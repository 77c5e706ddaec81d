package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// grpcAddr waits for the gRPC address the service whose logs are l logs.
func grpcAddr(t *testing.T, l *logs) string {
	t.Helper()
	select {
	case addr := <-l.grpc:
		return addr
	case <-time.After(30 * time.Second):
		t.Fatal("the service did not log a gRPC address")
	}
	return ""
}

// rawH2 is an HTTP/2 connection driven frame by frame, as an attacker
// would drive one: it can open a call and send part of its message.
type rawH2 struct {
	conn   net.Conn
	framer *http2.Framer
	next   uint32 // the next stream ID
}

// dialH2 opens an HTTP/2 connection to addr and sends the client preface
// and an empty SETTINGS frame.
func dialH2(t *testing.T, addr string) *rawH2 {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	f := http2.NewFramer(conn, bufio.NewReader(conn))
	if err := f.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return &rawH2{conn: conn, framer: f, next: 1}
}

// holdCall opens a ShouldRateLimit call and sends the first part bytes of
// a message of size bytes, leaving the rest, and the stream, open.
func (h *rawH2) holdCall(t *testing.T, size, part int) {
	t.Helper()
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{":authority", "ratelimiter"}, {"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	id := h.next
	h.next += 2
	if err := h.framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 5+part)
	binary.BigEndian.PutUint32(msg[1:5], uint32(size))
	if err := h.framer.WriteData(id, false, msg); err != nil {
		t.Fatal(err)
	}
}

// readUntil reads frames until want returns true for one, and reports
// whether it did before the connection ended or 20 seconds passed.
func (h *rawH2) readUntil(want func(http2.Frame) bool) (bool, error) {
	h.conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	defer h.conn.SetReadDeadline(time.Time{})
	for {
		f, err := h.framer.ReadFrame()
		if err != nil {
			return false, err
		}
		if want(f) {
			return true, nil
		}
	}
}

// bigRequest is a valid RLS request of about size bytes: 32 descriptors
// of one entry each.
func bigRequest(size int) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "web"}
	for range 32 {
		req.Descriptors = append(req.Descriptors, &commonv3.RateLimitDescriptor{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: strings.Repeat("a", min(size/32, 4000))}},
		})
	}
	return req
}

// A request message past --grpc-max-message-bytes is refused with
// RESOURCE_EXHAUSTED, and a request within it is answered.
func TestGRPCMessageBound(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	_, stderr, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--grpc-max-message-bytes", "16KiB"}, nil)
	rl := rlsv3.NewRateLimitServiceClient(dial(t, stderr))
	if _, err := rl.ShouldRateLimit(t.Context(), bigRequest(8<<10)); err != nil {
		t.Errorf("a request of 8 KiB: got %v, want an answer", err)
	}
	_, err := rl.ShouldRateLimit(t.Context(), bigRequest(100<<10))
	if got, want := status.Code(err), codes.ResourceExhausted; got != want {
		t.Errorf("a request of 100 KiB with a bound of 16 KiB: got %v (%v), want %v", got, err, want)
	}
}

// The server announces at most 100 streams a connection, and refuses a
// call past --grpc-max-streams in flight over all connections with
// RESOURCE_EXHAUSTED, until the calls that hold the bound end.
func TestGRPCStreamBounds(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	_, stderr, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--grpc-max-streams", "3"}, nil)
	addr := grpcAddr(t, stderr)
	h := dialH2(t, addr)
	var perConn uint32
	ok, err := h.readUntil(func(f http2.Frame) bool {
		s, isSettings := f.(*http2.SettingsFrame)
		if !isSettings || s.IsAck() {
			return false
		}
		perConn, _ = s.Value(http2.SettingMaxConcurrentStreams)
		return true
	})
	if !ok {
		t.Fatalf("no SETTINGS from the server: %v", err)
	}
	if perConn != grpcConnStreams {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS: got %d, want %d", perConn, grpcConnStreams)
	}

	// Three calls each hold part of a 60 KB message.
	for range 3 {
		h.holdCall(t, 60_000, 1000)
	}
	h.framer.WriteSettingsAck()
	g := grpcClient(t, addr)
	req := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}},
	}}
	// The held calls count once the server has read their headers, which
	// the client cannot see: wait for the refusal, up to 20 seconds.
	var last error
	for deadline := time.Now().Add(20 * time.Second); ; {
		_, last = g.ShouldRateLimit(t.Context(), req)
		if status.Code(last) == codes.ResourceExhausted || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, want := status.Code(last), codes.ResourceExhausted; got != want {
		t.Fatalf("a fourth call with 3 held and --grpc-max-streams 3: got %v (%v), want %v", got, last, want)
	}

	// The held calls end with their connection: calls are answered again.
	h.conn.Close()
	for deadline := time.Now().Add(20 * time.Second); ; {
		_, last = g.ShouldRateLimit(t.Context(), req)
		if last == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if last != nil {
		t.Errorf("a call after the held calls' connection closed: got %v, want an answer", last)
	}
	if !slicesContain(stderr.messages(), "gRPC call limit reached: refusing calls with RESOURCE_EXHAUSTED") {
		t.Errorf("logs %q: want the refusal reported", stderr.messages())
	}
}

// grpcClient returns a rate limit service client of the gRPC server at
// addr, over plain TCP.
func grpcClient(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// slicesContain reports whether msgs holds msg.
func slicesContain(msgs []string, msg string) bool {
	for _, m := range msgs {
		if m == msg {
			return true
		}
	}
	return false
}

// A gRPC connection without calls is closed after --grpc-idle-timeout,
// with GOAWAY.
func TestGRPCIdleConnectionIsClosed(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	_, stderr, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--grpc-idle-timeout", "1s"}, nil)
	h := dialH2(t, grpcAddr(t, stderr))
	goaway, err := h.readUntil(func(f http2.Frame) bool {
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			h.framer.WriteSettingsAck()
		}
		_, ok := f.(*http2.GoAwayFrame)
		return ok
	})
	if !goaway {
		t.Errorf("an idle connection, --grpc-idle-timeout 1s: no GOAWAY within 20s (read: %v)", err)
	}
}

// At --max-connections, a new connection closes an idle kept-alive one
// to make room: the count holds, and health checks are still answered.
func TestHTTPConnectionBound(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	const max, idle = 5, 20
	base, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--max-connections", "5"}, nil)
	addr := strings.TrimPrefix(base, "http://")
	var conns []net.Conn
	for i := range idle {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// One request, answered, and the connection kept alive: it waits
		// for the next request.
		if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			// Closed to make room before it was answered: only possible
			// past the bound.
			if i < max {
				t.Fatalf("connection %d: %v", i, err)
			}
			continue
		}
		resp.Body.Close()
		conns = append(conns, c)
	}
	resp, err := http.Get(base + "/livez")
	if err != nil {
		t.Fatalf("GET /livez with %d idle connections at a bound of %d: %v", idle, max, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /livez at the bound: got %d, want 200", resp.StatusCode)
	}
	// All but the newest few of the idle connections were closed.
	open := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			open++
		}
	}
	if open >= max {
		t.Errorf("idle connections still open after the bound of %d was passed: got %d, want fewer than %d", max, open, max)
	}
}

// At --grpc-max-connections, a new connection closes the one that has
// sent nothing for longest.
func TestGRPCConnectionBound(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	_, stderr, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--grpc-max-connections", "2"}, nil)
	addr := grpcAddr(t, stderr)
	first := dialH2(t, addr)
	if ok, err := first.readUntil(func(f http2.Frame) bool { _, ok := f.(*http2.SettingsFrame); return ok }); !ok {
		t.Fatalf("first connection: no SETTINGS: %v", err)
	}
	dialH2(t, addr)
	dialH2(t, addr)
	// The first connection ends: its reads end in EOF (or a reset)
	// rather than the 20 seconds' deadline.
	_, err := first.readUntil(func(http2.Frame) bool { return false })
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("the first of 3 connections with --grpc-max-connections 2: got %v, want it closed", err)
	}
	// A call on a new connection is answered.
	g := grpcClient(t, addr)
	if _, err := g.ShouldRateLimit(t.Context(), bigRequest(100)); err != nil {
		t.Errorf("a call at the bound: got %v, want an answer", err)
	}
}
