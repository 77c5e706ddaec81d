package config

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/heapfloor"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// MinHeaderBytes is the smallest MaxHeaderBytes. Go's HTTP server reads
// 4096 bytes past its own limit, which is at least 1, before it can refuse
// a header section, so no smaller limit could be held to.
const MinHeaderBytes = 4097

// setting is one configurable value: its flag, its environment variable, its
// key in the config file if it has one, its default, and how to store a
// value written as text into a Config.
type setting struct {
	name  string // flag name, without the leading dashes
	env   string // environment variable
	file  string // key in the config file; empty when the file cannot set it
	def   string // default, written as on the command line
	arg   string // placeholder for the value in the usage text
	group string // heading under which the usage text lists it
	usage string
	apply func(c *Config, v string) error
}

// Usage groups, in the order the usage text lists them.
const (
	groupServer   = "Server"
	groupAdmin    = "Administration"
	groupTimeouts = "Timeouts and shutdown"
	groupTenants  = "Per-IP policy (applies to every requester IP address or IPv6 prefix)"
	groupLogging  = "Logging"
	groupTLS      = "TLS (both listeners)"
	groupRedis    = "Redis backend (with --backend redis)"
	groupProxies  = "Client address behind proxies (GET /v1/forward-auth)"
)

var groups = []string{groupServer, groupTLS, groupAdmin, groupTimeouts, groupTenants, groupProxies, groupRedis, groupLogging}

// settings lists every setting that has a flag and an environment variable,
// in the order their defaults, file values, environment variables and flags
// are applied.
var settings = []setting{
	{
		name: "config", env: "RATELIMITER_CONFIG", arg: "path", group: groupServer,
		usage: "YAML file declaring named limiters and the per-IP policy (see examples/config.yaml). Empty: none.",
		apply: func(c *Config, v string) error { c.ConfigFile = v; return nil },
	},
	{
		name: "listen", env: "RATELIMITER_LISTEN", def: ":8080", arg: "host:port", group: groupServer,
		usage: "TCP address to serve HTTP on. An empty host listens on every interface; port 0 picks a free port.",
		apply: func(c *Config, v string) error {
			if err := checkAddress(v); err != nil {
				return err
			}
			c.Listen = v
			return nil
		},
	},
	{
		name: "grpc-listen", env: "RATELIMITER_GRPC_LISTEN", def: ":8081", arg: "host:port", group: groupServer,
		usage: "TCP address to serve gRPC on: Envoy's rate limit service (envoy.service.ratelimit.v3), gRPC health and reflection. Empty: no gRPC.",
		apply: func(c *Config, v string) error {
			if v == "" {
				c.GRPCListen = ""
				return nil
			}
			if err := checkAddress(v); err != nil {
				return err
			}
			c.GRPCListen = v
			return nil
		},
	},
	{
		name: "envoy-config", env: "RATELIMITER_ENVOY_CONFIG", arg: "path", group: groupServer,
		usage: "envoyproxy/ratelimit configuration the gRPC rate limit service decides by: a YAML file, or a directory of *.yaml files. Empty: none, so every descriptor is under no limit.",
		apply: func(c *Config, v string) error { c.EnvoyConfigPath = v; return nil },
	},
	{
		name: "envoy-headers", env: "RATELIMITER_ENVOY_HEADERS", def: "false", arg: "bool", group: groupServer,
		usage: "Add the draft-11 RateLimit and RateLimit-Policy headers of the request's rules to every answer of the gRPC rate limit service (response_headers_to_add), for Envoy to pass on to the client.",
		apply: func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%q is not true or false", v)
			}
			c.EnvoyHeaders = b
			return nil
		},
	},
	{
		name: "backend", env: "RATELIMITER_BACKEND", def: BackendMemory, arg: "name", group: groupServer,
		usage: "Where limiter state lives: \"memory\" (this process only, for a single replica) or \"redis\" " +
			"(shared by every replica that uses the same Redis; see the Redis settings).",
		apply: func(c *Config, v string) error {
			if v != BackendMemory && v != BackendRedis {
				return fmt.Errorf("unknown backend %q (want %q or %q)", v, BackendMemory, BackendRedis)
			}
			c.Backend = v
			return nil
		},
	},
	{
		name: "data-dir", env: "RATELIMITER_DATA_DIR", arg: "path", group: groupServer,
		usage: "Directory where the memory backend keeps its limiters and their counts (the file ratelimiter.db), so that they " +
			"survive a restart: a limiter created, replaced or deleted is on disk before the answer; the counts are saved every 10s " +
			"and at shutdown, and after a crash every limit starts exhausted. Empty: nothing on disk. Created if missing; " +
			"one process at a time. Not with --backend redis.",
		apply: func(c *Config, v string) error { c.DataDir = v; return nil },
	},
	{
		name: "max-body-bytes", env: "RATELIMITER_MAX_BODY_BYTES", def: "65536", arg: "bytes", group: groupServer,
		usage: "Largest request body accepted; a larger one is refused with 413.",
		apply: integer(func(c *Config) *int64 { return &c.MaxBodyBytes }, 1, 1<<30),
	},
	{
		name: "max-header-bytes", env: "RATELIMITER_MAX_HEADER_BYTES", def: "16384", arg: "bytes", group: groupServer,
		usage: "Largest request header section accepted, in bytes: the request line, the header lines and the blank " +
			"line after them, CRLFs included; a larger one is refused with 431.",
		apply: integer(func(c *Config) *int { return &c.MaxHeaderBytes }, MinHeaderBytes, 1<<20),
	},
	{
		name: "max-connections", env: "RATELIMITER_MAX_CONNECTIONS", def: "1024", arg: "count", group: groupServer,
		usage: "Most connections the HTTP listener holds open at once, from 1 to 1000000, and most HTTP/2 requests in " +
			"flight over all of them. A connection past it closes the one that has read nothing for longest, preferring " +
			"those between requests, so that health checks are still answered.",
		apply: integer(func(c *Config) *int { return &c.Listeners.MaxConnections }, 1, 1_000_000),
	},
	{
		name: "grpc-max-connections", env: "RATELIMITER_GRPC_MAX_CONNECTIONS", def: "512", arg: "count", group: groupServer,
		usage: "Most connections the gRPC listener holds open at once, from 1 to 1000000. A connection past it closes " +
			"the one that has sent nothing for longest.",
		apply: integer(func(c *Config) *int { return &c.Listeners.GRPCMaxConnections }, 1, 1_000_000),
	},
	{
		name: "grpc-max-message-bytes", env: "RATELIMITER_GRPC_MAX_MESSAGE_BYTES", def: "64KiB", arg: "bytes", group: groupServer,
		usage: "Largest gRPC request message accepted, in bytes or with a KiB or MiB suffix, from 1KiB to 4MiB; a larger " +
			"one is refused with RESOURCE_EXHAUSTED before it is read.",
		apply: func(c *Config, v string) error {
			var n int64
			if err := byteSize(func(*Config) *int64 { return &n }, 1<<10, 4<<20)(c, v); err != nil {
				return err
			}
			c.Listeners.GRPCMaxMessageBytes = int(n)
			return nil
		},
	},
	{
		name: "grpc-max-streams", env: "RATELIMITER_GRPC_MAX_STREAMS", def: "512", arg: "count", group: groupServer,
		usage: "Most gRPC calls in flight at once over all connections, from 1 to 1000000 (and at most 100 on one " +
			"connection); one more is refused with RESOURCE_EXHAUSTED. With --grpc-max-message-bytes it bounds the memory " +
			"held by requests being received.",
		apply: integer(func(c *Config) *int { return &c.Listeners.GRPCMaxStreams }, 1, 1_000_000),
	},
	{
		name: "tls-cert-file", env: "RATELIMITER_TLS_CERT_FILE", arg: "path", group: groupTLS,
		usage: "PEM certificate chain both listeners serve TLS with (HTTP/1.1 and HTTP/2 on the HTTP listener). " +
			"Re-read when it changes, checked at most once a second; a pair that does not load is logged and the " +
			"previous one kept. Empty: plain TCP.",
		apply: func(c *Config, v string) error { c.Listeners.TLSCertFile = v; return nil },
	},
	{
		name: "tls-key-file", env: "RATELIMITER_TLS_KEY_FILE", arg: "path", group: groupTLS,
		usage: "PEM private key of --tls-cert-file; set both or neither.",
		apply: func(c *Config, v string) error { c.Listeners.TLSKeyFile = v; return nil },
	},
	{
		name: "tls-client-ca-file", env: "RATELIMITER_TLS_CLIENT_CA_FILE", arg: "path", group: groupTLS,
		usage: "PEM bundle of the certificate authorities client certificates must chain to: every client of both " +
			"listeners must then present one (probes too: see the probe subcommand). Re-read when it changes. " +
			"Empty: clients are not asked for a certificate.",
		apply: func(c *Config, v string) error { c.Listeners.TLSClientCAFile = v; return nil },
	},
	{
		name: "max-limiters", env: "RATELIMITER_MAX_LIMITERS", def: strconv.Itoa(limiter.DefaultMaxLimiters), arg: "count", group: groupServer,
		usage: "Most named limiters the backend holds, those of the config file included. Creating one more is refused " +
			"with 409; replacing one is not. On Redis the bound is shared by every replica using the same key prefix.",
		apply: integer(func(c *Config) *int { return &c.MaxLimiters }, 1, 100_000_000),
	},
	{
		name: "metrics-max-limiters", env: "RATELIMITER_METRICS_MAX_LIMITERS", def: "1000", arg: "count", group: groupServer,
		usage: "Named limiters the decision metrics label by name at once, from 1 to 100000; the decisions of the others " +
			"are counted under limiter=\"_other\". A deleted limiter, or one without a decision for an hour, gives its place back.",
		apply: integer(func(c *Config) *int { return &c.MetricsMaxLimiters }, 1, 100_000),
	},
	{
		name: "gc-min-heap", env: "RATELIMITER_GC_MIN_HEAP", def: "32MiB", arg: "bytes", group: groupServer,
		usage: "Heap size the garbage collector lets the process reach before it collects, in bytes or with a KiB, MiB or GiB " +
			"suffix, from 4MiB to 1024GiB, or 0 for Go's own pacing. Under load a small heap is then collected a few times a " +
			"second rather than tens of times, which saves CPU, for up to this much memory; once half of it or more is live, " +
			"Go's own pacing (GOGC=100) applies. Not applied when GOGC is set in the environment.",
		apply: func(c *Config, v string) error {
			if v == "0" {
				c.GCMinHeap = 0
				return nil
			}
			if byteSize(func(c *Config) *int64 { return &c.GCMinHeap }, heapfloor.Min, heapfloor.Max)(c, v) != nil {
				return fmt.Errorf("must be 0 or a number of bytes from 4MiB to 1024GiB (%d to %d, or with a KiB, MiB or GiB suffix), got %q",
					heapfloor.Min, heapfloor.Max, v)
			}
			return nil
		},
	},
	{
		name: "admin-token", env: "RATELIMITER_ADMIN_TOKEN", arg: "token", group: groupAdmin,
		usage: "Bearer token required to create, replace and delete limiters. Empty: those operations are open to every " +
			"caller. Prefer --admin-token-file or the environment variable: flags are visible to every local user.",
		apply: func(c *Config, v string) error {
			if err := checkToken(v); err != nil {
				return err
			}
			c.AdminToken = v
			return nil
		},
	},
	{
		name: "admin-token-file", env: "RATELIMITER_ADMIN_TOKEN_FILE", arg: "path", group: groupAdmin,
		usage: "File holding the admin token (surrounding whitespace is ignored), such as a mounted secret. " +
			"Setting both the token and the token file is an error.",
		apply: func(c *Config, v string) error { c.adminTokenFile = v; return nil },
	},
	{
		name: "tokens-file", env: "RATELIMITER_TOKENS_FILE", arg: "path", group: groupAdmin,
		usage: "YAML file of bearer tokens, each with a name, its SHA-256 in hex (or the token itself) and its scopes: " +
			"admin (create, replace and delete limiters), decide (take and look at permits, read definitions; gRPC " +
			"ShouldRateLimit too) and adjust (charge, refund, settle, cancel). Reread when it changes; a broken file is " +
			"logged and the tokens in force stay. A scope no token has (with neither this file nor the admin token: " +
			"every scope) is open to every caller, and named in a warning and in /readyz. Empty: none.",
		apply: func(c *Config, v string) error { c.TokensFile = v; return nil },
	},
	{
		name: "read-header-timeout", env: "RATELIMITER_READ_HEADER_TIMEOUT", def: "5s", arg: "duration", group: groupTimeouts,
		usage: "Time allowed to read a request's headers.",
		apply: duration(func(c *Config) *time.Duration { return &c.ReadHeaderTimeout }, false),
	},
	{
		name: "read-timeout", env: "RATELIMITER_READ_TIMEOUT", def: "10s", arg: "duration", group: groupTimeouts,
		usage: "Time allowed to read a whole request, body included.",
		apply: duration(func(c *Config) *time.Duration { return &c.ReadTimeout }, false),
	},
	{
		name: "write-timeout", env: "RATELIMITER_WRITE_TIMEOUT", def: "10s", arg: "duration", group: groupTimeouts,
		usage: "Time allowed from the end of the request headers to the end of the response.",
		apply: duration(func(c *Config) *time.Duration { return &c.WriteTimeout }, false),
	},
	{
		name: "idle-timeout", env: "RATELIMITER_IDLE_TIMEOUT", def: "60s", arg: "duration", group: groupTimeouts,
		usage: "Time a kept-alive connection may wait for its next request.",
		apply: duration(func(c *Config) *time.Duration { return &c.IdleTimeout }, false),
	},
	{
		name: "grpc-idle-timeout", env: "RATELIMITER_GRPC_IDLE_TIMEOUT", def: "5m", arg: "duration", group: groupTimeouts,
		usage: "Time a gRPC connection may stay open without a call; it is then closed with GOAWAY, and a client " +
			"such as Envoy opens a new one for its next call.",
		apply: duration(func(c *Config) *time.Duration { return &c.Listeners.GRPCIdleTimeout }, false),
	},
	{
		name: "shutdown-delay", env: "RATELIMITER_SHUTDOWN_DELAY", def: "0s", arg: "duration", group: groupTimeouts,
		usage: "On SIGTERM or SIGINT, time during which /readyz reports not ready while requests are still served, " +
			"each answer closing its connection, so that load balancers and clients move elsewhere before the listener closes. " +
			"Kubernetes deployments set a few seconds.",
		apply: duration(func(c *Config) *time.Duration { return &c.ShutdownDelay }, true),
	},
	{
		name: "shutdown-timeout", env: "RATELIMITER_SHUTDOWN_TIMEOUT", def: "20s", arg: "duration", group: groupTimeouts,
		usage: "After the shutdown delay, time allowed for in-flight requests to finish and telemetry to flush; " +
			"connections still open then are closed.",
		apply: duration(func(c *Config) *time.Duration { return &c.ShutdownTimeout }, false),
	},
	{
		name: "tenant-limit", env: "RATELIMITER_TENANT_LIMIT", file: "tenants.limit", def: "100", arg: "permits", group: groupTenants,
		usage: fmt.Sprintf("Permits each requester may take per period, from 1 to %d.", int64(limiter.MaxLimit)),
		apply: integer(func(c *Config) *int64 { return &c.Tenants.Policy.Limit }, 1, limiter.MaxLimit),
	},
	{
		name: "tenant-period", env: "RATELIMITER_TENANT_PERIOD", file: "tenants.period", def: "1m", arg: "duration", group: groupTenants,
		usage: fmt.Sprintf("Window the per-IP limit applies to, such as 1s, 1m or 1h, from %s to %s.", limiter.MinPeriod, limiter.MaxPeriod),
		apply: func(c *Config, v string) error {
			d, err := limiter.ParsePeriod(v)
			if err != nil {
				return err
			}
			c.Tenants.Policy.Period = d
			return nil
		},
	},
	{
		name: "tenant-algorithm", env: "RATELIMITER_TENANT_ALGORITHM", file: "tenants.algorithm", def: string(limiter.GCRA), arg: "name", group: groupTenants,
		usage: "\"gcra\" (a token bucket: smooth, allows bursts up to the burst size) or \"sliding_log\" " +
			"(never more than the limit in any window of one period).",
		apply: func(c *Config, v string) error {
			a, err := algorithm(v)
			if err != nil {
				return err
			}
			c.Tenants.Policy.Algorithm = a
			return nil
		},
	},
	{
		name: "tenant-burst", env: "RATELIMITER_TENANT_BURST", file: "tenants.burst", def: "0", arg: "permits", group: groupTenants,
		usage: "For gcra, permits a requester may take at once from a full bucket, from 1 to the limit; 0 means the limit. " +
			"Must be 0 for sliding_log.",
		apply: integer(func(c *Config) *int64 { return &c.Tenants.Policy.Burst }, 0, limiter.MaxLimit),
	},
	{
		name: "tenant-ipv6-prefix", env: "RATELIMITER_TENANT_IPV6_PREFIX", file: "tenants.ipv6_prefix", def: "64", arg: "bits", group: groupTenants,
		usage: "IPv6 requesters are grouped by this prefix length, from 1 to 64, since one host often holds a whole /64.",
		apply: integer(func(c *Config) *int { return &c.Tenants.IPv6Prefix }, 1, 64),
	},
	{
		name: "tenant-max", env: "RATELIMITER_TENANT_MAX", file: "tenants.max_tenants", def: "1000000", arg: "count", group: groupTenants,
		usage: "Most requesters tracked at once: bounds the memory the per-IP state uses.",
		apply: integer(func(c *Config) *int { return &c.Tenants.MaxTenants }, 1, 1_000_000_000),
	},
	{
		name: "tenant-max-bytes", env: "RATELIMITER_TENANT_MAX_BYTES", file: "tenants.max_bytes", def: "256MiB", arg: "bytes", group: groupTenants,
		usage: "Most memory the per-IP state may take under a spray of distinct addresses, in bytes or with a KiB, MiB " +
			"or GiB suffix; lowers --tenant-max to what " +
			"it holds, after 640 KiB for the tables, at the policy's worst case per requester (memory backend: 48 bytes under GCRA; under the sliding " +
			"log 240 plus 16 per slot of its log, a power of two at or above min(limit, 4096); Redis backend: 384 bytes " +
			"under GCRA; under the sliding log 512 plus 16 per log element up to 128 elements, 160 per element above, " +
			"with 1 + min(limit, 4096) elements).",
		apply: byteSize(func(c *Config) *int64 { return &c.Tenants.MaxBytes }, 1, 1<<50),
	},
	{
		name: "trusted-proxies", env: "RATELIMITER_TRUSTED_PROXIES", arg: "cidr,...", group: groupProxies,
		usage: "Address ranges of the reverse proxies in front of the service, such as 10.0.0.0/8,fd00::/8. A request " +
			"from one of them is from the rightmost address of its forwarding header that is not in one; from any " +
			"other peer, from the peer. Empty: none, so the peer is always the client.",
		apply: func(c *Config, v string) error {
			c.ClientIP.Trusted = nil
			if v == "" {
				return nil
			}
			for _, f := range strings.Split(v, ",") {
				f = strings.TrimSpace(f)
				p, err := netip.ParsePrefix(f)
				if err != nil {
					a, aerr := netip.ParseAddr(f)
					if aerr != nil || a.Zone() != "" {
						return fmt.Errorf("%q is not an address range such as 10.0.0.0/8 or an address", f)
					}
					p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
				}
				if p.Addr().Is4In6() {
					p = netip.PrefixFrom(p.Addr().Unmap(), max(0, p.Bits()-96))
				}
				c.ClientIP.Trusted = append(c.ClientIP.Trusted, p.Masked())
			}
			return nil
		},
	},
	{
		name: "trusted-hops", env: "RATELIMITER_TRUSTED_HOPS", def: "0", arg: "count", group: groupProxies,
		usage: fmt.Sprintf("Instead of --trusted-proxies: the number of proxies every request passes, from 1 to %d; "+
			"the client is the address that many hops left of the peer in the forwarding header. 0: off.", forwardauth.MaxTrustedHops),
		apply: integer(func(c *Config) *int { return &c.ClientIP.Hops }, 0, forwardauth.MaxTrustedHops),
	},
	{
		name: "forwarded-header", env: "RATELIMITER_FORWARDED_HEADER", def: forwardauth.XForwardedFor, arg: "name", group: groupProxies,
		usage: "The header the trusted proxies append the client's address to: x-forwarded-for, or forwarded (RFC 7239). " +
			"The other is ignored, so that a client cannot set it.",
		apply: func(c *Config, v string) error {
			v = strings.ToLower(v)
			if v != forwardauth.XForwardedFor && v != forwardauth.Forwarded {
				return fmt.Errorf("must be %s or %s, got %q", forwardauth.XForwardedFor, forwardauth.Forwarded, v)
			}
			c.ClientIP.Header = v
			return nil
		},
	},
	{
		name: "redis-addrs", env: "RATELIMITER_REDIS_ADDRS", def: "localhost:6379", arg: "host:port,...", group: groupRedis,
		usage: "Redis server address, or comma-separated seed addresses of a Redis Cluster (the other nodes are discovered).",
		apply: func(c *Config, v string) error {
			var addrs []string
			for _, a := range strings.Split(v, ",") {
				a = strings.TrimSpace(a)
				if _, _, err := net.SplitHostPort(a); err != nil {
					return fmt.Errorf("%q is not a host:port address such as \"redis:6379\"", a)
				}
				addrs = append(addrs, a)
			}
			c.Redis.Addrs = addrs
			return nil
		},
	},
	{
		name: "redis-username", env: "RATELIMITER_REDIS_USERNAME", arg: "name", group: groupRedis,
		usage: "Redis ACL user name. Empty: the default user.",
		apply: func(c *Config, v string) error { c.Redis.Username = v; return nil },
	},
	{
		name: "redis-password", env: "RATELIMITER_REDIS_PASSWORD", arg: "password", group: groupRedis,
		usage: "Redis password. Empty: none. Prefer --redis-password-file or the environment variable.",
		apply: func(c *Config, v string) error { c.Redis.Password = v; return nil },
	},
	{
		name: "redis-password-file", env: "RATELIMITER_REDIS_PASSWORD_FILE", arg: "path", group: groupRedis,
		usage: "File holding the Redis password (surrounding whitespace is ignored), such as a mounted secret. " +
			"Setting both the password and the password file is an error.",
		apply: func(c *Config, v string) error { c.redisPasswordFile = v; return nil },
	},
	{
		name: "redis-tls", env: "RATELIMITER_REDIS_TLS", def: "false", arg: "bool", group: groupRedis,
		usage: "Connect to Redis over TLS.",
		apply: func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%q is not true or false", v)
			}
			c.Redis.TLS = b
			return nil
		},
	},
	{
		name: "redis-tls-ca-file", env: "RATELIMITER_REDIS_TLS_CA_FILE", arg: "path", group: groupRedis,
		usage: "PEM file of the certificate authorities that sign the Redis server's certificate. Empty: the system's.",
		apply: func(c *Config, v string) error { c.Redis.TLSCAFile = v; return nil },
	},
	{
		name: "redis-key-prefix", env: "RATELIMITER_REDIS_KEY_PREFIX", def: "ratelimiter:", arg: "prefix", group: groupRedis,
		usage: "Prefix of every key the service writes, so that several deployments can share one Redis. " +
			"At most 64 printable characters, without braces or spaces.",
		apply: func(c *Config, v string) error {
			if len(v) > 64 || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r > '~' || r == '{' || r == '}' }) {
				return fmt.Errorf("%q must be at most 64 printable ASCII characters without braces or spaces", v)
			}
			c.Redis.KeyPrefix = v
			return nil
		},
	},
	{
		name: "redis-timeout", env: "RATELIMITER_REDIS_TIMEOUT", def: "50ms", arg: "duration", group: groupRedis,
		usage: "Longest wait for Redis to answer one decision; past it the decision follows the failure mode.",
		apply: duration(func(c *Config) *time.Duration { return &c.Redis.Timeout }, false),
	},
	{
		name: "redis-dial-timeout", env: "RATELIMITER_REDIS_DIAL_TIMEOUT", def: "1s", arg: "duration", group: groupRedis,
		usage: "Longest wait to open a connection to a Redis node.",
		apply: duration(func(c *Config) *time.Duration { return &c.Redis.DialTimeout }, false),
	},
	{
		name: "redis-conns-per-node", env: "RATELIMITER_REDIS_CONNS_PER_NODE", def: "0", arg: "count", group: groupRedis,
		usage: fmt.Sprintf("Connections to each Redis node that commands are pipelined over: a power of two from 1 to %d. "+
			"0: the client's default, for a standalone server 1, 2 or 4 by GOMAXPROCS (the CPUs the process may use), "+
			"for a Cluster 1 per node.",
			MaxConnsPerNode),
		apply: func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || n > MaxConnsPerNode || n&(n-1) != 0 {
				return fmt.Errorf("must be 0 or a power of two from 1 to %d (1, 2, 4, 8, ...), got %q", MaxConnsPerNode, v)
			}
			c.Redis.ConnsPerNode = int(n)
			return nil
		},
	},
	{
		name: "redis-deny-cache", env: "RATELIMITER_REDIS_DENY_CACHE", def: "10000", arg: "count", group: groupRedis,
		usage: fmt.Sprintf("Limiters and keys whose denials a replica remembers, from 0 to %d: a decision (a descriptor, "+
			"POST /v1/decide or /v1/peek) that an earlier answer from Redis proves would be denied is denied without "+
			"asking Redis. 0: every decision asks Redis.", MaxDenyCache),
		apply: integer(func(c *Config) *int { return &c.Redis.DenyCache }, 0, MaxDenyCache),
	},
	{
		name: "redis-failure-mode", env: "RATELIMITER_REDIS_FAILURE_MODE", def: FailClosed, arg: "mode", group: groupRedis,
		usage: "What a decision is when Redis cannot answer in time: \"fail-closed\" denies it (and /readyz reports " +
			"not ready while Redis is unreachable), \"fail-open\" allows it. Either way the answer says it was made " +
			"without Redis.",
		apply: func(c *Config, v string) error {
			if v != FailClosed && v != FailOpen {
				return fmt.Errorf("unknown failure mode %q (want %q or %q)", v, FailClosed, FailOpen)
			}
			c.Redis.FailureMode = v
			return nil
		},
	},
	{
		name: "log-level", env: "RATELIMITER_LOG_LEVEL", def: "info", arg: "level", group: groupLogging,
		usage: "Least severe level logged: debug, info, warn or error.",
		apply: func(c *Config, v string) error {
			l, ok := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}[v]
			if !ok {
				return fmt.Errorf("unknown log level %q (want debug, info, warn or error)", v)
			}
			c.LogLevel = l
			return nil
		},
	},
	{
		name: "log-format", env: "RATELIMITER_LOG_FORMAT", def: LogJSON, arg: "format", group: groupLogging,
		usage: "\"json\" (one JSON object a line, for log collectors) or \"text\" (key=value, for people).",
		apply: func(c *Config, v string) error {
			if v != LogJSON && v != LogText {
				return fmt.Errorf("unknown log format %q (want %q or %q)", v, LogJSON, LogText)
			}
			c.LogFormat = v
			return nil
		},
	},
}

// integer stores a decimal integer from min to max into the field.
func integer[T int | int64](field func(*Config) *T, min, max T) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < int64(min) || n > int64(max) {
			return fmt.Errorf("must be an integer from %d to %d, got %q", min, max, v)
		}
		*field(c) = T(n)
		return nil
	}
}

// byteSize stores a number of bytes from min to max into the field: a
// decimal integer, or one followed by KiB, MiB or GiB.
func byteSize(field func(*Config) *int64, min, max int64) func(*Config, string) error {
	return func(c *Config, v string) error {
		num, unit := v, int64(1)
		for suffix, u := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
			if n, ok := strings.CutSuffix(v, suffix); ok {
				num, unit = n, u
			}
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n < min/unit || n > max/unit || n*unit < min {
			return fmt.Errorf("must be a number of bytes from %d to %d (or with a KiB, MiB or GiB suffix), got %q", min, max, v)
		}
		*field(c) = n * unit
		return nil
	}
}

// duration stores a Go duration into the field; it must be positive, or
// zero when zeroOK.
func duration(field func(*Config) *time.Duration, zeroOK bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%q is not a duration such as \"500ms\", \"10s\" or \"1m\"", v)
		}
		if d < 0 || d == 0 && !zeroOK {
			if zeroOK {
				return fmt.Errorf("must not be negative, got %q", v)
			}
			return fmt.Errorf("must be positive, got %q", v)
		}
		*field(c) = d
		return nil
	}
}

func algorithm(v string) (limiter.Algorithm, error) {
	switch a := limiter.Algorithm(v); a {
	case limiter.GCRA, limiter.SlidingLog:
		return a, nil
	}
	return "", fmt.Errorf("unknown algorithm %q (want %q or %q)", v, limiter.GCRA, limiter.SlidingLog)
}

// checkToken rejects tokens that cannot travel in an Authorization header.
func checkToken(v string) error {
	if strings.IndexFunc(v, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
		return fmt.Errorf("the admin token must not contain spaces or control characters")
	}
	return nil
}

// checkAddress tells what is wrong with a host:port address to listen on.
func checkAddress(v string) error {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("%q is not a host:port address such as \":8080\" or \"127.0.0.1:8080\"", v)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n > 65535 {
		return fmt.Errorf("port %q of %q must be a number from 0 to 65535", port, v)
	}
	return nil
}
