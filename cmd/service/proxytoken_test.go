package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// proxyToken is the decide token the proxies send in
// TestForwardAuthWithTokenBehindProxies.
const proxyToken = "proxy-0123456789"

// addToken edits, in dir, the configuration p.start wrote so that the
// proxy sends token on its auth subrequests, as the README's "Tokens and
// scopes" tells for each proxy.
func addToken(t *testing.T, p proxy, dir, token string) {
	t.Helper()
	edit := func(name, old, new string) {
		t.Helper()
		path := filepath.Join(dir, name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), old) {
			t.Fatalf("%s: no %q to add the token after", name, old)
		}
		write(t, path, strings.Replace(string(b), old, old+new, 1))
	}
	switch p.name {
	case "nginx":
		edit("app.conf", "location = /_ratelimit {\n        internal;\n", `        proxy_set_header Authorization "Bearer `+token+"\";\n")
	case "Caddy":
		edit("Caddyfile", "uri /v1/forward-auth\n", "\t\theader_up Authorization \"Bearer "+token+"\"\n")
	case "HAProxy":
		edit("ratelimit.lua", "headers = {\n", `      ["authorization"] = {"Bearer `+token+`"},`+"\n")
	default:
		t.Fatalf("no way to add a token to %s", p.name)
	}
}

// TestForwardAuthWithTokenBehindProxies: with the decide scope guarded,
// each proxy that adds the header the README shows gets its clients'
// requests decided, whatever Authorization header the client sends; the
// same proxy without the header gets none through, and passes the
// service's 401 on.
func TestForwardAuthWithTokenBehindProxies(t *testing.T) {
	for _, p := range proxies {
		t.Run(p.name, func(t *testing.T) {
			bin := requireTool(t, p.bin)
			tokens := filepath.Join(t.TempDir(), "tokens.yaml")
			write(t, tokens, "tokens:\n  - {name: proxy, sha256: "+sha256Hex(proxyToken)+", scopes: [decide]}\n")
			base, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--grpc-listen", "", "--trusted-proxies", "127.0.0.1", "--tokens-file", tokens},
				map[string]string{"RATELIMITER_CONFIG": configFile(t, exampleConfig(t, p))})
			service := strings.TrimPrefix(base, "http://")

			for _, withToken := range []bool{true, false} {
				up := newUpstream(t)
				dir := t.TempDir()
				port := freePort(t)
				cmd := p.start(t, bin, dir, port, service, up.addr)
				if withToken {
					addToken(t, p, dir, proxyToken)
				}
				logPath := filepath.Join(dir, "proxy.log")
				logFile, err := os.Create(logPath)
				if err != nil {
					t.Fatal(err)
				}
				cmd.Stdout, cmd.Stderr = logFile, logFile
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				exited := make(chan struct{})
				go func() { _ = cmd.Wait(); close(exited) }()
				stop := func() {
					_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
					<-exited
					logFile.Close()
				}
				waitListening(t, "127.0.0.1:"+port, cmd, exited, logPath)
				url := "http://127.0.0.1:" + port

				alice := clientFrom("127.0.0.2")
				if withToken {
					for i, hdr := range [][]string{nil, {"Authorization", "Bearer forged"}, {"Authorization", "Basic YTpi"}} {
						if a := send(t, alice, http.MethodGet, url+"/page", hdr...); a.status != http.StatusOK || a.body != "hello\n" {
							t.Errorf("with the token, request %d (%q): got %d %q, want 200 from the upstream", i+1, hdr, a.status, a.body)
						}
					}
					if got := up.count("127.0.0.2"); got != 3 {
						t.Errorf("with the token: the upstream saw %d requests, want 3", got)
					}
				} else {
					a := send(t, alice, http.MethodGet, url+"/page")
					if a.status != http.StatusUnauthorized {
						t.Errorf("without the token: got %d %q, want the service's 401 passed on", a.status, a.body)
					}
					if got := up.count("127.0.0.2"); got != 0 {
						t.Errorf("without the token: the upstream saw %d requests, want none", got)
					}
				}
				stop()
			}
		})
	}
}
