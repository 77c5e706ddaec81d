package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// differentialConfig is the configuration both services run in
// TestDifferentialEnvoy. Every limit is per year, so that no fixed window
// of envoy ratelimit's ends during the test and no GCRA bucket refills.
const differentialConfig = `domain: diff
descriptors:
  - key: a
    rate_limit: {unit: year, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: year, requests_per_unit: 3}
  - key: c
    value: fixed
    rate_limit: {unit: year, requests_per_unit: 2}
  - key: n
    descriptors:
      - key: inner
        rate_limit: {unit: year, requests_per_unit: 4}
  - key: free
    rate_limit: {unlimited: true}
  - key: r
    value: base
    rate_limit: {unit: year, requests_per_unit: 1, name: base}
  - key: r
    value: premium
    rate_limit: {unit: year, requests_per_unit: 10, replaces: [{name: base}]}
`

// TestDifferentialEnvoy sends the same requests, from fresh state, to
// envoy ratelimit (the pinned module the harness runs) and to the service,
// both on one real Redis and with one configuration, through the generated
// go-control-plane client: every rule gives the same codes, remaining
// counts and limits on both, except where the service is documented to
// differ (the README's "Envoy and Istio"), which is asserted too: hits
// over the limit are not counted, and the descriptors of one request are
// decided all or nothing.
func TestDifferentialEnvoy(t *testing.T) {
	for _, tool := range []string{"redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("FAIL: %s is not on PATH (Debian: apt-get install redis-server)", tool)
		}
	}
	dir := t.TempDir()
	redisAddr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(redisAddr, ":")
	redis, err := start("redis-server", redisAddr, nil, "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(redis.stop)

	envoy, envoyGRPC, err := startEnvoyWith(dir, redisAddr, differentialConfig, "diff.a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(envoy.stop)

	bin, err := buildService("..", dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "diff.yaml")
	if err := os.WriteFile(cfg, []byte(differentialConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	var addrs [2]string
	for i := range addrs {
		if addrs[i], err = freeAddr(); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := start("ratelimiter", addrs[0], nil, bin, "--listen", addrs[0], "--grpc-listen", addrs[1], "--log-level", "warn",
		"--backend", "redis", "--redis-addrs", redisAddr, "--redis-timeout", "2s", "--envoy-config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.stop)
	if err := ready(svc); err != nil {
		t.Fatal(err)
	}

	clientOf := func(addr string) rlsv3.RateLimitServiceClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return rlsv3.NewRateLimitServiceClient(conn)
	}
	theirs, ours := clientOf(envoyGRPC), clientOf(addrs[1])

	var send func(*rlsv3.RateLimitRequest) (e, o *rlsv3.RateLimitResponse)
	// ask sends both the request of hits for the descriptors kvs.
	ask := func(hits uint32, kvs ...[]string) (e, o *rlsv3.RateLimitResponse) {
		t.Helper()
		req := &rlsv3.RateLimitRequest{Domain: "diff", HitsAddend: hits}
		for _, kv := range kvs {
			d := &commonv3.RateLimitDescriptor{}
			for i := 0; i+1 < len(kv); i += 2 {
				d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		return send(req)
	}
	// send sends req to both and returns their answers.
	send = func(req *rlsv3.RateLimitRequest) (e, o *rlsv3.RateLimitResponse) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if e, err = theirs.ShouldRateLimit(ctx, req); err != nil {
			t.Fatalf("envoy ratelimit: %v", err)
		}
		if o, err = ours.ShouldRateLimit(ctx, req); err != nil {
			t.Fatalf("ratelimiter: %v", err)
		}
		return e, o
	}
	// summary is what both must agree on: the codes, and each status's
	// remaining count and limit.
	summary := func(r *rlsv3.RateLimitResponse) string {
		var b strings.Builder
		b.WriteString(r.OverallCode.String())
		for _, s := range r.Statuses {
			fmt.Fprintf(&b, " [%s %d", s.Code, s.LimitRemaining)
			if l := s.CurrentLimit; l != nil {
				fmt.Fprintf(&b, " %d/%s %q", l.RequestsPerUnit, l.Unit, l.Name)
			}
			b.WriteString("]")
		}
		return b.String()
	}
	same := func(what string, e, o *rlsv3.RateLimitResponse) {
		t.Helper()
		if se, so := summary(e), summary(o); se != so {
			t.Errorf("%s: envoy ratelimit %s, ratelimiter %s", what, se, so)
		}
	}

	over := rlsv3.RateLimitResponse_OVER_LIMIT
	// Every rule, one hit at a time, to past its limit: the same.
	for _, rule := range []struct {
		kv    []string
		limit int
	}{
		{[]string{"a", "k1"}, 5},
		{[]string{"b", "k1"}, 3},
		{[]string{"c", "fixed"}, 2},
		{[]string{"n", "k1", "inner", "k2"}, 4},
	} {
		for i := range rule.limit + 2 {
			e, o := ask(1, rule.kv)
			same(fmt.Sprintf("%v, hit %d", rule.kv, i+1), e, o)
		}
	}
	// Descriptors under no limit, and a rule replaced by another: the same.
	for i := range 3 {
		e, o := ask(1, []string{"unknown", "x"}, []string{"free", "x"})
		same(fmt.Sprintf("no limit, %d", i), e, o)
		if got := o.Statuses[1].LimitRemaining; got != math.MaxUint32 {
			t.Errorf("unlimited: %d left", got)
		}
		e, o = ask(1, []string{"r", "base"}, []string{"r", "premium"})
		same(fmt.Sprintf("replaces, %d", i), e, o)
	}
	// The rule that replaces the other, to past its limit: the same.
	for i := 3; i < 12; i++ {
		e, o := ask(1, []string{"r", "base"}, []string{"r", "premium"})
		same(fmt.Sprintf("replaces, %d", i), e, o)
	}

	// Documented difference: hits over the limit are not counted. 3 of 5,
	// then 3 more (denied by both), then 2: envoy ratelimit counted the
	// denied 3 and denies; the service did not, and grants.
	e, o := ask(3, []string{"a", "k2"})
	same("3 of 5", e, o)
	e, o = ask(3, []string{"a", "k2"})
	if e.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || o.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || e.Statuses[0].LimitRemaining != 0 || o.Statuses[0].LimitRemaining != 2 {
		t.Errorf("3 more: envoy ratelimit %s, ratelimiter %s; want both over, envoy with 0 left and ratelimiter with 2", summary(e), summary(o))
	}
	e, o = ask(2, []string{"a", "k2"})
	if e.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || o.OverallCode != rlsv3.RateLimitResponse_OK || o.Statuses[0].LimitRemaining != 0 {
		t.Errorf("2 more: envoy ratelimit %s, ratelimiter %s; want envoy over, ratelimiter granting the last 2", summary(e), summary(o))
	}

	// Documented difference: a check (a descriptor's hits_addend of 0)
	// of a key past its limit. envoy ratelimit, which counted the denied
	// hits, answers OVER_LIMIT; the service, full, answers OK with 0 left.
	e, o = send(&rlsv3.RateLimitRequest{Domain: "diff", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries:    []*commonv3.RateLimitDescriptor_Entry{{Key: "a", Value: "k2"}},
		HitsAddend: wrapperspb.UInt64(0),
	}}})
	if e.OverallCode != over || o.OverallCode != rlsv3.RateLimitResponse_OK || o.Statuses[0].Code != rlsv3.RateLimitResponse_OK || o.Statuses[0].LimitRemaining != 0 {
		t.Errorf("a check of a key past its limit: envoy ratelimit %s, ratelimiter %s; want envoy over, ratelimiter OK with 0 left", summary(e), summary(o))
	}

	// Documented difference: all or nothing. a (5) and b (3) together:
	// the 4th request is over b's limit on both; envoy ratelimit charged a
	// anyway, the service did not.
	for i := range 3 {
		e, o := ask(1, []string{"a", "k3"}, []string{"b", "k3"})
		same(fmt.Sprintf("a and b, %d", i+1), e, o)
	}
	e, o = ask(1, []string{"a", "k3"}, []string{"b", "k3"})
	if e.OverallCode != over || o.OverallCode != over || e.Statuses[1].Code != over || o.Statuses[1].Code != over {
		t.Errorf("a and b, 4th: envoy ratelimit %s, ratelimiter %s; want both over b's limit", summary(e), summary(o))
	}
	if e.Statuses[0].LimitRemaining != 1 || o.Statuses[0].LimitRemaining != 2 {
		t.Errorf("a and b, 4th: a has %d left on envoy ratelimit, %d on ratelimiter; want 1 (charged) and 2 (not charged)", e.Statuses[0].LimitRemaining, o.Statuses[0].LimitRemaining)
	}
	if t.Failed() {
		t.Logf("envoy ratelimit's log:\n%s\nratelimiter's log:\n%s", envoy.log.String(), svc.log.String())
	}
}
