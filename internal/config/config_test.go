package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/heapfloor"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// writeFile writes content to a file in a fresh temporary directory and
// returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDefaults(t *testing.T) {
	got, err := Load(nil, env(nil))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := Config{
		Listen:         ":8080",
		GRPCListen:     ":8081",
		Backend:        BackendMemory,
		LogLevel:       slog.LevelInfo,
		LogFormat:      LogJSON,
		MaxBodyBytes:   65536,
		MaxHeaderBytes: 16384,
		Listeners: Listeners{
			MaxConnections: 1024, GRPCMaxConnections: 512, GRPCMaxMessageBytes: 64 << 10, GRPCMaxStreams: 512,
			GRPCIdleTimeout: 5 * time.Minute,
		},
		MaxLimiters:        100_000,
		MetricsMaxLimiters: 1000,
		GCMinHeap:          heapfloor.Default,
		ReadHeaderTimeout:  5 * time.Second,
		ReadTimeout:        10 * time.Second,
		WriteTimeout:       10 * time.Second,
		IdleTimeout:        60 * time.Second,
		ShutdownDelay:      0,
		ShutdownTimeout:    20 * time.Second,
		Redis: Redis{
			Addrs: []string{"localhost:6379"}, KeyPrefix: "ratelimiter:",
			Timeout: 50 * time.Millisecond, DialTimeout: time.Second, ConnsPerNode: 0, FailureMode: FailClosed, DenyCache: 10000,
		},
		ClientIP: forwardauth.ClientIP{Header: forwardauth.XForwardedFor},
		Tenants: tenant.Config{
			Policy:     limiter.Policy{Limit: 100, Period: time.Minute, Algorithm: limiter.GCRA, Burst: 100},
			IPv6Prefix: 64,
			MaxTenants: 1_000_000,
			MaxBytes:   256 << 20,
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestPrecedence(t *testing.T) {
	file := writeFile(t, "config.yaml", "tenants:\n  limit: 200\n  period: 10s\n")
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		wantLimit  int64
		wantPeriod time.Duration
		wantListen string
	}{
		{name: "defaults", wantLimit: 100, wantPeriod: time.Minute, wantListen: ":8080"},
		{name: "file over default", args: []string{"--config", file},
			wantLimit: 200, wantPeriod: 10 * time.Second, wantListen: ":8080"},
		{name: "file named by env", env: map[string]string{"RATELIMITER_CONFIG": file},
			wantLimit: 200, wantPeriod: 10 * time.Second, wantListen: ":8080"},
		{name: "env over file", args: []string{"--config", file},
			env:       map[string]string{"RATELIMITER_TENANT_LIMIT": "300", "RATELIMITER_LISTEN": ":9000"},
			wantLimit: 300, wantPeriod: 10 * time.Second, wantListen: ":9000"},
		{name: "flag over env", args: []string{"--config", file, "--tenant-limit=400", "-listen", "127.0.0.1:0"},
			env:       map[string]string{"RATELIMITER_TENANT_LIMIT": "300", "RATELIMITER_LISTEN": ":9000"},
			wantLimit: 400, wantPeriod: 10 * time.Second, wantListen: "127.0.0.1:0"},
		{name: "empty env counts as unset", env: map[string]string{"RATELIMITER_TENANT_LIMIT": ""},
			wantLimit: 100, wantPeriod: time.Minute, wantListen: ":8080"},
		{name: "last flag wins", args: []string{"--tenant-limit=5", "--tenant-limit=6"},
			wantLimit: 6, wantPeriod: time.Minute, wantListen: ":8080"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.args, env(tt.env))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got := c.Tenants.Policy.Limit; got != tt.wantLimit {
				t.Errorf("tenant limit: got %d, want %d", got, tt.wantLimit)
			}
			if got := c.Tenants.Policy.Period; got != tt.wantPeriod {
				t.Errorf("tenant period: got %s, want %s", got, tt.wantPeriod)
			}
			if c.Listen != tt.wantListen {
				t.Errorf("listen: got %q, want %q", c.Listen, tt.wantListen)
			}
		})
	}
}

func TestEverySettingByFlagAndEnv(t *testing.T) {
	tokenFile := writeFile(t, "token", "  s3cret\n")
	passwordFile := writeFile(t, "redis-password", "hunter2\n")
	caFile := writeFile(t, "ca.pem", "")
	values := map[string]string{
		"listen": "127.0.0.1:9999", "backend": "redis", "max-body-bytes": "1024", "max-header-bytes": "8192",
		"max-limiters": "42", "metrics-max-limiters": "7", "gc-min-heap": "64MiB", "log-level": "debug", "log-format": "text",
		"read-header-timeout": "1s", "read-timeout": "2s", "write-timeout": "3s", "idle-timeout": "4s",
		"shutdown-delay": "5s", "shutdown-timeout": "6s",
		"tenant-limit": "10", "tenant-period": "1h", "tenant-algorithm": "sliding_log", "tenant-burst": "0",
		"tenant-ipv6-prefix": "48", "tenant-max": "500", "tenant-max-bytes": "1MiB",
		"admin-token-file": tokenFile, "config": "", "grpc-listen": "127.0.0.1:9998", "envoy-config": "", "envoy-headers": "true",
		"redis-addrs": "a:1, b:2", "redis-username": "rl", "redis-password-file": passwordFile,
		"redis-tls": "true", "redis-tls-ca-file": caFile, "redis-key-prefix": "rl1:",
		"redis-timeout": "20ms", "redis-dial-timeout": "2s", "redis-conns-per-node": "16", "redis-failure-mode": "fail-open",
		"redis-deny-cache": "500", "tokens-file": "/etc/ratelimiter/tokens.yaml",
		"max-connections": "100", "grpc-max-connections": "50", "grpc-max-message-bytes": "8KiB", "grpc-max-streams": "20",
		"grpc-idle-timeout": "30s", "tls-cert-file": "tls.crt", "tls-key-file": "tls.key", "tls-client-ca-file": "ca.crt",
		"trusted-proxies": "10.0.0.0/8, 192.168.1.1,::ffff:172.16.0.0/108", "trusted-hops": "0", "forwarded-header": "Forwarded",
	}
	// The settings set by file or by another setting's value; every other
	// one must be in values, so that adding a setting extends this test.
	for _, s := range settings {
		// --data-dir is refused with the Redis backend this test sets:
		// TestDataDir covers it.
		if _, ok := values[s.name]; !ok && s.name != "admin-token" && s.name != "redis-password" && s.name != "data-dir" {
			t.Errorf("setting --%s is not covered by this test", s.name)
		}
	}
	want := Config{
		Listen: "127.0.0.1:9999", GRPCListen: "127.0.0.1:9998", EnvoyHeaders: true, Backend: BackendRedis, AdminToken: "s3cret",
		TokensFile: "/etc/ratelimiter/tokens.yaml",
		Redis: Redis{
			Addrs: []string{"a:1", "b:2"}, Username: "rl", Password: "hunter2", TLS: true, TLSCAFile: caFile,
			KeyPrefix: "rl1:", Timeout: 20 * time.Millisecond, DialTimeout: 2 * time.Second, ConnsPerNode: 16, DenyCache: 500,
			FailureMode: FailOpen,
		},
		ClientIP: forwardauth.ClientIP{Header: forwardauth.Forwarded, Trusted: []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.1/32"), netip.MustParsePrefix("172.16.0.0/12"),
		}},
		LogLevel: slog.LevelDebug, LogFormat: LogText, MaxBodyBytes: 1024, MaxHeaderBytes: 8192, MaxLimiters: 42, MetricsMaxLimiters: 7,
		Listeners: Listeners{
			MaxConnections: 100, GRPCMaxConnections: 50, GRPCMaxMessageBytes: 8 << 10, GRPCMaxStreams: 20,
			GRPCIdleTimeout: 30 * time.Second, TLSCertFile: "tls.crt", TLSKeyFile: "tls.key", TLSClientCAFile: "ca.crt",
		},
		GCMinHeap:         64 << 20,
		ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 3 * time.Second,
		IdleTimeout: 4 * time.Second, ShutdownDelay: 5 * time.Second, ShutdownTimeout: 6 * time.Second,
		Tenants: tenant.Config{
			Policy:     limiter.Policy{Limit: 10, Period: time.Hour, Algorithm: limiter.SlidingLog},
			IPv6Prefix: 48, MaxTenants: 500, MaxBytes: 1 << 20,
		},
		adminTokenFile:    tokenFile,
		redisPasswordFile: passwordFile,
	}
	var args []string
	environ := map[string]string{}
	for _, s := range settings {
		v, ok := values[s.name]
		if !ok {
			continue
		}
		args = append(args, "--"+s.name+"="+v)
		environ[s.env] = v
	}
	for name, load := range map[string]func() (Config, error){
		"flags": func() (Config, error) { return Load(args, env(nil)) },
		"env":   func() (Config, error) { return Load(nil, env(environ)) },
	} {
		t.Run(name, func(t *testing.T) {
			got, err := load()
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestDataDir(t *testing.T) {
	for name, load := range map[string]func() (Config, error){
		"flag": func() (Config, error) { return Load([]string{"--data-dir", "/var/lib/rl"}, env(nil)) },
		"env": func() (Config, error) {
			return Load(nil, env(map[string]string{"RATELIMITER_DATA_DIR": "/var/lib/rl"}))
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := load()
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if c.DataDir != "/var/lib/rl" {
				t.Errorf("DataDir: got %q, want /var/lib/rl", c.DataDir)
			}
		})
	}
	c, err := Load(nil, env(nil))
	if err != nil || c.DataDir != "" {
		t.Errorf("default: DataDir %q, %v; want none", c.DataDir, err)
	}
	_, err = Load([]string{"--data-dir", "/var/lib/rl"}, env(map[string]string{"RATELIMITER_BACKEND": "redis"}))
	if err == nil || !strings.Contains(err.Error(), "--data-dir") || !strings.Contains(err.Error(), "RATELIMITER_BACKEND") {
		t.Errorf("with the Redis backend: got %v, want a refusal naming both settings", err)
	}
}

func TestRedisConnsPerNode(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want int
	}{
		{name: "default", want: 0},
		{name: "zero", args: []string{"--redis-conns-per-node=0"}, want: 0},
		{name: "one by env", env: map[string]string{"RATELIMITER_REDIS_CONNS_PER_NODE": "1"}, want: 1},
		{name: "flag", args: []string{"--redis-conns-per-node", "8"}, want: 8},
		{name: "most", args: []string{"--redis-conns-per-node", "256"}, want: 256},
		{name: "flag over env", args: []string{"--redis-conns-per-node", "2"},
			env: map[string]string{"RATELIMITER_REDIS_CONNS_PER_NODE": "64"}, want: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.args, env(tt.env))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if c.Redis.ConnsPerNode != tt.want {
				t.Errorf("got %d connections per node, want %d", c.Redis.ConnsPerNode, tt.want)
			}
		})
	}
}

func TestFile(t *testing.T) {
	path := writeFile(t, "config.yaml", `
limiters:
  - name: google-read
    limit: 2000
    period: 100s
  - name: payments-api
    limit: 5
    period: 1m
    algorithm: sliding_log
  - name: bursty
    limit: 10
    period: 1s
    burst: 3
  - name: per-user
    limit: 100
    period: 1m
    group: search
    keyed: true
    max_keys: 50000
  - name: per-route
    limit: 20
    period: 1s
    algorithm: sliding_log
    keyed: true
  - name: search-total
    limit: 1000
    period: 1m
    group: search
    keyed: false
tenants:
  limit: 50
  period: 30s
  algorithm: gcra
  burst: 5
  ipv6_prefix: 56
  max_tenants: 1000
  max_bytes: 2MiB
`)
	c, err := Load([]string{"--config", path}, env(nil))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	wantLimiters := []limiter.Definition{
		{Name: "google-read", Policy: limiter.Policy{Limit: 2000, Period: 100 * time.Second, Algorithm: limiter.GCRA, Burst: 2000}},
		{Name: "payments-api", Policy: limiter.Policy{Limit: 5, Period: time.Minute, Algorithm: limiter.SlidingLog}},
		{Name: "bursty", Policy: limiter.Policy{Limit: 10, Period: time.Second, Algorithm: limiter.GCRA, Burst: 3}},
		{Name: "per-user", Policy: limiter.Policy{Limit: 100, Period: time.Minute, Algorithm: limiter.GCRA, Burst: 100},
			Group: "search", Keyed: true, MaxKeys: 50000},
		{Name: "per-route", Policy: limiter.Policy{Limit: 20, Period: time.Second, Algorithm: limiter.SlidingLog},
			Keyed: true, MaxKeys: limiter.DefaultMaxKeys},
		{Name: "search-total", Policy: limiter.Policy{Limit: 1000, Period: time.Minute, Algorithm: limiter.GCRA, Burst: 1000}, Group: "search"},
	}
	if !reflect.DeepEqual(c.Limiters, wantLimiters) {
		t.Errorf("limiters: got %+v, want %+v", c.Limiters, wantLimiters)
	}
	wantTenants := tenant.Config{
		Policy:     limiter.Policy{Limit: 50, Period: 30 * time.Second, Algorithm: limiter.GCRA, Burst: 5},
		IPv6Prefix: 56, MaxTenants: 1000, MaxBytes: 2 << 20,
	}
	if c.Tenants != wantTenants {
		t.Errorf("tenants: got %+v, want %+v", c.Tenants, wantTenants)
	}
	if c.ConfigFile != path {
		t.Errorf("ConfigFile: got %q, want %q", c.ConfigFile, path)
	}
}

// The keyed limiters share a budget of keys on either backend; a file that
// declares more is refused.
func TestDeclaredKeysBudget(t *testing.T) {
	const file = "limiters:\n" +
		"  - {name: a, limit: 1, period: 1s, keyed: true, max_keys: %d}\n" +
		"  - {name: b, limit: 1, period: 1s, keyed: true}\n" + // the default, 10000
		"  - {name: c, limit: 1, period: 1s}\n"
	tests := []struct {
		name    string
		maxKeys int
		backend string
		wantErr bool
	}{
		{name: "at the budget", maxKeys: limiter.KeyBudget - limiter.DefaultMaxKeys, backend: BackendMemory},
		{name: "one past the budget", maxKeys: limiter.KeyBudget - limiter.DefaultMaxKeys + 1, backend: BackendMemory, wantErr: true},
		{name: "past the budget on redis", maxKeys: limiter.KeyBudget - limiter.DefaultMaxKeys + 1, backend: BackendRedis, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, "config.yaml", fmt.Sprintf(file, tt.maxKeys))
			c, err := Load([]string{"--config", path, "--backend", tt.backend}, env(nil))
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("add up to %d", tt.maxKeys+limiter.DefaultMaxKeys)) {
					t.Errorf("got %v, want an error naming the sum of max_keys", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got := c.Limiters[0].MaxKeys + c.Limiters[1].MaxKeys + c.Limiters[2].MaxKeys; got != tt.maxKeys+limiter.DefaultMaxKeys {
				t.Errorf("got %d keys in all, want %d", got, tt.maxKeys+limiter.DefaultMaxKeys)
			}
		})
	}
}

func TestExampleFile(t *testing.T) {
	c, err := Load([]string{"--config", "../../examples/config.yaml"}, env(nil))
	if err != nil {
		t.Fatalf("examples/config.yaml: %v", err)
	}
	if len(c.Limiters) == 0 {
		t.Errorf("examples/config.yaml declares no limiters")
	}
}

func TestEmptyFile(t *testing.T) {
	c, err := Load([]string{"--config", writeFile(t, "empty.yaml", "")}, env(nil))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(c.Limiters) != 0 || c.Tenants.Policy.Limit != 100 {
		t.Errorf("an empty file changed the configuration: %+v", c)
	}
}

func TestInvalid(t *testing.T) {
	file := func(content string) []string {
		return []string{"--config", writeFile(t, "config.yaml", content)}
	}
	tokenFile := writeFile(t, "token", "s3cret")
	emptyToken := writeFile(t, "empty-token", " \n")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string // substrings of the error
	}{
		{name: "unknown flag", args: []string{"--nope"}, want: []string{"flag provided but not defined", "nope"}},
		{name: "positional argument", args: []string{"serve"}, want: []string{`unexpected argument "serve"`}},
		{name: "listen without port", args: []string{"--listen", "localhost"}, want: []string{"--listen", "host:port"}},
		{name: "listen bad port", env: map[string]string{"RATELIMITER_LISTEN": ":http"}, want: []string{"RATELIMITER_LISTEN", "port"}},
		{name: "listen port out of range", args: []string{"--listen", ":70000"}, want: []string{"--listen", "0 to 65535"}},
		{name: "unknown backend", args: []string{"--backend", "etcd"}, want: []string{"--backend", "memory", "redis"}},
		{name: "redis address", args: []string{"--redis-addrs", "a:1,redis"}, want: []string{"--redis-addrs", `"redis"`, "host:port"}},
		{name: "redis tls", env: map[string]string{"RATELIMITER_REDIS_TLS": "yes"}, want: []string{"RATELIMITER_REDIS_TLS", "true or false"}},
		{name: "redis key prefix", args: []string{"--redis-key-prefix", "a{b}"}, want: []string{"--redis-key-prefix", "braces"}},
		{name: "redis timeout", args: []string{"--redis-timeout", "0s"}, want: []string{"--redis-timeout", "positive"}},
		{name: "redis conns per node not a power of two", args: []string{"--redis-conns-per-node", "3"},
			want: []string{"--redis-conns-per-node", "power of two from 1 to 256", `"3"`}},
		{name: "redis conns per node negative", env: map[string]string{"RATELIMITER_REDIS_CONNS_PER_NODE": "-1"},
			want: []string{"RATELIMITER_REDIS_CONNS_PER_NODE", "power of two", `"-1"`}},
		{name: "redis conns per node too many", args: []string{"--redis-conns-per-node=512"},
			want: []string{"--redis-conns-per-node", "from 1 to 256", `"512"`}},
		{name: "redis conns per node not a number", env: map[string]string{"RATELIMITER_REDIS_CONNS_PER_NODE": "x"},
			want: []string{"RATELIMITER_REDIS_CONNS_PER_NODE", "power of two", `"x"`}},
		{name: "trusted proxies not a range", args: []string{"--trusted-proxies", "10.0.0.0/8,proxy"}, want: []string{"--trusted-proxies", `"proxy"`, "address range"}},
		{name: "trusted proxies with a zone", args: []string{"--trusted-proxies", "fe80::1%eth0"}, want: []string{"--trusted-proxies", "address range"}},
		{name: "trusted hops too many", args: []string{"--trusted-hops", "33"}, want: []string{"--trusted-hops", "from 0 to 32"}},
		{name: "trusted hops and proxies", args: []string{"--trusted-hops", "1"}, env: map[string]string{"RATELIMITER_TRUSTED_PROXIES": "10.0.0.1"},
			want: []string{"--trusted-hops", "RATELIMITER_TRUSTED_PROXIES", "not both"}},
		{name: "forwarded header unknown", args: []string{"--forwarded-header", "x-real-ip"}, want: []string{"--forwarded-header", "x-forwarded-for", "forwarded"}},
		{name: "redis deny cache negative", args: []string{"--redis-deny-cache", "-1"}, want: []string{"--redis-deny-cache", "from 0 to 1000000"}},
		{name: "redis deny cache too large", env: map[string]string{"RATELIMITER_REDIS_DENY_CACHE": "2000000"}, want: []string{"RATELIMITER_REDIS_DENY_CACHE", "from 0 to 1000000"}},
		{name: "tls certificate without key", env: map[string]string{"RATELIMITER_TLS_CERT_FILE": "tls.crt"},
			want: []string{"RATELIMITER_TLS_CERT_FILE", "needs its key", "--tls-key-file"}},
		{name: "tls key without certificate", args: []string{"--tls-key-file", "tls.key"},
			want: []string{"--tls-key-file", "needs its certificate", "--tls-cert-file"}},
		{name: "tls client CA without certificate", args: []string{"--tls-client-ca-file", "ca.crt"},
			want: []string{"--tls-client-ca-file", "--tls-cert-file"}},
		{name: "grpc message too large", args: []string{"--grpc-max-message-bytes", "8MiB"},
			want: []string{"--grpc-max-message-bytes", "from 1024 to 4194304"}},
		{name: "max connections zero", env: map[string]string{"RATELIMITER_MAX_CONNECTIONS": "0"},
			want: []string{"RATELIMITER_MAX_CONNECTIONS", "from 1 to 1000000"}},
		{name: "grpc idle timeout zero", args: []string{"--grpc-idle-timeout", "0s"}, want: []string{"--grpc-idle-timeout", "positive"}},
		{name: "redis failure mode", args: []string{"--redis-failure-mode", "open"}, want: []string{"--redis-failure-mode", "fail-closed", "fail-open"}},
		{name: "redis password twice", args: []string{"--redis-password", "x", "--redis-password-file", "/nonexistent"},
			want: []string{"--redis-password", "--redis-password-file", "set one"}},
		{name: "redis password file missing", args: []string{"--redis-password-file", "/nonexistent/password"},
			want: []string{"--redis-password-file", "/nonexistent/password"}},
		{name: "backend unknown", env: map[string]string{"RATELIMITER_BACKEND": "etcd"}, want: []string{"RATELIMITER_BACKEND", `unknown backend "etcd"`}},
		{name: "token and token file", args: []string{"--admin-token-file", tokenFile}, env: map[string]string{"RATELIMITER_ADMIN_TOKEN": "x"},
			want: []string{"RATELIMITER_ADMIN_TOKEN", "--admin-token-file", "both"}},
		{name: "token file missing", args: []string{"--admin-token-file", "/nonexistent/token"}, want: []string{"--admin-token-file", "no such file"}},
		{name: "token file empty", args: []string{"--admin-token-file", emptyToken}, want: []string{"--admin-token-file", "empty"}},
		{name: "token with space", args: []string{"--admin-token", "a b"}, want: []string{"--admin-token", "spaces"}},
		{name: "log level", args: []string{"--log-level", "verbose"}, want: []string{"--log-level", `"verbose"`}},
		{name: "log format", env: map[string]string{"RATELIMITER_LOG_FORMAT": "xml"}, want: []string{"RATELIMITER_LOG_FORMAT", `"xml"`}},
		{name: "max body bytes zero", args: []string{"--max-body-bytes", "0"}, want: []string{"--max-body-bytes", "from 1"}},
		{name: "max body bytes not a number", args: []string{"--max-body-bytes", "64k"}, want: []string{"--max-body-bytes", `"64k"`}},
		{name: "max header bytes too small", args: []string{"--max-header-bytes", "10"}, want: []string{"--max-header-bytes"}},
		{name: "max header bytes below what can be held to", args: []string{"--max-header-bytes", "4096"}, want: []string{"--max-header-bytes", "4097"}},
		{name: "max limiters zero", args: []string{"--max-limiters", "0"}, want: []string{"--max-limiters", "from 1 to 100000000", `"0"`}},
		{name: "max limiters too many", env: map[string]string{"RATELIMITER_MAX_LIMITERS": "100000001"},
			want: []string{"RATELIMITER_MAX_LIMITERS", "from 1 to 100000000"}},
		{name: "max limiters below the file's", args: append(file("limiters:\n  - {name: a, limit: 1, period: 1s}\n  - {name: b, limit: 1, period: 1s}\n"), "--max-limiters=1"),
			want: []string{"2 limiters are declared", "the 1 of --max-limiters", "set by --max-limiters"}},
		{name: "timeout not a duration", args: []string{"--read-timeout", "10"}, want: []string{"--read-timeout", "not a duration"}},
		{name: "timeout zero", args: []string{"--write-timeout", "0s"}, want: []string{"--write-timeout", "positive"}},
		{name: "idle timeout negative", args: []string{"--idle-timeout", "-1s"}, want: []string{"--idle-timeout", "positive"}},
		{name: "header timeout zero", args: []string{"--read-header-timeout", "0"}, want: []string{"--read-header-timeout"}},
		{name: "shutdown timeout zero", args: []string{"--shutdown-timeout", "0s"}, want: []string{"--shutdown-timeout"}},
		{name: "shutdown delay negative", args: []string{"--shutdown-delay", "-1s"}, want: []string{"--shutdown-delay", "negative"}},
		{name: "tenant limit zero", args: []string{"--tenant-limit", "0"}, want: []string{"--tenant-limit", "from 1"}},
		{name: "tenant limit too large", env: map[string]string{"RATELIMITER_TENANT_LIMIT": "2000000000"}, want: []string{"RATELIMITER_TENANT_LIMIT"}},
		{name: "tenant period", args: []string{"--tenant-period", "1"}, want: []string{"--tenant-period", "invalid policy"}},
		{name: "tenant period too short", args: []string{"--tenant-period", "1us"}, want: []string{"--tenant-period", "between"}},
		{name: "tenant algorithm", args: []string{"--tenant-algorithm", "leaky"}, want: []string{"--tenant-algorithm", `"leaky"`}},
		{name: "gc min heap below Go's own", args: []string{"--gc-min-heap", "1MiB"}, want: []string{"--gc-min-heap", "must be 0 or", "from 4MiB", `"1MiB"`}},
		{name: "gc min heap too large", env: map[string]string{"RATELIMITER_GC_MIN_HEAP": "2048GiB"}, want: []string{"RATELIMITER_GC_MIN_HEAP", "to 1024GiB"}},
		{name: "gc min heap negative", args: []string{"--gc-min-heap", "-1"}, want: []string{"--gc-min-heap", `"-1"`}},
		{name: "tenant max bytes zero", args: []string{"--tenant-max-bytes", "0"}, want: []string{"--tenant-max-bytes", "from 1"}},
		{name: "tenant max bytes unit", args: []string{"--tenant-max-bytes", "1MB"}, want: []string{"--tenant-max-bytes", "MiB", `"1MB"`}},
		{name: "tenant max bytes overflow", args: []string{"--tenant-max-bytes", "9999999999GiB"}, want: []string{"--tenant-max-bytes", `"9999999999GiB"`}},
		{name: "tenant max bytes below one requester", args: []string{"--tenant-max-bytes", "2000", "--tenant-algorithm", "sliding_log"},
			want: []string{"--tenant-max-bytes", "2000 bytes do not hold one requester", "2288 bytes", "--tenant-algorithm"}},
		{name: "tenant max bytes below one requester on redis", args: []string{"--tenant-max-bytes", "300", "--backend", "redis"},
			want: []string{"--tenant-max-bytes", "300 bytes do not hold one requester", "384 bytes", "redis backend"}},
		{name: "tenant burst negative", args: []string{"--tenant-burst", "-1"}, want: []string{"--tenant-burst"}},
		{name: "tenant burst above limit", env: map[string]string{"RATELIMITER_TENANT_BURST": "200"},
			want: []string{"per-IP policy", "RATELIMITER_TENANT_BURST", "burst"}},
		{name: "tenant burst with sliding log", args: []string{"--tenant-algorithm=sliding_log", "--tenant-burst=5"},
			want: []string{"per-IP policy", "--tenant-algorithm", "--tenant-burst"}},
		{name: "tenant ipv6 prefix", args: []string{"--tenant-ipv6-prefix", "65"}, want: []string{"--tenant-ipv6-prefix", "1 to 64"}},
		{name: "tenant max", args: []string{"--tenant-max", "0"}, want: []string{"--tenant-max"}},
		{name: "config file missing", args: []string{"--config", "/nonexistent/config.yaml"}, want: []string{"config file", "no such file"}},
		{name: "config file is a directory", args: []string{"--config", t.TempDir()}, want: []string{"config file", "regular file"}},
		{name: "file unknown top-level key", args: file("limits: []\n"), want: []string{"config file", "limits"}},
		{name: "file unknown limiter key", args: file("limiters:\n  - name: a\n    limit: 1\n    period: 1s\n    rate: 3\n"), want: []string{"rate"}},
		{name: "file unknown tenants key", args: file("tenants:\n  max: 3\n"), want: []string{"max"}},
		{name: "file duplicate key", args: file("tenants:\n  limit: 3\n  limit: 4\n"), want: []string{"limit"}},
		{name: "file not yaml", args: file("limiters: [\n"), want: []string{"config file"}},
		{name: "file wrong type", args: file("tenants:\n  limit: lots\n"), want: []string{"config file", "limit"}},
		{name: "file tenants value", args: file("tenants:\n  ipv6_prefix: 0\n"), want: []string{"tenants.ipv6_prefix in", "1 to 64"}},
		{name: "file tenants period", args: file("tenants:\n  period: 60\n"), want: []string{"tenants.period in", "invalid policy"}},
		{name: "file tenants policy", args: file("tenants:\n  limit: 10\n  burst: 20\n"),
			want: []string{"per-IP policy", "tenants.limit in", "tenants.burst in", "burst"}},
		{name: "limiter without name", args: file("limiters:\n  - limit: 1\n    period: 1s\n"), want: []string{"limiters[0]", "name is required"}},
		{name: "limiter bad name", args: file("limiters:\n  - name: -a\n    limit: 1\n    period: 1s\n"), want: []string{"limiters[0]", "invalid limiter name"}},
		{name: "limiter without limit", args: file("limiters:\n  - name: a\n    period: 1s\n"), want: []string{"limiters[0] (a)", "limit is required"}},
		{name: "limiter negative limit", args: file("limiters:\n  - name: a\n    limit: -1\n    period: 1s\n"), want: []string{"limiters[0] (a)", "limit must be"}},
		{name: "limiter without period", args: file("limiters:\n  - name: a\n    limit: 1\n"), want: []string{"limiters[0] (a)", "period is required"}},
		{name: "limiter bad period", args: file("limiters:\n  - name: a\n    limit: 1\n    period: soon\n"), want: []string{"limiters[0] (a)", `"soon"`}},
		{name: "limiter bad algorithm", args: file("limiters:\n  - name: a\n    limit: 1\n    period: 1s\n    algorithm: fixed\n"), want: []string{"limiters[0] (a)", `"fixed"`}},
		{name: "limiter burst above limit", args: file("limiters:\n  - name: a\n    limit: 1\n    period: 1s\n    burst: 2\n"), want: []string{"limiters[0] (a)", "burst"}},
		{name: "limiter burst with sliding log", args: file("limiters:\n  - name: a\n    limit: 2\n    period: 1s\n    algorithm: sliding_log\n    burst: 1\n"), want: []string{"limiters[0] (a)", "burst"}},
		{name: "limiter empty group", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, group: ''}\n"),
			want: []string{"limiters[0] (a)", "invalid group name", "leave it out"}},
		{name: "limiter bad group", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, group: 'team a'}\n"),
			want: []string{"limiters[0] (a)", "invalid group name", `"team a"`, "letters, digits"}},
		{name: "limiter group too long", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, group: " + strings.Repeat("g", 129) + "}\n"),
			want: []string{"limiters[0] (a)", "invalid group name", "1 to 128"}},
		{name: "limiter group not a string", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, group: [a]}\n"),
			want: []string{"config file", "group"}},
		{name: "limiter keyed not a boolean", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, keyed: 1}\n"),
			want: []string{"config file", "keyed"}},
		{name: "limiter max keys without keyed", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, max_keys: 10}\n"),
			want: []string{"limiters[0] (a)", "max_keys applies to keyed limiters only"}},
		{name: "limiter max keys with keyed false", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, keyed: false, max_keys: 10}\n"),
			want: []string{"limiters[0] (a)", "max_keys applies to keyed limiters only"}},
		{name: "limiter max keys zero", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 0}\n"),
			want: []string{"limiters[0] (a)", "max_keys must be between 1 and 10000000, got 0"}},
		{name: "limiter max keys negative", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, keyed: true, max_keys: -5}\n"),
			want: []string{"limiters[0] (a)", "max_keys must be between 1 and 10000000, got -5"}},
		{name: "limiter max keys too many", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 10000001}\n"),
			want: []string{"limiters[0] (a)", "max_keys must be between 1 and 10000000, got 10000001"}},
		{name: "limiter max keys not an integer", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 1.5}\n"),
			want: []string{"limiters[0] (a)", "max_keys must be an integer, got 1.5"}},
		{name: "limiter max keys as a string", args: file("limiters:\n  - {name: a, limit: 1, period: 1s, keyed: true, max_keys: '50'}\n"),
			want: []string{"limiters[0] (a)", `max_keys must be an integer, got "50"`}},
		{name: "keys beyond the budget", args: file("limiters:\n" +
			"  - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 600000}\n" +
			"  - {name: b, limit: 1, period: 1s, keyed: true, max_keys: 395000}\n" +
			"  - {name: c, limit: 1, period: 1s, keyed: true}\n"),
			want: []string{"max_keys add up to 1005000", "more than the 1000000 keys", "lower max_keys"}},
		{name: "duplicate limiter", args: file("limiters:\n  - {name: a, limit: 1, period: 1s}\n  - {name: b, limit: 1, period: 1s}\n  - {name: a, limit: 2, period: 1s}\n"),
			want: []string{"limiters[2] (a)", "duplicate", "limiters[0]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.args, env(tt.env))
			if err == nil {
				t.Fatalf("Load succeeded with %+v, want an error", c)
			}
			if errors.Is(err, flag.ErrHelp) {
				t.Fatalf("got flag.ErrHelp, want a configuration error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got error %q, want it to mention %q", err, w)
				}
			}
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		if _, err := Load([]string{arg}, env(nil)); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("Load(%s): got error %v, want flag.ErrHelp", arg, err)
		}
	}
	// --version needs no valid configuration.
	c, err := Load([]string{"--version"}, env(map[string]string{"RATELIMITER_LISTEN": "bad"}))
	if err != nil || !c.ShowVersion {
		t.Errorf("Load(--version): got %+v, %v; want ShowVersion and no error", c, err)
	}
}

func TestUsageListsEverySetting(t *testing.T) {
	var b bytes.Buffer
	Usage(&b, "ratelimiter")
	out := b.String()

	fs, _ := newFlagSet(map[string]string{})
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(out, "--"+f.Name+"\n") && !strings.Contains(out, "--"+f.Name+" ") {
			t.Errorf("usage lacks the flag --%s", f.Name)
		}
	})
	for _, s := range settings {
		for _, want := range []string{"--" + s.name + " ", s.env, s.usage[:20]} {
			if !strings.Contains(out, want) {
				t.Errorf("usage lacks %q of --%s", want, s.name)
			}
		}
		if s.def != "" && !strings.Contains(out, `default "`+s.def+`"`) {
			t.Errorf("usage lacks the default %q of --%s", s.def, s.name)
		}
		if s.file != "" && !strings.Contains(out, "file "+s.file) {
			t.Errorf("usage lacks the file key %s of --%s", s.file, s.name)
		}
		if !strings.HasPrefix(s.env, "RATELIMITER_") {
			t.Errorf("--%s: environment variable %s lacks the RATELIMITER_ prefix", s.name, s.env)
		}
	}
	for _, want := range []string{"--version", "--help", "OTEL_TRACES_EXPORTER"} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %q", want)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 100 {
			t.Errorf("usage line longer than 100 characters: %q", line)
		}
	}
}

func TestLogValueHidesToken(t *testing.T) {
	c, err := Load([]string{"--admin-token", "s3cret-token"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	slog.New(slog.NewJSONHandler(&b, nil)).Info("config", "config", c)
	if strings.Contains(b.String(), "s3cret-token") {
		t.Errorf("the logged configuration holds the admin token: %s", b.String())
	}
	if !strings.Contains(b.String(), `"admin_token_set":true`) {
		t.Errorf("the logged configuration does not say the admin token is set: %s", b.String())
	}
}
