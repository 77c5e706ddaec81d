package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// proxyLimit is nginx's limit_req rate in the proxy comparison, per
// second, and proxyQuota the service's per-client limit, per year: no run
// reaches either, so every request passes and each system is measured
// doing the same work. The service's limit refills so slowly (32 a second)
// that what a run took can be counted afterwards (checkCharged).
const (
	proxyLimit  = 1_000_000
	proxyQuota  = 1_000_000_000
	proxyPeriod = 8760 * time.Hour
)

// proxyRedisTimeout is the Redis timeout of the service on Redis in the
// proxy comparison (see proxyComparison).
const proxyRedisTimeout = "500ms"

// proxyConfig is the service's configuration in the proxy comparison: the
// one rule of examples/forward-auth/ratelimiter.yaml that every request
// matches, per client, with nginx's deny status.
var proxyConfig = fmt.Sprintf(`limiters:
  - {name: per-ip, limit: %d, period: %s, keyed: true, group: edge}
forward_auth:
  deny_status: 403
  rules:
    - {limiter: per-ip, key: client_ip}
`, proxyQuota, proxyPeriod)

// nginxMain is the main configuration of every nginx of the comparison,
// as Debian's sets it (a worker per core), with its files in one
// directory (%[1]s) and the site in %[2]s.
const nginxMain = `worker_processes auto;
error_log %[1]s/error.log warn;
pid %[1]s/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[2]s;
}
`

// nginxSite is a site that passes every request to the upstream, after
// the lines of limit (none for plain nginx): %[1]s is its address, %[2]s
// the upstream's, %[3]s what goes in the http block, %[4]s in the
// location.
const nginxSite = `upstream app {
    server %[2]s;
    keepalive 64;
}
%[3]s
server {
    listen %[1]s;
    location / {
%[4]s
        proxy_pass http://app;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    }
}
`

// proxyCeiling is the name of the proxy comparison's ceiling: nginx
// asking, by the same auth_request configuration as the service's, a
// net/http handler that answers every subrequest with a bare 200
// (./trivial).
const proxyCeiling = "nginx + auth_request to a trivial net/http handler (the ceiling)"

// proxySystem is one way of running nginx in the comparison.
type proxySystem struct {
	name    string
	nginx   *proc
	servers []*proc // whose CPU counts: nginx, the upstream, the service and its Redis
	service *proc   // the service asked, if any
}

// proxyComparison puts nginx on loopback in front of a trivial upstream
// four ways (alone, with its own limit_req, and asking the service by
// auth_request on each backend, configured by examples/forward-auth) and
// loads each with GET requests of one client, closed-loop and at an
// equal open-loop rate, in interleaved rounds.
func proxyComparison(cfg config, rig *redisRig, rep *report) error {
	dir := filepath.Join(cfg.dir, "proxy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	upstream, err := startTrivial(cfg)
	if err != nil {
		return err
	}
	defer upstream.stop()
	example, err := os.ReadFile(filepath.Join(cfg.root, "examples", "forward-auth", "nginx.conf"))
	if err != nil {
		return err
	}
	rules := filepath.Join(dir, "ratelimiter.yaml")
	if err := os.WriteFile(rules, []byte(proxyConfig), 0o644); err != nil {
		return err
	}

	var systems []proxySystem
	defer func() {
		for _, s := range systems {
			s.nginx.stop()
			if s.service != nil {
				s.service.stop()
			}
		}
	}()
	// add starts nginx with the site for its address. Its CPU counts with
	// the upstream's and that of the servers it asks, if any; service, if
	// not nil, is the ratelimiter among them, whose charges are checked.
	add := func(name string, service *proc, asked []*proc, site func(listen string) string) error {
		listen, err := freeAddr()
		if err != nil {
			return err
		}
		n, err := startNginx(filepath.Join(dir, fmt.Sprint(len(systems))), listen, site(listen))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		systems = append(systems, proxySystem{name: name, nginx: n, servers: append([]*proc{n, upstream}, asked...), service: service})
		return nil
	}
	if err := add("nginx alone", nil, nil, func(listen string) string {
		return fmt.Sprintf(nginxSite, listen, upstream.addr, "", "")
	}); err != nil {
		return err
	}
	if err := add("nginx + limit_req", nil, nil, func(listen string) string {
		zone := fmt.Sprintf("limit_req_zone $binary_remote_addr zone=perip:10m rate=%dr/s;", proxyLimit)
		return fmt.Sprintf(nginxSite, listen, upstream.addr, zone, fmt.Sprintf("        limit_req zone=perip burst=%d nodelay;", proxyLimit))
	}); err != nil {
		return err
	}
	// The ceiling of auth_request: nginx asking a server that answers
	// every subrequest with a bare 200, through the same example.
	auth, err := startTrivial(cfg)
	if err != nil {
		return err
	}
	defer auth.stop()
	asking := func(service string) func(listen string) string {
		return func(listen string) string {
			_, port, _ := strings.Cut(listen, ":")
			return strings.NewReplacer("127.0.0.1:8080", service, "127.0.0.1:3000", upstream.addr,
				"listen 8000;", "listen 127.0.0.1:"+port+";").Replace(string(example))
		}
	}
	if err := add(proxyCeiling, nil, []*proc{auth}, asking(auth.addr)); err != nil {
		return err
	}
	for _, b := range []struct {
		name    string
		args    []string
		servers []*proc
	}{
		{"nginx + ratelimiter auth_request, memory backend", nil, nil},
		// A longer Redis timeout than the other comparisons': at the equal
		// rate, near what this path sustains on 2 shared cores, a decision
		// can queue past 50 ms, and the failure mode would deny it.
		{"nginx + ratelimiter auth_request, Redis backend", []string{"--backend", "redis", "--redis-addrs", rig.redis.addr,
			"--redis-timeout", proxyRedisTimeout, "--redis-key-prefix", "proxy:"}, []*proc{rig.redis}},
	} {
		listen, err := freeAddr()
		if err != nil {
			return err
		}
		svc, err := start("ratelimiter ("+b.name+")", listen, nil, cfg.service, append([]string{"--listen", listen, "--grpc-listen", "",
			"--log-level", "warn", "--config", rules, "--trusted-proxies", "127.0.0.1"}, b.args...)...)
		if err != nil {
			return err
		}
		if err := ready(svc); err != nil {
			svc.stop()
			return err
		}
		if err := add(b.name, svc, append([]*proc{svc}, b.servers...), asking(svc.addr)); err != nil {
			svc.stop()
			return err
		}
	}
	for _, s := range systems {
		if b, err := call("GET", s.nginx.url("/"), ""); err != nil || string(b) != trivialPage {
			return fmt.Errorf("%s: GET / answered %q, %v; want the upstream's %q", s.name, b, err, trivialPage)
		}
	}

	// A GET of / from every connection; wrkDone is a format, its %% for
	// Sprintf.
	w, err := newWrkScript(dir, "get", fmt.Sprintf(wrkDone), cfg.wrkThreads, cfg.conns)
	if err != nil {
		return err
	}
	names := make([]string, len(systems))
	for i, s := range systems {
		names[i] = s.name
	}
	sec := rep.section("Reverse proxy: nginx with limit_req, and asking ratelimiter by auth_request")
	sec.printf("nginx %s in front of a trivial upstream (net/http, `GET /` answering a 3-byte page), all on loopback: alone; with its own `limit_req` (in process, keyed by the client's address); with `auth_request` asking, by the same configuration (examples/forward-auth/nginx.conf), a net/http handler that answers every subrequest with a bare 200 (the ceiling: about the least an auth service on net/http can cost behind nginx); and asking the service (a rule per client address) on each backend. No run reaches a limit (`limit_req`: %d per second; the service: %d a year), so every request passes, and after each run the service must hold as taken exactly the requests that passed (give or take the ones in flight). One client (wrk's, from 127.0.0.1): one hot key. Server CPU is nginx's (master and workers), the upstream's, and that of the auth server and its Redis where they take part. The service on Redis runs with a Redis timeout of %s rather than 50 ms: at the equal rate, close to what that path sustains on 2 shared cores, a decision can queue past 50 ms, which the failure mode (fail-closed) would answer with a denial. %d interleaved rounds of %s; median (min–max).\n\n",
		nginxVersion(), proxyLimit, proxyQuota, proxyRedisTimeout, cfg.rounds, cfg.duration)

	closed := make([][]sample, len(systems))
	for round := range cfg.rounds {
		for i, s := range systems {
			before, err := proxyCharged(s)
			if err != nil {
				return err
			}
			began := time.Now()
			x, err := w.run(s.nginx.url("/"), cfg.duration, s.servers...)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			after, err := proxyCharged(s)
			if err != nil {
				return err
			}
			if err := checkCharged(s, before, after, x.requests, time.Since(began), cfg.conns); err != nil {
				return err
			}
			closed[i] = append(closed[i], x)
			cfg.progress("round %d  saturated   %-52s %8.0f/s  p99 %6.0f µs  server CPU %5.1f µs", round+1, s.name, x.rps, x.p99, x.serverCPU)
		}
	}
	sec.printf("### Saturated (%s, GET /)\n\n", w)
	sec.sampleTable("request", names, closed)
	rpsChart := sec.chart("proxy-requests", "nginx in front of an upstream: requests per second (higher is better)", "requests/s")
	rpsChart.add("saturated", names, column(closed, func(x sample) float64 { return x.rps }))

	open := make([][]sample, len(systems))
	for round := range cfg.rounds {
		for i, s := range systems {
			x, err := openLoop(s.nginx.url("/"), "", cfg.httpRate, cfg.duration, s.servers...)
			if err != nil {
				return fmt.Errorf("%s at %d/s: %w", s.name, cfg.httpRate, err)
			}
			open[i] = append(open[i], x)
			cfg.progress("round %d  %d/s      %-52s p50 %6.0f µs  p99 %6.0f µs  p99.9 %6.0f µs", round+1, cfg.httpRate, s.name, x.p50, x.p99, x.p999)
		}
	}
	sec.printf("\n### At an equal rate: %d requests/s, open loop\n\n", cfg.httpRate)
	sec.sampleTable("request", names, open)

	// The ratios the targets are about, per round.
	sec.printf("\n")
	ratio := func(results [][]sample, a, b int, f func(sample) float64) []float64 {
		xs := make([]float64, len(results[a]))
		for r := range xs {
			xs[r] = f(results[a][r]) / f(results[b][r])
		}
		return xs
	}
	fact := func(v string) {
		sec.printf("- %s\n", v)
		rep.facts = append(rep.facts, "Reverse proxy, "+v)
	}
	// The systems, in the order added.
	const plain, limitReq, ceiling, memory, redis = 0, 1, 2, 3, 4
	for _, i := range []int{ceiling, memory, redis} {
		// target is what a service's figure is judged by: the ceiling's
		// shows how near any service behind auth_request can come.
		target := func(t string, met bool) string {
			if i == ceiling {
				return ""
			}
			return fmt.Sprintf(" (target %s: %s)", t, verdict(met))
		}
		added := make([]float64, len(open[i]))
		for r := range added {
			added[r] = (open[i][r].p99 - open[plain][r].p99) / 1e3
		}
		fact(fmt.Sprintf("%s, p99 at %d requests/s over nginx alone: %s ms%s",
			systems[i].name, cfg.httpRate, stat(added, "%+.2f"), target("≤ 1 ms", median(added) <= 1)))
		xs := ratio(closed, i, limitReq, func(x sample) float64 { return x.rps })
		fact(fmt.Sprintf("%s ÷ nginx + limit_req, requests/s saturated: %s%s",
			systems[i].name, stat(xs, "%.2f×"), target("≥ 0.5×", median(xs) >= 0.5)))
		hop := make([]float64, len(closed[i]))
		for r := range hop {
			hop[r] = closed[i][r].serverCPU - closed[limitReq][r].serverCPU
		}
		fact(fmt.Sprintf("what the hop to the auth service costs (%s), server CPU per request over nginx + limit_req: %s µs", systems[i].name, stat(hop, "%+.1f")))
	}
	for _, i := range []int{memory, redis} {
		xs := ratio(closed, i, ceiling, func(x sample) float64 { return x.rps })
		fact(fmt.Sprintf("%s ÷ the ceiling of auth_request, requests/s saturated: %s", systems[i].name, stat(xs, "%.2f×")))
	}
	return nil
}

// startNginx runs nginx in the foreground with its files in dir and site
// as its one site, and waits until it listens on listen.
func startNginx(dir, listen, site string) (*proc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	siteFile, mainFile := filepath.Join(dir, "site.conf"), filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(siteFile, []byte(site), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(mainFile, []byte(fmt.Sprintf(nginxMain, dir, siteFile)), 0o644); err != nil {
		return nil, err
	}
	return start("nginx", listen, nil, "nginx", "-p", dir, "-c", mainFile, "-g", "daemon off;")
}

// nginxVersion is what nginx -v says, such as "1.22.1".
func nginxVersion() string {
	out, _ := exec.Command("nginx", "-v").CombinedOutput()
	_, v, _ := strings.Cut(strings.TrimSpace(string(out)), "nginx/")
	return v
}

// proxyCharged is what the service of s holds as taken from the client's
// limit (0 for a system without the service).
func proxyCharged(s proxySystem) (float64, error) {
	if s.service == nil {
		return 0, nil
	}
	b, err := call("GET", s.service.url("/v1/limiters/per-ip/available?key=127.0.0.1"), "")
	if err != nil {
		return 0, err
	}
	var a struct{ Remaining float64 }
	if err := json.Unmarshal(b, &a); err != nil {
		return 0, err
	}
	return proxyQuota - a.Remaining, nil
}

// checkCharged fails unless the service of s took, in a run that took
// elapsed, what the run's answered requests asked for: no fewer, less
// what refilled meanwhile, and no more than those and the ones still in
// flight when wrk stopped, one per connection. It shows every request
// passed by the service's decision, as the client's address.
func checkCharged(s proxySystem, before, after, answered float64, elapsed time.Duration, conns int) error {
	if s.service == nil {
		return nil
	}
	refilled := elapsed.Seconds() * proxyQuota / proxyPeriod.Seconds()
	if took := after - before; took < answered-refilled-1 || took > answered+float64(conns) {
		return fmt.Errorf("%s: the service took %.0f permits of 127.0.0.1 in a run that passed %.0f requests", s.name, took, answered)
	}
	return nil
}
