package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimiter/ratelimiter/internal/config"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
	"github.com/ratelimiter/ratelimiter/internal/rls"
)

// envoyProcess is the Envoy side of one service process, built in the
// test's process as run builds it: the backend, the rate limit service
// and its reloader, whose sweeps read the time from clock.
type envoyProcess struct {
	b     *backend
	svc   *rls.Service
	r     *reloader
	clock *fakeTime
	close func() // stops the reloader if it runs, then releases the backend; once
	stop  func()
}

// fakeTime is a time that moves when told to, safe for concurrent use.
type fakeTime struct{ ns atomic.Int64 }

func (f *fakeTime) now() time.Time          { return time.Unix(0, f.ns.Load()) }
func (f *fakeTime) advance(d time.Duration) { f.ns.Add(int64(d)) }

// startEnvoy builds the service of the Envoy configuration at path with
// args (the backend's settings), once its backend is up. Its reloader does
// not run unless run is called: a test calls its methods itself.
func startEnvoy(t *testing.T, path string, args ...string) *envoyProcess {
	t.Helper()
	cfg, err := config.Load(append([]string{"--envoy-config", path}, args...), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	b, err := newBackend(t.Context(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.NewService(b.limiters, cfg.Envoy, rls.Options{Logger: logger})
	if err != nil {
		b.close()
		t.Fatal(err)
	}
	clock := new(fakeTime)
	clock.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	p := &envoyProcess{b: b, svc: svc, clock: clock, r: &reloader{cfg: cfg, b: b, svc: svc, logger: logger, now: clock.now}, stop: func() {}}
	p.close = sync.OnceFunc(func() {
		p.stop()
		b.close()
	})
	t.Cleanup(p.close)
	deadline := time.Now().Add(30 * time.Second)
	for !b.up() {
		if time.Now().After(deadline) {
			t.Fatal("the backend did not come up within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

// run runs the reloader, as run does, until close.
func (p *envoyProcess) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	var done sync.WaitGroup
	done.Go(func() { p.r.run(ctx, nil) })
	p.stop = func() {
		cancel()
		done.Wait()
	}
}

// envoyLimiters returns the names of the limiters of Envoy rules and of
// limits set by requests that l holds.
func envoyLimiters(t *testing.T, l *limiter.Service) []string {
	t.Helper()
	var names []string
	for after := ""; ; {
		defs, err := l.List(t.Context(), after, limiter.MaxList)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range defs {
			if strings.HasPrefix(d.Name, "envoy") {
				names = append(names, d.Name)
			}
		}
		if len(defs) < limiter.MaxList {
			return names
		}
		after = defs[len(defs)-1].Name
	}
}

// overrideLimiters counts the limiters of limits set by requests that l
// holds.
func overrideLimiters(t *testing.T, l *limiter.Service) int {
	t.Helper()
	n := 0
	for _, name := range envoyLimiters(t, l) {
		if strings.Contains(name, "override") {
			n++
		}
	}
	return n
}

// lifecycleBackends runs f with the settings of each backend that keeps
// Envoy's limiters: memory, a data directory, and a real Redis (the same
// settings for every process f starts, so that they share it).
func lifecycleBackends(t *testing.T, f func(t *testing.T, args []string)) {
	t.Run("memory", func(t *testing.T) { f(t, nil) })
	t.Run("data-dir", func(t *testing.T) { f(t, []string{"--data-dir", t.TempDir()}) })
	t.Run("redis", func(t *testing.T) {
		addr := redistest.Standalone(t)
		f(t, []string{"--backend", "redis", "--redis-addrs", addr, "--redis-timeout", "2s"})
	})
}

// A reload that renames a rule deletes the limiter of the old name once it
// has held no counts for rls.SweepGrace, so renames never use up the keyed
// limiters' budget of keys: 120 renames of a rule of 10,000 keys, a
// minute apart, all load (the budget holds 100 such limiters), and leave
// one limiter behind. A removed rule's limiter that still holds counts
// stays until its keys have been full again for rls.SweepGrace.
func TestReloadDeletesTheLimitersOfRemovedRules(t *testing.T) {
	lifecycleBackends(t, func(t *testing.T, args []string) {
		dir := t.TempDir()
		path := filepath.Join(dir, "envoy.yaml")
		write := func(key string) {
			t.Helper()
			rule := fmt.Sprintf("domain: web\ndescriptors:\n  - key: %s\n    rate_limit: {unit: hour, requests_per_unit: 5}\n", key)
			if err := os.WriteFile(path, []byte(rule), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write("user0")
		p := startEnvoy(t, path, args...)
		for i := 1; i <= 120; i++ {
			write(fmt.Sprintf("user%d", i))
			p.clock.advance(rls.SweepGrace)
			p.r.reload(t.Context())
			if p.r.failed != "" {
				t.Fatalf("rename %d: got %q, want a reload", i, p.r.failed)
			}
		}
		p.clock.advance(rls.SweepGrace)
		p.r.sweep(t.Context())
		if got := envoyLimiters(t, p.b.limiters); len(got) != 1 {
			t.Fatalf("after 120 renames: got %d limiters, want 1, the rule's", len(got))
		}

		// A removed rule whose limiter holds counts.
		name := p.svc.Config().Limiters()[0].Name
		if _, err := p.b.limiters.Decide(t.Context(), []limiter.Item{{Name: name, Key: "user=alice", Permits: 2}}, limiter.Take, ""); err != nil {
			t.Fatal(err)
		}
		write("client")
		p.r.reload(t.Context())
		p.clock.advance(rls.SweepGrace)
		p.r.sweep(t.Context())
		if got := envoyLimiters(t, p.b.limiters); len(got) != 2 {
			t.Fatalf("after removing a rule whose limiter holds counts: got limiters %v, want it kept beside the new rule's", got)
		}
		if _, err := p.b.limiters.Decide(t.Context(), []limiter.Item{{Name: name, Key: "user=alice", Permits: 2}}, limiter.Refund, ""); err != nil {
			t.Fatal(err)
		}
		p.r.sweep(t.Context())
		if got := envoyLimiters(t, p.b.limiters); len(got) != 2 {
			t.Fatalf("just as its keys are full again: got limiters %v, want it kept beside the new rule's for %s", got, rls.SweepGrace)
		}
		p.clock.advance(rls.SweepGrace)
		p.r.sweep(t.Context())
		if got := envoyLimiters(t, p.b.limiters); len(got) != 1 || got[0] == name {
			t.Fatalf("%s after its keys are full again: got limiters %v, want the new rule's only", rls.SweepGrace, got)
		}
	})
}

// A process started on a backend that keeps limiters (a data directory,
// Redis) deletes the limiters of rules its configuration no longer has:
// its reloader sweeps at start, and deletes them at the first sweep
// rls.SweepGrace later.
func TestStartDeletesTheLimitersOfRemovedRules(t *testing.T) {
	lifecycleBackends(t, func(t *testing.T, args []string) {
		if args == nil {
			t.Skip("memory keeps nothing across a restart")
		}
		old := envoyConfig(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
		p := startEnvoy(t, old, args...)
		removed := p.svc.Config().Limiters()[0].Name
		p.close()

		p = startEnvoy(t, envoyConfig(t, "domain: web\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"), args...)
		p.run(t)
		deadline := time.Now().Add(10 * time.Second)
		for {
			p.clock.advance(rls.SweepGrace) // each check of the reloader (every second) finds a sweep due
			got := envoyLimiters(t, p.b.limiters)
			if len(got) == 1 && got[0] != removed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("10s after a start without the rule of %s: got limiters %v, want the new rule's only", removed, got)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// withLimit is a descriptor of user alice of domain web that sets a limit
// of n a year: one hit holds counts for days.
func withLimit(n uint32) *commonv3.RateLimitDescriptor {
	return &commonv3.RateLimitDescriptor{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}},
		Limit:   &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_YEAR},
	}
}

// setLimits sends one request for each limit from first to first+n-1 and
// counts those answered, and those refused with RESOURCE_EXHAUSTED; any
// other error fails the test.
func setLimits(t *testing.T, svc *rls.Service, first, n uint32) (answered, exhausted int) {
	t.Helper()
	for l := first; l < first+n; l++ {
		_, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{withLimit(l)}})
		switch status.Code(err) {
		case codes.OK:
			answered++
		case codes.ResourceExhausted:
			exhausted++
		default:
			t.Fatalf("a limit of %d: %v", l, err)
		}
	}
	return answered, exhausted
}

// The bound of limits set by requests is the backend's, not a process's:
// three restarts on one data directory, or two replicas on one Redis,
// never hold more than rls.MaxOverrides of their limiters.
func TestLimitsSetByRequestsStayBoundAcrossProcesses(t *testing.T) {
	rule := "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
	lifecycleBackends(t, func(t *testing.T, args []string) {
		if args == nil {
			t.Skip("memory keeps nothing across a restart")
		}
		path := envoyConfig(t, rule)
		restarts := args[0] == "--data-dir"
		var replicas []*envoyProcess
		if !restarts {
			replicas = []*envoyProcess{startEnvoy(t, path, args...), startEnvoy(t, path, args...)}
		}
		total := 0
		for i := range 3 {
			var p *envoyProcess
			if restarts {
				p = startEnvoy(t, path, args...) // on the directory the one before used
			} else {
				p = replicas[i%2]
			}
			answered, exhausted := setLimits(t, p.svc, uint32(1000+i*rls.MaxOverrides), rls.MaxOverrides)
			total += answered
			if answered+exhausted != rls.MaxOverrides {
				t.Fatalf("round %d: %d answered, %d refused, want %d in all", i, answered, exhausted, rls.MaxOverrides)
			}
			if n := overrideLimiters(t, p.b.limiters); n > rls.MaxOverrides {
				t.Fatalf("after round %d set %d limits: got %d limiters of limits set by requests, want at most %d", i, rls.MaxOverrides, n, rls.MaxOverrides)
			}
			if restarts {
				p.close()
			}
		}
		if total != rls.MaxOverrides {
			t.Errorf("got %d distinct limits answered, want %d", total, rls.MaxOverrides)
		}
	})
}

// Two replicas on one Redis that run different configurations, as during
// a rolling update: neither's sweeps delete a limiter the other decides
// on while it holds counts, and once the old replica is gone the new one
// deletes the limiter of the rule it removed, when idle.
func TestRollingUpdateOnRedis(t *testing.T) {
	addr := redistest.Standalone(t)
	args := []string{"--backend", "redis", "--redis-addrs", addr, "--redis-timeout", "2s"}
	rules := func(keys ...string) string {
		y := "domain: web\ndescriptors:\n"
		for _, k := range keys {
			y += fmt.Sprintf("  - key: %s\n    rate_limit: {unit: hour, requests_per_unit: 5}\n", k)
		}
		return envoyConfig(t, y)
	}
	oldP := startEnvoy(t, rules("user", "route"), args...)
	newP := startEnvoy(t, rules("user", "client"), args...)
	ask := func(p *envoyProcess, key string, n uint64, refund bool) uint32 {
		t.Helper()
		d := &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: "a"}}, HitsAddend: wrapperspb.UInt64(n), IsNegativeHits: refund}
		resp, err := p.svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*commonv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: got %v, want OK", key, resp)
		}
		return resp.Statuses[0].LimitRemaining
	}
	ask(oldP, "route", 2, false)
	ask(newP, "client", 2, false)
	for range 3 {
		for _, p := range []*envoyProcess{oldP, newP} {
			p.clock.advance(rls.SweepGrace)
			p.r.sweep(t.Context())
		}
	}
	if got := ask(oldP, "route", 0, false); got != 3 {
		t.Errorf("the old replica's rule after the new one's sweeps: got %d left, want 3", got)
	}
	if got := ask(newP, "client", 0, false); got != 3 {
		t.Errorf("the new replica's rule after the old one's sweeps: got %d left, want 3", got)
	}

	// The update done, the removed rule's counts run out (given back
	// here): the new replica deletes its limiter once idle for the grace.
	oldP.close()
	routeName := oldP.svc.Config().Limiters()[1].Name
	if _, err := newP.b.limiters.Decide(t.Context(), []limiter.Item{{Name: routeName, Key: "route=a", Permits: 2}}, limiter.Refund, ""); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		newP.clock.advance(rls.SweepGrace)
		newP.r.sweep(t.Context())
	}
	want := []string{newP.svc.Config().Limiters()[1].Name, newP.svc.Config().Limiters()[0].Name}
	slices.Sort(want)
	if got := envoyLimiters(t, newP.b.limiters); !slices.Equal(got, want) {
		t.Errorf("after the update: got limiters %v, want the new configuration's %v", got, want)
	}
}
