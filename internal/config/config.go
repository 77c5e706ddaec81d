// Package config reads the service's settings from command-line flags,
// RATELIMITER_* environment variables and an optional YAML file, and checks
// them.
//
// Each setting is taken from, in order of precedence: its flag, its
// environment variable (an empty variable counts as unset), the config file
// (for the settings it can hold), then its default. Usage writes the list of
// settings.
//
// The config file, named by --config or RATELIMITER_CONFIG, declares named
// limiters, created at start-up, and the per-IP policy. Unknown keys are
// errors. A limiter's keys mean what they mean to PUT /v1/limiters/{name}
// and are checked by the same rules: group by the rule of limiter names,
// max_keys only with keyed. The max_keys of the keyed limiters add up to
// at most limiter.KeyBudget. A limiter's group is
// fixed when it is created: one that already exists in another group (on
// Redis, created through the API or by another configuration) is not
// moved, and the service logs that it was not created. Every key but a
// limiter's name, limit and period is optional:
//
//	limiters:                  # created, or replaced, at start-up
//	  - name: google-read      # letters, digits, '.', '_', '-'
//	    limit: 2000            # permits per period
//	    period: 100s           # a Go duration: 1s, 1m, 1h30m
//	  - name: payments-api
//	    limit: 5
//	    period: 1m
//	    algorithm: sliding_log # gcra (default) or sliding_log
//	    burst: 0               # gcra only: permits at once, 0 means limit
//	  - name: search-per-user
//	    limit: 100
//	    period: 1m
//	    group: search          # decided together with the group's others
//	    keyed: true            # one bucket per key (user, API key, route)
//	    max_keys: 50000        # keyed only: keys remembered at once, 1 to
//	                           # 10000000; 10000 when left out
//	tenants:                   # the per-IP policy (--tenant-* flags)
//	  limit: 100
//	  period: 1m
//	  algorithm: gcra
//	  burst: 0
//	  ipv6_prefix: 64
//	  max_tenants: 1000000
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/rls"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
	tenantredis "github.com/ratelimiter/ratelimiter/internal/tenant/redis"
)

// Values of Config.Backend.
const (
	BackendMemory = "memory"
	BackendRedis  = "redis"
)

// Values of Redis.FailureMode.
const (
	FailClosed = "fail-closed"
	FailOpen   = "fail-open"
)

// Redis configures the Redis backend.
type Redis struct {
	// Addrs are host:port addresses: one standalone server, or seeds of a
	// Redis Cluster.
	Addrs []string
	// Username and Password authenticate; empty means none. The password
	// is never logged.
	Username, Password string
	// TLS connects over TLS, trusting the authorities in TLSCAFile, or the
	// system's when it is empty.
	TLS       bool
	TLSCAFile string
	// KeyPrefix starts every key the service writes.
	KeyPrefix string
	// Timeout bounds one decision's round trip; DialTimeout one connection.
	Timeout, DialTimeout time.Duration
	// ConnsPerNode is how many connections to each Redis node commands are
	// pipelined over: a power of two from 1 to MaxConnsPerNode, or 0 for
	// the client library's default (for a standalone server 1, 2 or 4 by
	// GOMAXPROCS; for a Redis Cluster 1 per node).
	ConnsPerNode int
	// FailureMode is FailClosed or FailOpen: the decision when Redis does
	// not answer within Timeout.
	FailureMode string
	// DenyCache is how many limiters and keys a replica remembers the
	// denials of, to deny without asking Redis a decision that Redis would
	// deny (see redis.Store.CacheDenials); 0 turns it off.
	DenyCache int
}

// MaxDenyCache is the largest value of Redis.DenyCache.
const MaxDenyCache = 1_000_000

// MaxConnsPerNode is the largest value of Redis.ConnsPerNode.
const MaxConnsPerNode = 256

// Listeners is what bounds the service's two listeners, and their TLS
// files. Every field is set; the TLS paths are all empty (no TLS), or the
// certificate and key both set.
type Listeners struct {
	// MaxConnections is the most connections the HTTP listener holds
	// open at once; GRPCMaxConnections the gRPC listener's.
	MaxConnections     int
	GRPCMaxConnections int
	// GRPCMaxMessageBytes is the largest gRPC request message accepted.
	GRPCMaxMessageBytes int
	// GRPCMaxStreams is the most gRPC calls in flight at once, over all
	// connections.
	GRPCMaxStreams int
	// GRPCIdleTimeout is how long a gRPC connection without a call stays
	// open.
	GRPCIdleTimeout time.Duration
	// TLSCertFile and TLSKeyFile are the PEM certificate chain and key
	// both listeners serve TLS with; empty: plain TCP.
	TLSCertFile string
	TLSKeyFile  string
	// TLSClientCAFile is the PEM bundle client certificates must chain
	// to; empty: clients are not asked for one. Set only with TLSCertFile.
	TLSClientCAFile string
}

// Values of Config.LogFormat.
const (
	LogJSON = "json"
	LogText = "text"
)

// Config is the service's configuration, checked: every field holds a usable
// value.
type Config struct {
	// ConfigFile is the YAML file the limiters and per-IP policy were read
	// from; empty when none.
	ConfigFile string
	// Listen is the TCP address to serve on, host:port; port 0 picks one.
	Listen string
	// GRPCListen is the TCP address to serve gRPC on; empty: none.
	GRPCListen string
	// EnvoyConfigPath is the envoyproxy/ratelimit configuration, a file or
	// a directory, that Envoy is its rules; empty when none.
	EnvoyConfigPath string
	// EnvoyHeaders adds the draft-11 rate-limit headers to the gRPC rate
	// limit service's answers.
	EnvoyHeaders bool
	// Envoy is the configuration read from EnvoyConfigPath, nil when none.
	// Its rules' limiters count, with Limiters, against MaxLimiters and the
	// budget of keys.
	Envoy *rls.Config
	// Backend is where limiter state lives: BackendMemory or BackendRedis.
	Backend string
	// DataDir is where the memory backend keeps its limiters on disk;
	// empty keeps nothing on disk. It is refused with BackendRedis.
	DataDir string
	// Redis configures the Redis backend; set whatever Backend is, used
	// only when it is BackendRedis.
	Redis Redis
	// AdminToken is the bearer token limiter mutations require; empty
	// means they are open. It is never logged.
	AdminToken string
	// TokensFile is the file of bearer tokens with scopes (see package
	// auth); empty for none.
	TokensFile string
	// LogLevel is the least severe level logged.
	LogLevel slog.Level
	// LogFormat is LogJSON or LogText.
	LogFormat string
	// MaxBodyBytes is the largest request body accepted.
	MaxBodyBytes int64
	// MaxHeaderBytes is the largest request header section accepted, in
	// bytes: the request line, the header lines and the blank line that
	// ends them, each with its CRLF. It is at least MinHeaderBytes; the
	// server refuses a larger section with 431.
	MaxHeaderBytes int
	// Listeners bounds the connections of both listeners, the gRPC
	// server's calls and messages, and holds their TLS files.
	Listeners Listeners
	// MaxLimiters is the most named limiters the backend holds: creating
	// one more is refused, replacing one is not. At least the number of
	// Limiters.
	MaxLimiters int
	// MetricsMaxLimiters is how many limiters the decision metrics label
	// by name at once.
	MetricsMaxLimiters int
	// GCMinHeap is the heap goal the garbage collector keeps to at least
	// (see heapfloor), 0 for Go's own pacing; from heapfloor.Min to
	// heapfloor.Max otherwise.
	GCMinHeap int64
	// Timeouts of the HTTP server (see net/http.Server).
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	// ShutdownDelay is how long readiness reports false, while requests
	// are still served, before the listener closes. Zero skips the wait.
	ShutdownDelay time.Duration
	// ShutdownTimeout is the time allowed after the delay for in-flight
	// requests to finish and telemetry to flush.
	ShutdownTimeout time.Duration
	// Tenants is the per-IP policy and the registry's bounds; its Policy
	// is valid and normalized.
	Tenants tenant.Config
	// Limiters are the named limiters to create at start-up, in file order,
	// valid (names, policies, groups and keyed settings) and normalized; no
	// two share a name. Their MaxKeys add up to at most
	// limiter.KeyBudget.
	Limiters []limiter.Definition
	// ForwardAuth is the forward_auth section of the configuration file,
	// checked against Limiters, with the client-address settings in its
	// ClientIP; nil when there is none.
	ForwardAuth *forwardauth.Config
	// ClientIP is how the forward-auth endpoint finds a request's client
	// (--trusted-proxies, --trusted-hops, --forwarded-header).
	ClientIP forwardauth.ClientIP
	// ShowVersion reports that --version was given: the caller prints its
	// version and exits. No other field is set then.
	ShowVersion bool

	adminTokenFile    string
	redisPasswordFile string
}

// LogValue describes c for a log record, leaving out the admin token.
// Durations are written as text ("10s"), not as nanoseconds.
func (c Config) LogValue() slog.Value {
	names := make([]string, len(c.Limiters))
	for i, d := range c.Limiters {
		names[i] = d.Name
	}
	p := c.Tenants.Policy
	return slog.GroupValue(
		slog.String("config_file", c.ConfigFile),
		slog.String("listen", c.Listen),
		slog.String("backend", c.Backend),
		slog.Bool("admin_token_set", c.AdminToken != ""),
		slog.String("tokens_file", c.TokensFile),
		slog.Int64("max_body_bytes", c.MaxBodyBytes),
		slog.Int("max_header_bytes", c.MaxHeaderBytes),
		slog.String("data_dir", c.DataDir),
		slog.Group("listeners",
			slog.Int("max_connections", c.Listeners.MaxConnections),
			slog.Int("grpc_max_connections", c.Listeners.GRPCMaxConnections),
			slog.Int("grpc_max_message_bytes", c.Listeners.GRPCMaxMessageBytes),
			slog.Int("grpc_max_streams", c.Listeners.GRPCMaxStreams),
			slog.String("grpc_idle_timeout", c.Listeners.GRPCIdleTimeout.String()),
			slog.String("tls_cert_file", c.Listeners.TLSCertFile),
			slog.String("tls_key_file", c.Listeners.TLSKeyFile),
			slog.String("tls_client_ca_file", c.Listeners.TLSClientCAFile),
		),
		slog.Int("max_limiters", c.MaxLimiters),
		slog.Int("metrics_max_limiters", c.MetricsMaxLimiters),
		slog.Int64("gc_min_heap", c.GCMinHeap),
		slog.String("read_header_timeout", c.ReadHeaderTimeout.String()),
		slog.String("read_timeout", c.ReadTimeout.String()),
		slog.String("write_timeout", c.WriteTimeout.String()),
		slog.String("idle_timeout", c.IdleTimeout.String()),
		slog.String("shutdown_delay", c.ShutdownDelay.String()),
		slog.String("shutdown_timeout", c.ShutdownTimeout.String()),
		slog.Group("tenants",
			slog.Int64("limit", p.Limit),
			slog.String("period", limiter.FormatPeriod(p.Period)),
			slog.String("algorithm", string(p.Algorithm)),
			slog.Int64("burst", p.Burst),
			slog.Int("ipv6_prefix", c.Tenants.IPv6Prefix),
			slog.Int("max_tenants", c.Tenants.MaxTenants),
			slog.Int64("max_bytes", c.Tenants.MaxBytes),
		),
		slog.Any("limiters", names),
		slog.Group("redis",
			slog.Any("addrs", c.Redis.Addrs),
			slog.String("username", c.Redis.Username),
			slog.Bool("password_set", c.Redis.Password != ""),
			slog.Bool("tls", c.Redis.TLS),
			slog.String("tls_ca_file", c.Redis.TLSCAFile),
			slog.String("key_prefix", c.Redis.KeyPrefix),
			slog.String("timeout", c.Redis.Timeout.String()),
			slog.String("dial_timeout", c.Redis.DialTimeout.String()),
			slog.Int("conns_per_node", c.Redis.ConnsPerNode),
			slog.String("failure_mode", c.Redis.FailureMode),
			slog.Int("deny_cache", c.Redis.DenyCache),
		),
	)
}

// Load builds the Config from the command-line arguments args (without the
// program name), the environment read through getenv, and the config file
// they name. It returns flag.ErrHelp when args ask for help (-h, --help): the
// caller then writes Usage and exits successfully. Any other error describes
// the first invalid setting and where its value came from.
func Load(args []string, getenv func(string) string) (Config, error) {
	flags := make(map[string]string)
	fs, showVersion := newFlagSet(flags)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, err
		}
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("config: unexpected argument %q: settings are given as flags such as --listen=:8080", fs.Arg(0))
	}
	if *showVersion {
		return Config{ShowVersion: true}, nil
	}

	var c Config
	origin := make(map[string]string, len(settings))
	set := func(s setting, v, from string) error {
		if err := s.apply(&c, v); err != nil {
			return fmt.Errorf("config: %s: %w", from, err)
		}
		origin[s.name] = from
		return nil
	}
	for _, s := range settings {
		if err := set(s, s.def, "default of --"+s.name); err != nil {
			return Config{}, err // a broken default: a bug caught by the tests
		}
	}

	path, ok := flags["config"]
	if !ok {
		path = getenv("RATELIMITER_CONFIG")
	}
	if path != "" {
		f, err := readFile(path)
		if err != nil {
			return Config{}, err
		}
		values := f.Tenants.values()
		for _, s := range settings {
			if v, ok := values[s.file]; ok && s.file != "" {
				if err := set(s, v, s.file+" in "+path); err != nil {
					return Config{}, err
				}
			}
		}
		if c.Limiters, err = f.definitions(path); err != nil {
			return Config{}, err
		}
		if c.ForwardAuth, err = f.ForwardAuth.forwardAuth(path); err != nil {
			return Config{}, err
		}
	}

	for _, s := range settings {
		if v := getenv(s.env); v != "" {
			if err := set(s, v, s.env); err != nil {
				return Config{}, err
			}
		}
	}
	for _, s := range settings {
		if v, ok := flags[s.name]; ok {
			if err := set(s, v, "--"+s.name); err != nil {
				return Config{}, err
			}
		}
	}

	if err := c.Tenants.Policy.Validate(); err != nil {
		return Config{}, fmt.Errorf("config: per-IP policy (%s): %w",
			origins(origin, "tenant-limit", "tenant-algorithm", "tenant-burst"), err)
	}
	c.Tenants.Policy = c.Tenants.Policy.Normalize()
	if c.EnvoyConfigPath != "" {
		var err error
		if c.Envoy, err = rls.Load(c.EnvoyConfigPath); err != nil {
			return Config{}, fmt.Errorf("config: envoy configuration (%s): %w", origin["envoy-config"], err)
		}
	}
	if err := c.checkDeclared(origin); err != nil {
		return Config{}, err
	}
	if err := c.ClientIP.Check(); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", origins(origin, "trusted-proxies", "trusted-hops", "forwarded-header"), err)
	}
	if c.ForwardAuth != nil {
		c.ForwardAuth.ClientIP = c.ClientIP
		c.ForwardAuth.IPv6Prefix = c.Tenants.IPv6Prefix
		defs := make(map[string]limiter.Definition, len(c.Limiters))
		for _, d := range c.Limiters {
			defs[d.Name] = d
		}
		if err := c.ForwardAuth.Check(defs); err != nil {
			return Config{}, fmt.Errorf("config: config file %s: %w", c.ConfigFile, err)
		}
	}
	if c.DataDir != "" && c.Backend == BackendRedis {
		return Config{}, fmt.Errorf("config: %s: a data directory keeps the memory backend's limiters; with %s, Redis keeps them (and its own persistence, if configured, keeps Redis)",
			origin["data-dir"], origin["backend"])
	}
	// Each backend has its own worst case per requester (see the
	// tenant-max-bytes setting); refuse a bound that holds none now rather
	// than when the backend is built.
	fixed, per := int64(tenant.TableBytes), tenant.TenantBytes(c.Tenants.Policy)
	if c.Backend == BackendRedis {
		fixed, per = tenantredis.TableBytes, tenantredis.TenantBytes(c.Tenants.Policy)
	}
	if c.Tenants.MaxBytes < fixed+per {
		return Config{}, fmt.Errorf("config: %s: %d bytes do not hold one requester, which takes up to %d bytes under the per-IP policy (%s) on the %s backend, besides %d bytes of tables",
			origin["tenant-max-bytes"], c.Tenants.MaxBytes, per, origins(origin, "tenant-limit", "tenant-algorithm"), c.Backend, fixed)
	}

	if err := c.Listeners.check(origin); err != nil {
		return Config{}, err
	}
	if c.adminTokenFile != "" {
		if c.AdminToken != "" {
			return Config{}, fmt.Errorf("config: both the admin token (%s) and the admin token file (%s) are set; set one",
				origin["admin-token"], origin["admin-token-file"])
		}
		token, err := readToken(c.adminTokenFile)
		if err != nil {
			return Config{}, fmt.Errorf("config: %s: %w", origin["admin-token-file"], err)
		}
		c.AdminToken = token
	}
	if c.redisPasswordFile != "" {
		if c.Redis.Password != "" {
			return Config{}, fmt.Errorf("config: both the Redis password (%s) and the Redis password file (%s) are set; set one",
				origin["redis-password"], origin["redis-password-file"])
		}
		b, err := os.ReadFile(c.redisPasswordFile)
		if err != nil {
			return Config{}, fmt.Errorf("config: %s: read Redis password: %w", origin["redis-password-file"], err)
		}
		if c.Redis.Password = strings.TrimSpace(string(b)); c.Redis.Password == "" {
			return Config{}, fmt.Errorf("config: %s: Redis password file %s is empty", origin["redis-password-file"], c.redisPasswordFile)
		}
	}
	return c, nil
}

// check refuses TLS settings that cannot serve: a certificate without
// its key or the reverse, or a client CA bundle without a certificate.
// The files themselves are read when the service starts.
func (l Listeners) check(origin map[string]string) error {
	switch {
	case l.TLSCertFile != "" && l.TLSKeyFile == "":
		return fmt.Errorf("config: %s: a TLS certificate needs its key: set --tls-key-file (RATELIMITER_TLS_KEY_FILE) too", origin["tls-cert-file"])
	case l.TLSKeyFile != "" && l.TLSCertFile == "":
		return fmt.Errorf("config: %s: a TLS key needs its certificate: set --tls-cert-file (RATELIMITER_TLS_CERT_FILE) too", origin["tls-key-file"])
	case l.TLSClientCAFile != "" && l.TLSCertFile == "":
		return fmt.Errorf("config: %s: client certificates are verified over TLS: set --tls-cert-file and --tls-key-file too", origin["tls-client-ca-file"])
	}
	return nil
}

// newFlagSet returns the command line's flags. Each setting's flag records
// its raw value in flags, applied later in order of precedence.
func newFlagSet(flags map[string]string) (fs *flag.FlagSet, showVersion *bool) {
	fs = flag.NewFlagSet("ratelimiter", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the caller reports errors and writes Usage
	fs.Usage = func() {}
	for _, s := range settings {
		fs.Func(s.name, s.usage, func(v string) error { flags[s.name] = v; return nil })
	}
	return fs, fs.Bool("version", false, "print the version and exit")
}

// origins describes where the named settings got their values, listing only
// those that were set (not left at their defaults).
func origins(origin map[string]string, names ...string) string {
	var set []string
	for _, n := range names {
		if o := origin[n]; !strings.HasPrefix(o, "default of ") {
			set = append(set, o)
		}
	}
	if len(set) == 0 {
		return "defaults"
	}
	return "set by " + strings.Join(set, ", ")
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read admin token: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("admin token file %s is empty", path)
	}
	if err := checkToken(token); err != nil {
		return "", fmt.Errorf("admin token file %s: %w", path, err)
	}
	return token, nil
}

// declaredKeys is the sum of MaxKeys over the keyed limiters of defs, which
// are normalized.
// checkDeclared refuses declared limiters past --max-limiters or past the
// budget of keys; origin tells where settings came from.
func (c Config) checkDeclared(origin map[string]string) error {
	declared := c.Declared()
	if len(declared) > c.MaxLimiters {
		return fmt.Errorf("config: %d limiters are declared by %s, more than the %d of --max-limiters (%s)",
			len(declared), c.declarers(), c.MaxLimiters, origins(origin, "max-limiters"))
	}
	// Both backends refuse keyed limiters past the budget of keys (see
	// limiter.KeyBudget): refuse a file that declares more now rather than
	// when its limiters are created.
	if keys := declaredKeys(declared); keys > limiter.KeyBudget {
		return fmt.Errorf("config: keyed limiters declared by %s: their max_keys add up to %d (%d for each that leaves it out), more than the %d keys the keyed limiters may hold together; lower max_keys",
			c.declarers(), keys, limiter.DefaultMaxKeys, limiter.KeyBudget)
	}
	return nil
}

// WithEnvoy returns c with the Envoy configuration envoy in place of its
// own, as a reload reads it, or an error when the limiters declared then
// would break a bound.
func (c Config) WithEnvoy(envoy *rls.Config) (Config, error) {
	c.Envoy = envoy
	if err := c.checkDeclared(map[string]string{"max-limiters": "--max-limiters"}); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Declared returns the limiters the service declares: those of the config
// file, then those of the Envoy configuration's rules.
func (c Config) Declared() []limiter.Definition {
	return append(slices.Clip(c.Limiters), c.Envoy.Limiters()...)
}

// declarers names the files that declare limiters, for errors.
func (c Config) declarers() string {
	var files []string
	if c.ConfigFile != "" {
		files = append(files, "the config file "+c.ConfigFile)
	}
	if c.EnvoyConfigPath != "" {
		files = append(files, "the envoy configuration "+c.EnvoyConfigPath)
	}
	return strings.Join(files, " and ")
}

func declaredKeys(defs []limiter.Definition) int {
	n := 0
	for _, def := range defs {
		n += def.MaxKeys
	}
	return n
}

// itoa writes an integer the way the integer settings read it.
func itoa[T int | int64](n T) string { return strconv.FormatInt(int64(n), 10) }
