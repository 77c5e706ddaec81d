package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimiter/ratelimiter/internal/tlsfiles/testpki"
)

// TestMeasureListenerBounds measures a service binary's memory under
// held gRPC calls and idle connections. It runs only when
// RATELIMITER_MEASURE_BINARY names the binary; raise the file descriptor
// limit first (ulimit -n 65536):
//
//	go build -o /tmp/ratelimiter ./cmd/service
//	RATELIMITER_MEASURE_BINARY=/tmp/ratelimiter go test -run TestMeasureListenerBounds -v -timeout 30m ./cmd/service
//
// Each scenario starts a fresh process and reports its resident memory
// (VmRSS, and the peak VmHWM) and goroutines before and after.
func TestMeasureListenerBounds(t *testing.T) {
	bin := os.Getenv("RATELIMITER_MEASURE_BINARY")
	if bin == "" {
		t.Skip("set RATELIMITER_MEASURE_BINARY to a service binary to measure it")
	}
	scenarios := []struct {
		name string
		load func(t *testing.T, p *measured) string
	}{
		{"1,000 idle gRPC connections (preface and SETTINGS)", func(t *testing.T, p *measured) string {
			return idleGRPC(t, p.grpc, 1000)
		}},
		{"1,000 gRPC calls each holding 256 KiB of a 4 MiB message (10 connections)", func(t *testing.T, p *measured) string {
			return heldCalls(t, p.grpc, 10, 100, 4<<20, 256<<10)
		}},
		{"1,000 gRPC calls each holding all but 1 byte of a 64 KiB message (10 connections)", func(t *testing.T, p *measured) string {
			return heldCalls(t, p.grpc, 10, 100, 64<<10, 64<<10-1)
		}},
		{"10,000 idle HTTP keep-alive connections", func(t *testing.T, p *measured) string {
			return idleHTTP(t, p.http, 10_000)
		}},
		{"all at once: 1,000 idle gRPC connections, 1,000 calls holding 64 KiB, 10,000 idle HTTP connections", func(t *testing.T, p *measured) string {
			return idleGRPC(t, p.grpc, 1000) + "; " + heldCalls(t, p.grpc, 10, 100, 64<<10, 64<<10-1) + "; " + idleHTTP(t, p.http, 10_000)
		}},
	}
	if os.Getenv("RATELIMITER_MEASURE_TLS") != "" {
		// The binary serves TLS (it must have the TLS settings): idle
		// HTTP/2 and gRPC connections over it, below the default bounds.
		scenarios = []struct {
			name string
			load func(t *testing.T, p *measured) string
		}{
			{"2,000 idle HTTP/2 connections over TLS (one request answered on each)", func(t *testing.T, p *measured) string {
				return idleTLS(t, p.http, 2000, true)
			}},
			{"1,000 idle gRPC connections over TLS (handshake, preface and SETTINGS)", func(t *testing.T, p *measured) string {
				return idleTLS(t, p.grpc, 1000, false)
			}},
		}
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			p := startMeasured(t, bin)
			before := p.sample(t)
			note := sc.load(t, p)
			time.Sleep(3 * time.Second)
			after := p.sample(t)
			t.Logf("%s: RSS %d → %d MiB (peak %d MiB), goroutines %d → %d; %s",
				sc.name, before.rss>>20, after.rss>>20, after.hwm>>20, before.goroutines, after.goroutines, note)
		})
	}
}

// measured is a service process under measurement.
type measured struct {
	cmd        *exec.Cmd
	http, grpc string
	tls        bool // serves TLS, with a certificate no client verifies
}

func startMeasured(t *testing.T, bin string) *measured {
	t.Helper()
	p := &measured{http: "127.0.0.1:" + freePort(t), grpc: "127.0.0.1:" + freePort(t)}
	p.cmd = exec.Command(bin, "--listen", p.http, "--grpc-listen", p.grpc, "--log-level", "warn")
	p.cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	if os.Getenv("RATELIMITER_MEASURE_TLS") != "" {
		ca := testpki.NewCA(t, "measure")
		certFile, keyFile := ca.Server(t, "measure").Write(t, t.TempDir())
		p.cmd.Args = append(p.cmd.Args, "--tls-cert-file", certFile, "--tls-key-file", keyFile)
		p.tls = true
	}
	log, err := os.Create(t.TempDir() + "/log")
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { p.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-exited
		if b, _ := os.ReadFile(log.Name()); len(b) > 0 {
			t.Logf("service log (warnings):\n%.2000s", b)
		}
	})
	waitListening(t, p.http, p.cmd, exited, log.Name())
	waitListening(t, p.grpc, p.cmd, exited, log.Name())
	return p
}

type sample struct {
	rss, hwm   int64
	goroutines int
}

// sample reads the process's memory from /proc and its goroutines from
// /metrics.
func (p *measured) sample(t *testing.T) sample {
	t.Helper()
	var s sample
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "VmRSS:" || f[0] == "VmHWM:") {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			if f[0] == "VmRSS:" {
				s.rss = kb << 10
			} else {
				s.hwm = kb << 10
			}
		}
	}
	if p.tls {
		s.goroutines = int(scrapeTLS(t, "https://"+p.http+"/metrics"))
	} else {
		s.goroutines = int(scrape(t, "http://"+p.http+"/metrics")["go_goroutines"])
	}
	return s
}

// idleGRPC opens n connections to addr that send the HTTP/2 preface and
// SETTINGS, then nothing, and reports how many the server still holds.
func idleGRPC(t *testing.T, addr string, n int) string {
	t.Helper()
	var conns []net.Conn
	for range n {
		h := dialH2(t, addr)
		conns = append(conns, h.conn)
	}
	time.Sleep(time.Second)
	return fmt.Sprintf("%d of %d still open", stillOpen(conns), n)
}

// stillOpen counts the connections the server has not closed.
func stillOpen(conns []net.Conn) int {
	var open atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			// Drain what the server sent (SETTINGS, answers), then see
			// whether the connection is still there.
			c.SetReadDeadline(time.Now().Add(time.Second))
			_, err := io.Copy(io.Discard, c)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				open.Add(1)
			}
		})
	}
	wg.Wait()
	return int(open.Load())
}

// heldCalls opens conns connections to addr with streams calls each;
// every call announces a message of size bytes and sends send of them,
// then holds. It reports how many bytes the server took in and how the
// calls ended.
func heldCalls(t *testing.T, addr string, conns, streams, size, send int) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var sent atomic.Int64
	var mu sync.Mutex
	ended := map[string]int{}
	var wg sync.WaitGroup
	for range conns {
		tr := &http2.Transport{
			AllowHTTP: true, StrictMaxConcurrentStreams: true,
			DialTLSContext: func(ctx context.Context, network, a string, _ *tls.Config) (net.Conn, error) {
				return new(net.Dialer).DialContext(ctx, network, a)
			},
		}
		t.Cleanup(tr.CloseIdleConnections)
		for range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				prefix := make([]byte, 5)
				binary.BigEndian.PutUint32(prefix[1:], uint32(size))
				body := io.MultiReader(strings.NewReader(string(prefix)), &countingZeros{n: send, sent: &sent}, &blocked{ctx: ctx})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost,
					"http://"+addr+"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", body)
				req.Header.Set("Content-Type", "application/grpc")
				req.Header.Set("TE", "trailers")
				resp, err := tr.RoundTrip(req)
				outcome := "held"
				switch {
				case err != nil && ctx.Err() != nil:
				case err != nil:
					outcome = "error: " + err.Error()
				default:
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					outcome = "grpc-status " + resp.Trailer.Get("Grpc-Status") + resp.Header.Get("Grpc-Status")
				}
				mu.Lock()
				ended[outcome]++
				mu.Unlock()
			}()
		}
	}
	// Wait until the senders stop making progress.
	for last := int64(-1); ; {
		time.Sleep(2 * time.Second)
		if now := sent.Load(); now == last {
			break
		} else {
			last = now
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return fmt.Sprintf("%d MiB of messages sent; calls ended: %v (the rest held)", sent.Load()>>20, ended)
}

// countingZeros reads n zero bytes, counting them in sent.
type countingZeros struct {
	n    int
	sent *atomic.Int64
}

func (z *countingZeros) Read(p []byte) (int, error) {
	if z.n == 0 {
		return 0, io.EOF
	}
	k := min(len(p), z.n)
	clear(p[:k])
	z.n -= k
	z.sent.Add(int64(k))
	return k, nil
}

// blocked is a body that never ends until ctx does.
type blocked struct{ ctx context.Context }

func (b *blocked) Read([]byte) (int, error) {
	<-b.ctx.Done()
	return 0, b.ctx.Err()
}

// idleHTTP opens n connections to addr, sends one request on each and
// reads its answer, then leaves them idle; it reports how many the
// server still holds and whether /livez answers.
func idleHTTP(t *testing.T, addr string, n int) string {
	t.Helper()
	var conns []net.Conn
	failed := 0
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("after %d connections: %v", len(conns), err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			failed++
			continue
		}
		resp.Body.Close()
		conns = append(conns, c)
	}
	health := "answered"
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/livez"); err != nil {
		health = err.Error()
	} else {
		resp.Body.Close()
	}
	return fmt.Sprintf("%d of %d still open (%d closed before their answer); /livez then: %s", stillOpen(conns), n, failed, health)
}

// scrapeTLS reads go_goroutines from a /metrics over TLS, without
// verifying the certificate (the measurement's own).
func scrapeTLS(t *testing.T, url string) float64 {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// idleTLS opens n TLS connections to addr speaking HTTP/2; with request,
// each sends GET /livez and reads its answer. It then leaves them idle
// and reports how many the server still holds.
func idleTLS(t *testing.T, addr string, n int, request bool) string {
	t.Helper()
	var conns []net.Conn
	for range n {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatalf("after %d connections: %v", len(conns), err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, http2.ClientPreface)
		f := http2.NewFramer(c, bufio.NewReader(c))
		f.WriteSettings()
		if request {
			var hdr strings.Builder
			enc := hpack.NewEncoder(&hdr)
			for _, kv := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":path", "/livez"}, {":authority", "x"}} {
				enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
			}
			f.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte(hdr.String()), EndHeaders: true, EndStream: true})
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			for {
				fr, err := f.ReadFrame()
				if err != nil {
					t.Fatalf("connection %d: %v", len(conns), err)
				}
				if fr.Header().StreamID == 1 && fr.Header().Flags.Has(http2.FlagDataEndStream) {
					break
				}
				if s, ok := fr.(*http2.SettingsFrame); ok && !s.IsAck() {
					f.WriteSettingsAck()
				}
			}
			c.SetReadDeadline(time.Time{})
		}
		conns = append(conns, c)
	}
	time.Sleep(time.Second)
	return fmt.Sprintf("%d of %d still open", stillOpen(conns), n)
}
