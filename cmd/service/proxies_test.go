package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goccy/go-yaml"
)

// The proxies' tests run nginx, Caddy and HAProxy, from Debian's packages,
// as processes on loopback in front of a trivial upstream, with the
// service as their auth service, configured by the files of
// examples/forward-auth with only their addresses changed. Clients
// connect from addresses of their own (127.0.0.2, 127.0.0.3, ...: Linux
// routes all of 127/8 to the loopback), so that the proxy sees each as a
// client apart; the proxies reach the service from 127.0.0.1, its one
// trusted proxy.

// exampleDir holds the configurations under test.
const exampleDir = "../../examples/forward-auth"

// Addresses the example files use, replaced by the test's.
const (
	exampleService  = "127.0.0.1:8080"
	exampleUpstream = "127.0.0.1:3000"
	exampleListen   = "8000"
)

// proxy is one reverse proxy under test.
type proxy struct {
	name string
	bin  string // its executable, looked up on PATH
	// denyStatus is what the service must answer a denial with for it.
	denyStatus int
	// allowedHeaders tells that its example gives the client the
	// RateLimit headers of an allowed request too (Caddy's copies them
	// onto the request it forwards only).
	allowedHeaders bool
	// start writes its configuration into dir and starts it, listening on
	// port, asking service, forwarding to upstream.
	start func(t *testing.T, bin, dir, port, service, upstream string) *exec.Cmd
}

// example reads an example file with the test's addresses in place of the
// example's.
func example(t *testing.T, name, port, service, upstream string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(exampleDir, name))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.NewReplacer(exampleService, service, exampleUpstream, upstream).Replace(string(b))
	s = strings.ReplaceAll(s, "listen "+exampleListen+";", "listen 127.0.0.1:"+port+";")
	s = strings.ReplaceAll(s, ":"+exampleListen+" {", "http://127.0.0.1:"+port+" {")
	return strings.ReplaceAll(s, "bind :"+exampleListen, "bind 127.0.0.1:"+port)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

var proxies = []proxy{
	{name: "nginx", bin: "nginx", denyStatus: http.StatusForbidden, allowedHeaders: true,
		start: func(t *testing.T, bin, dir, port, service, upstream string) *exec.Cmd {
			write(t, filepath.Join(dir, "app.conf"), example(t, "nginx.conf", port, service, upstream))
			temp := func(name string) string { return filepath.Join(dir, name) }
			write(t, temp("nginx.conf"), fmt.Sprintf(`worker_processes 1;
error_log %s warn;
pid %s;
events { worker_connections 512; }
http {
    access_log off;
    client_body_buffer_size 1m;
    client_body_temp_path %s;
    proxy_temp_path %s;
    fastcgi_temp_path %s;
    uwsgi_temp_path %s;
    scgi_temp_path %s;
    include %s;
}
`, temp("error.log"), temp("nginx.pid"), temp("body"), temp("proxy"), temp("fastcgi"), temp("uwsgi"), temp("scgi"), temp("app.conf")))
			return exec.Command(bin, "-p", dir, "-c", temp("nginx.conf"), "-g", "daemon off;")
		}},
	{name: "Caddy", bin: "caddy", denyStatus: http.StatusTooManyRequests,
		start: func(t *testing.T, bin, dir, port, service, upstream string) *exec.Cmd {
			// No admin endpoint: it would listen on a fixed port.
			write(t, filepath.Join(dir, "Caddyfile"), "{\n\tadmin off\n}\n\n"+example(t, "Caddyfile", port, service, upstream))
			cmd := exec.Command(bin, "run", "--config", filepath.Join(dir, "Caddyfile"), "--adapter", "caddyfile")
			cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
			return cmd
		}},
	{name: "HAProxy", bin: "haproxy", denyStatus: http.StatusTooManyRequests, allowedHeaders: true,
		start: func(t *testing.T, bin, dir, port, service, upstream string) *exec.Cmd {
			lua := filepath.Join(dir, "ratelimit.lua")
			write(t, lua, example(t, "ratelimit.lua", port, service, upstream))
			cfg := strings.ReplaceAll(example(t, "haproxy.cfg", port, service, upstream), "/etc/haproxy/ratelimit.lua", lua)
			write(t, filepath.Join(dir, "haproxy.cfg"), cfg)
			return exec.Command(bin, "-db", "-f", filepath.Join(dir, "haproxy.cfg"))
		}},
}

// requireTool returns the path of bin, or skips t with a loud message, or
// fails it under CI=true, as the Redis tests do without Docker.
func requireTool(t *testing.T, bin string) string {
	t.Helper()
	path, err := exec.LookPath(bin)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("%s is not installed (Debian: apt-get install nginx caddy haproxy): the real-proxy tests need it", bin)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip("WARNING: skipped: " + msg)
	return ""
}

// freePort returns a loopback port free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// upstream is the application behind the proxy: it counts the requests
// that reach it, by the client address the proxy forwarded, and keeps the
// bytes of every request head it got, whether or not Go's server, which
// refuses what lenient upstreams serve (an escape that is no escape),
// accepts them.
type upstream struct {
	mu   sync.Mutex
	seen map[string]int
	raw  []byte
	srv  *http.Server
	addr string
}

// maxUpstreamRaw bounds what an upstream keeps of the bytes it read.
const maxUpstreamRaw = 1 << 20

// recordingListener hands out connections that append what they read to
// an upstream's raw bytes.
type recordingListener struct {
	net.Listener
	u *upstream
}

func (l recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return recordingConn{c, l.u}, nil
}

type recordingConn struct {
	net.Conn
	u *upstream
}

func (c recordingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.u.mu.Lock()
	if len(c.u.raw)+n <= maxUpstreamRaw {
		c.u.raw = append(c.u.raw, b[:n]...)
	}
	c.u.mu.Unlock()
	return n, err
}

// reached reports whether a request forwarded for client reached u,
// served or not: one whose X-Forwarded-For ends with it.
func (u *upstream) reached(client string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for line := range strings.SplitSeq(string(u.raw), "\r\n") {
		name, value, ok := strings.Cut(line, ":")
		if ok && strings.EqualFold(name, "X-Forwarded-For") {
			parts := strings.Split(value, ",")
			if strings.TrimSpace(parts[len(parts)-1]) == client {
				return true
			}
		}
	}
	return false
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{seen: make(map[string]int)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = l.Addr().String()
	u.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		xff := r.Header.Values("X-Forwarded-For")
		client := "?"
		if len(xff) > 0 {
			parts := strings.Split(xff[len(xff)-1], ",")
			client = strings.TrimSpace(parts[len(parts)-1])
		}
		u.mu.Lock()
		u.seen[client]++
		u.mu.Unlock()
		_, _ = io.WriteString(w, "hello\n")
	})}
	go u.srv.Serve(recordingListener{l, u})
	t.Cleanup(func() { u.srv.Close() })
	return u
}

func (u *upstream) count(client string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[client]
}

// clientFrom is an HTTP client whose connections leave from the loopback
// address ip.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{
		Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
		Timeout:   10 * time.Second,
	}
}

// absoluteFrom is clientFrom(ip) writing the whole URL in its request
// lines, as a client of a forward proxy does ("POST http://host/login
// HTTP/1.1"), which a reverse proxy accepts too.
func absoluteFrom(ip string) *http.Client {
	c := clientFrom(ip)
	c.Transport.(*http.Transport).Proxy = func(r *http.Request) (*url.URL, error) {
		return &url.URL{Scheme: "http", Host: r.URL.Host}, nil
	}
	return c
}

// answer is what a client got through the proxy.
type answer struct {
	status            int
	retryAfter        string
	rateLimit, policy string
	body              string
}

// send sends a request through c, a POST with a body of 100 KB, and
// returns what came back.
func send(t *testing.T, c *http.Client, method, url string, header ...string) answer {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		// A body the proxy may or may not pass on: the service ignores it.
		body = strings.NewReader(strings.Repeat("x", 100<<10))
	}
	return sendBody(t, c, method, url, body, header...)
}

// sendBody is send with the body body, or none when it is nil. A request
// to be denied is sent without one: HAProxy answers a denial before it
// has read the body and closes the connection, and a client still
// writing a large body then gets a broken pipe, not the answer.
func sendBody(t *testing.T, c *http.Client, method, url string, body io.Reader, header ...string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, retryAfter: res.Header.Get("Retry-After"),
		rateLimit: res.Header.Get("RateLimit"), policy: res.Header.Get("RateLimit-Policy"), body: string(b)}
}

// waitListening waits until something accepts connections at addr,
// failing when the command cmd ran exits first (exited is closed once its
// Wait returns, which alone reads its state).
func waitListening(t *testing.T, addr string, cmd *exec.Cmd, exited <-chan struct{}, log string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
		default:
			if time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
				continue
			}
		}
		b, _ := os.ReadFile(log)
		t.Fatalf("%s did not listen on %s: %v\n%s", cmd.Path, addr, err, b)
	}
}

// exampleConfig is examples/forward-auth/ratelimiter.yaml with the deny
// status p needs.
func exampleConfig(t *testing.T, p proxy) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(exampleDir, "ratelimiter.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Replace(string(b), "deny_status: 429", "deny_status: "+strconv.Itoa(p.denyStatus), 1)
}

// behind starts the service, configured by conf and trusting 127.0.0.1,
// and p in front of it and of an upstream, and returns the service's base
// URL, the proxy's and the upstream.
func behind(t *testing.T, p proxy, conf string) (base, url string, up *upstream) {
	t.Helper()
	bin := requireTool(t, p.bin)
	dir := t.TempDir()
	base, _, _, _ = start(t, []string{"--listen", "127.0.0.1:0", "--grpc-listen", "", "--trusted-proxies", "127.0.0.1"},
		map[string]string{"RATELIMITER_CONFIG": configFile(t, conf)})
	service := strings.TrimPrefix(base, "http://")
	up = newUpstream(t)
	port := freePort(t)
	cmd := p.start(t, bin, dir, port, service, up.addr)
	logPath := filepath.Join(dir, "proxy.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A process group of its own, killed whole: nginx's workers outlive a
	// killed master.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		logFile.Close()
	})
	waitListening(t, "127.0.0.1:"+port, cmd, exited, logPath)
	return base, "http://127.0.0.1:" + port, up
}

// TestForwardAuthBehindProxies: through each proxy, a client gets its
// limit of 5 requests (with the RateLimit headers, where the example
// gives them), then 429 with Retry-After from the proxy itself;
// another client behind the same proxy is limited apart; a client that
// forges X-Forwarded-For, Forwarded or many addresses is still limited as
// itself, and cannot spend another client's limit; the upstream sees
// exactly the requests that were allowed; and what the proxy forwards of
// absurd requests (a 10 KB URI, an unknown method, a body) gets a clear
// answer and charges only the client who sent it.
func TestForwardAuthBehindProxies(t *testing.T) {
	for _, p := range proxies {
		t.Run(p.name, func(t *testing.T) {
			base, url, up := behind(t, p, exampleConfig(t, p))

			alice, bob, mallory := clientFrom("127.0.0.2"), clientFrom("127.0.0.3"), clientFrom("127.0.0.4")
			for i := range 5 {
				a := send(t, alice, http.MethodGet, url+"/page")
				if a.status != http.StatusOK || a.body != "hello\n" {
					t.Fatalf("alice's request %d: got %d %q, want 200 from the upstream", i+1, a.status, a.body)
				}
				want := ""
				if p.allowedHeaders {
					want = fmt.Sprintf(`"per-ip";r=%d;`, 4-i)
				}
				if !strings.HasPrefix(a.rateLimit, want) || want == "" && a.rateLimit != "" {
					t.Errorf("alice's request %d: RateLimit %q, want it to start %q", i+1, a.rateLimit, want)
				}
			}
			denied := send(t, alice, http.MethodGet, url+"/page")
			if denied.status != http.StatusTooManyRequests {
				t.Fatalf("alice's 6th request: got %d %q, want 429", denied.status, denied.body)
			}
			if s, err := strconv.Atoi(denied.retryAfter); err != nil || s < 1 || s > 12 {
				t.Errorf("Retry-After: got %q, want 1 to 12 seconds (a permit every 12 s)", denied.retryAfter)
			}
			if !strings.Contains(denied.rateLimit, `"per-ip";r=0`) {
				t.Errorf("RateLimit on the denial: got %q, want per-ip with nothing left", denied.rateLimit)
			}
			// Forged forwarding headers: alice is alice.
			for _, forged := range [][]string{
				{"X-Forwarded-For", "198.51.100.9"},
				{"X-Forwarded-For", "127.0.0.3"},
				{"Forwarded", "for=198.51.100.9"},
				{"X-Forwarded-For", strings.Repeat("198.51.100.1, ", 200) + "198.51.100.2"},
				{"X-Forwarded-For", "198.51.100.9", "X-Forwarded-For", "198.51.100.10"},
				{"X-Forwarded-For", "garbage, ::1, [", "X-Real-IP", "198.51.100.9"},
			} {
				if a := send(t, alice, http.MethodGet, url+"/page", forged...); a.status != http.StatusTooManyRequests {
					t.Errorf("alice forging %q: got %d %q, want 429 (limited as herself)", forged, a.status, a.body)
				}
			}
			// Bob is limited apart; mallory, forging bob's address, spends
			// her own limit, not his.
			for i := range 5 {
				if a := send(t, mallory, http.MethodGet, url+"/page", "X-Forwarded-For", "127.0.0.3"); a.status != http.StatusOK {
					t.Fatalf("mallory's request %d: got %d %q, want 200", i+1, a.status, a.body)
				}
			}
			if a := send(t, mallory, http.MethodGet, url+"/page", "X-Forwarded-For", "127.0.0.3"); a.status != http.StatusTooManyRequests {
				t.Errorf("mallory's 6th request: got %d, want 429", a.status)
			}
			// Absurd requests from bob: each gets a clear answer, and only
			// those that reach the upstream are charged to him.
			long := url + "/" + strings.Repeat("a", 10<<10)
			absurd := []struct {
				method, url string
				header      []string
			}{
				{http.MethodGet, long, nil},
				{"PURGE", url + "/page", nil},
				{http.MethodPost, url + "/upload", []string{"Content-Type", "application/octet-stream"}},
			}
			passed := 0
			for _, r := range absurd {
				a := send(t, bob, r.method, r.url, r.header...)
				switch {
				case a.status == http.StatusOK:
					passed++
				case a.status >= 500:
					t.Errorf("bob's %s of %d bytes: got %d %q, want a clear answer, not a 5xx", r.method, len(r.url), a.status, a.body)
				}
			}
			for i := passed; i < 5; i++ {
				if a := send(t, bob, http.MethodGet, url+"/page"); a.status != http.StatusOK {
					t.Fatalf("bob's request %d after %d absurd ones that passed: got %d %q, want 200", i+1, passed, a.status, a.body)
				}
			}
			if a := send(t, bob, http.MethodGet, url+"/page"); a.status != http.StatusTooManyRequests {
				t.Errorf("bob's 6th request: got %d, want 429", a.status)
			}
			// The upstream saw exactly the allowed requests.
			for client, want := range map[string]int{"127.0.0.2": 5, "127.0.0.3": 5, "127.0.0.4": 5} {
				if got := up.count(client); got != want {
					t.Errorf("the upstream saw %d requests from %s, want %d", got, client, want)
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			for _, key := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/limiters/per-ip/available?key="+key, nil)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if !strings.Contains(string(b), `"remaining":0`) {
					t.Errorf("per-ip of %s: got %s, want nothing left", key, b)
				}
			}
		})
	}
}

// TestForwardAuthForgedRequestBehindProxies: through each proxy, a client
// that sends the headers the service reads the original request from
// (X-Forwarded-Method, X-Original-Method, X-Forwarded-Host,
// X-Forwarded-Uri, X-Original-URI) is charged by the rules its real
// method, host and path match, not by those it claims, whether it forges
// one of them or all: a POST /login claiming to be a GET of /static/x on
// another host spends the login limit, up to a denial, and a GET /page
// claiming to be a POST /login does not. Nor does a request line in
// absolute form ("POST http://host/login") hide the path.
func TestForwardAuthForgedRequestBehindProxies(t *testing.T) {
	claim := func(method, host, uri string) []string {
		return []string{"X-Forwarded-Method", method, "X-Original-Method", method, "X-Forwarded-Host", host,
			"X-Forwarded-Uri", uri, "X-Original-URI", uri}
	}
	tests := []struct {
		name, method, path string
		header             []string
		login              int64 // what the client has left of login after one request
	}{
		{"all five, claiming a GET of /static/x elsewhere", http.MethodPost, "/login", claim("GET", "static.example", "/static/x"), 2},
		{"X-Forwarded-Uri", http.MethodPost, "/login", []string{"X-Forwarded-Uri", "/static/x"}, 2},
		{"X-Original-URI", http.MethodPost, "/login", []string{"X-Original-URI", "/static/x"}, 2},
		{"X-Forwarded-Method", http.MethodPost, "/login", []string{"X-Forwarded-Method", "GET"}, 2},
		{"X-Original-Method", http.MethodPost, "/login", []string{"X-Original-Method", "GET"}, 2},
		{"X-Forwarded-Host", http.MethodPost, "/login", []string{"X-Forwarded-Host", "static.example"}, 2},
		{"a GET of /page claiming to be a POST /login", http.MethodGet, "/page", claim("POST", "127.0.0.1", "/login"), 3},
		// The path written otherwise, which upstreams serve as /login.
		{"/%6Cogin", http.MethodPost, "/%6Cogin", nil, 2},
		{"//login", http.MethodPost, "//login", nil, 2},
		{"/Login;p=1", http.MethodPost, "/Login;p=1", nil, 2},
	}
	for _, p := range proxies {
		t.Run(p.name, func(t *testing.T) {
			// The login rule of the example, for the host the clients ask
			// for, so that a forged host would escape it too.
			const login = "{limiter: login, key: client_ip, path_prefix: /login,"
			conf := exampleConfig(t, p)
			if !strings.Contains(conf, login) {
				t.Fatalf("ratelimiter.yaml has no rule %q...", login)
			}
			conf = strings.Replace(conf, login, "{limiter: login, key: client_ip, host: 127.0.0.1, path_prefix: /login,", 1)
			base, url, _ := behind(t, p, conf)

			for i, tt := range tests {
				ip := "127.0.0." + strconv.Itoa(10+i)
				if a := send(t, clientFrom(ip), tt.method, url+tt.path, tt.header...); a.status != http.StatusOK {
					t.Fatalf("%s: got %d %q, want 200", tt.name, a.status, a.body)
				}
				if got := remaining(t, base, "login", ip); got != tt.login {
					t.Errorf("%s: login left to %s: got %d, want %d", tt.name, ip, got, tt.login)
				}
				if got := remaining(t, base, "per-ip", ip); got != 4 {
					t.Errorf("%s: per-ip left to %s: got %d, want 4", tt.name, ip, got)
				}
			}
			// A request line naming the whole URL, which the proxies
			// accept: its path is still /login.
			ip := "127.0.0.30"
			if a := send(t, absoluteFrom(ip), http.MethodPost, url+"/login?next=/"); a.status != http.StatusOK {
				t.Fatalf("absolute form: got %d %q, want 200", a.status, a.body)
			}
			if got := remaining(t, base, "login", ip); got != 2 {
				t.Errorf("absolute form: login left to %s: got %d, want 2", ip, got)
			}
			// The client that forged all five spends its two other
			// logins; its fourth is denied, by login.
			c := clientFrom("127.0.0.10")
			forged := claim("GET", "static.example", "/static/x")
			for i := range 2 {
				if a := send(t, c, http.MethodPost, url+"/login", forged...); a.status != http.StatusOK {
					t.Fatalf("forged login %d: got %d %q, want 200", i+2, a.status, a.body)
				}
			}
			a := sendBody(t, c, http.MethodPost, url+"/login", nil, forged...)
			if a.status != http.StatusTooManyRequests || !strings.Contains(a.rateLimit, `"login";r=0`) {
				t.Errorf("forged login 4: got %d, RateLimit %q, want 429 by login", a.status, a.rateLimit)
			}
		})
	}
}

// TestTraefikExample checks the shape of the Traefik example, which the
// suite cannot run (see the README): its router goes through a
// forwardAuth middleware that asks the service's endpoint, does not trust
// the client's X-Forwarded-* headers, passes on every header a rule of
// ratelimiter.yaml keys by, and hands the RateLimit headers on.
func TestTraefikExample(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(exampleDir, "traefik.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		HTTP struct {
			Routers map[string]struct {
				Rule        string   `yaml:"rule"`
				EntryPoints []string `yaml:"entryPoints"`
				Middlewares []string `yaml:"middlewares"`
				Service     string   `yaml:"service"`
			} `yaml:"routers"`
			Middlewares map[string]struct {
				ForwardAuth *struct {
					Address             string   `yaml:"address"`
					TrustForwardHeader  bool     `yaml:"trustForwardHeader"`
					AuthResponseHeaders []string `yaml:"authResponseHeaders"`
					AuthRequestHeaders  []string `yaml:"authRequestHeaders"`
				} `yaml:"forwardAuth"`
			} `yaml:"middlewares"`
			Services map[string]struct {
				LoadBalancer struct {
					Servers []struct {
						URL string `yaml:"url"`
					} `yaml:"servers"`
				} `yaml:"loadBalancer"`
			} `yaml:"services"`
		} `yaml:"http"`
	}
	if err := yaml.UnmarshalWithOptions(b, &cfg, yaml.Strict()); err != nil {
		t.Fatal(err)
	}
	router, ok := cfg.HTTP.Routers["app"]
	if !ok || len(router.Middlewares) != 1 {
		t.Fatalf("router app: got %+v, want one middleware", cfg.HTTP.Routers)
	}
	fa := cfg.HTTP.Middlewares[router.Middlewares[0]].ForwardAuth
	if fa == nil || fa.Address != "http://"+exampleService+"/v1/forward-auth" {
		t.Errorf("forwardAuth: got %+v, want the address http://%s/v1/forward-auth", fa, exampleService)
	} else {
		if !slices.Contains(fa.AuthResponseHeaders, "RateLimit") || !slices.Contains(fa.AuthResponseHeaders, "RateLimit-Policy") {
			t.Errorf("authResponseHeaders: got %v, want RateLimit and RateLimit-Policy", fa.AuthResponseHeaders)
		}
		if fa.TrustForwardHeader {
			t.Error("trustForwardHeader: got true, want false: the client's X-Forwarded-Uri and -Method would reach the service")
		}
		// Every header a rule keys by reaches the service: Traefik passes
		// all of the client's unless authRequestHeaders names some.
		if len(fa.AuthRequestHeaders) > 0 {
			b, err := os.ReadFile(filepath.Join(exampleDir, "ratelimiter.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var rules exampleRules
			if err := yaml.Unmarshal(b, &rules); err != nil {
				t.Fatal(err)
			}
			for _, r := range rules.ForwardAuth.Rules {
				if h, ok := strings.CutPrefix(r.Key, "header:"); ok && !slices.ContainsFunc(fa.AuthRequestHeaders, func(n string) bool { return strings.EqualFold(n, h) }) {
					t.Errorf("authRequestHeaders %v leave out %s, which a rule keys by", fa.AuthRequestHeaders, h)
				}
			}
		}
	}
	if s := cfg.HTTP.Services[router.Service].LoadBalancer.Servers; len(s) != 1 || s[0].URL != "http://"+exampleUpstream {
		t.Errorf("service: got %+v, want the upstream http://%s", s, exampleUpstream)
	}
}

// exampleRules are the rules and limiters of a configuration such as
// examples/forward-auth/ratelimiter.yaml.
type exampleRules struct {
	Limiters []struct {
		Name  string `yaml:"name"`
		Limit int64  `yaml:"limit"`
		Keyed bool   `yaml:"keyed"`
	} `yaml:"limiters"`
	ForwardAuth struct {
		Rules []struct {
			Limiter    string   `yaml:"limiter"`
			Key        string   `yaml:"key"`
			PathPrefix string   `yaml:"path_prefix"`
			Methods    []string `yaml:"methods"`
			Host       string   `yaml:"host"`
			Permits    int64    `yaml:"permits"`
		} `yaml:"rules"`
	} `yaml:"forward_auth"`
}

// left is what a limiter has left: of key when it is keyed, of itself
// otherwise.
func left(t *testing.T, base, name, key string) int64 {
	t.Helper()
	if key != "" {
		return remaining(t, base, name, key)
	}
	res, err := http.Get(base + "/v1/limiters/" + name + "/available")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var a struct{ Remaining int64 }
	if err := json.NewDecoder(res.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return a.Remaining
}

// TestForwardAuthExampleRulesApplyBehindProxies: through each proxy, with
// its example's files, every rule of ratelimiter.yaml applies: a request
// written to match one rule, from a client of its own, is charged by it.
// A rule that an example leaves unreachable (a header it does not pass
// on, a method or path it rewrites) fails here.
func TestForwardAuthExampleRulesApplyBehindProxies(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(exampleDir, "ratelimiter.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg exampleRules
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	limits := map[string]int64{}
	for _, l := range cfg.Limiters {
		limits[l.Name] = l.Limit
	}
	if len(cfg.ForwardAuth.Rules) == 0 {
		t.Fatal("ratelimiter.yaml has no forward_auth rules")
	}
	for _, p := range proxies {
		t.Run(p.name, func(t *testing.T) {
			base, url, _ := behind(t, p, exampleConfig(t, p))
			for i, r := range cfg.ForwardAuth.Rules {
				if r.Host != "" {
					t.Fatalf("rule %d: a host, %q, which the test cannot send through the proxy", i+1, r.Host)
				}
				ip := "127.0.0." + strconv.Itoa(40+i)
				method, path, key := http.MethodGet, "/page", ""
				if len(r.Methods) > 0 {
					method = r.Methods[0]
				}
				if r.PathPrefix != "" {
					path = r.PathPrefix + "x"
				}
				var header []string
				switch {
				case r.Key == "client_ip":
					key = ip
				case strings.HasPrefix(r.Key, "header:"):
					key = "key-" + strconv.Itoa(i+1)
					header = []string{strings.TrimPrefix(r.Key, "header:"), key}
				}
				if a := send(t, clientFrom(ip), method, url+path, header...); a.status != http.StatusOK {
					t.Fatalf("rule %d (%s %s): got %d %q, want 200", i+1, method, path, a.status, a.body)
				}
				permits := max(r.Permits, 1)
				if got, want := left(t, base, r.Limiter, key), limits[r.Limiter]-permits; got != want {
					t.Errorf("rule %d, %+v: %s %s from %s: %s has %d left, want %d: the rule did not apply", i+1, r, method, path, ip, r.Limiter, got, want)
				}
			}
		})
	}
}

// sendRaw writes a request line exactly as given, which no HTTP library
// would write (a method in lower case, an escape that is no escape), to
// the proxy at url from the loopback address ip, and returns the status
// of the answer.
func sendRaw(t *testing.T, ip, url, method, target string) int {
	t.Helper()
	addr := strings.TrimPrefix(url, "http://")
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", method, target, addr); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestForwardAuthSpellingsBehindProxies: through each proxy, a request
// that reaches the upstream at a rule's path, however its method and
// path are spelled (post for POST, /%61dmin/x%zz, escapes twice over,
// another case, parameters, backslashes, trailing dots), is charged by
// the rule; a spelling that the service refuses (a dot segment) or the
// proxy does never reaches the upstream.
func TestForwardAuthSpellingsBehindProxies(t *testing.T) {
	tests := []struct {
		method, target, limiter string
	}{
		{"post", "/login", "login"},
		{"Post", "/Login", "login"},
		{"POST", "/%6C%6Fgin", "login"},
		{"GET", "/%61dmin/x%zz", "admin"},
		{"GET", "/%2561dmin/x", "admin"},
		{"GET", "/ADMIN/x", "admin"},
		{"GET", "/admin;p=1/x", "admin"},
		{"GET", "/admin%2Fx", "admin"},
		{"GET", "/admin./x", "admin"},
		{"GET", `/admin\x`, "admin"},
		{"GET", "/admin%5Cx", "admin"},
		{"GET", "/x/..%2Fadmin/", "admin"},
		{"GET", "/x/%2e%2e/admin/", "admin"},
	}
	for _, p := range proxies {
		t.Run(p.name, func(t *testing.T) {
			conf := exampleConfig(t, p)
			conf = strings.Replace(conf, "limiters:\n", "limiters:\n  - {name: admin, limit: 100, period: 1h, keyed: true, group: edge}\n", 1)
			conf = strings.Replace(conf, "  rules:\n", "  rules:\n    - {limiter: admin, key: client_ip, path_prefix: /admin/}\n", 1)
			base, url, up := behind(t, p, conf)
			limits := map[string]int64{"login": 3, "admin": 100}
			for i, tt := range tests {
				ip := "127.0.0." + strconv.Itoa(60+i)
				status := sendRaw(t, ip, url, tt.method, tt.target)
				seen, charged := up.reached(ip), remaining(t, base, tt.limiter, ip) < limits[tt.limiter]
				switch {
				case seen && !charged:
					t.Errorf("%s %s: it reached the upstream (%d), and %s charged nothing", tt.method, tt.target, status, tt.limiter)
				case !seen && (status < 400 || status >= 500):
					t.Errorf("%s %s: got %d and the upstream did not see it, want a 4xx", tt.method, tt.target, status)
				}
				t.Logf("%s %s: %d, reached the upstream: %v, %s charged: %v", tt.method, tt.target, status, seen, tt.limiter, charged)
			}
		})
	}
}
