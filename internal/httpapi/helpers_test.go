package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/clocktest"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// clock is a manual clock shared by the store and the tenant registry.
type clock = clocktest.Clock

func newClock() *clock { return clocktest.New(time.Unix(1_700_000_000, 0)) }

// tenantPolicy is the per-IP policy of the test servers.
var tenantPolicy = limiter.Policy{Limit: 100, Period: time.Minute}

// env is a server under test, reached over a real socket.
type env struct {
	t        *testing.T
	srv      *httptest.Server
	c        *client.ClientWithResponses
	clock    *clock
	limiters *limiter.Service
	tenants  *tenant.Registry
	log      *strings.Builder // what the server logged at debug and above
}

// newEnv starts a server over the memory store and a real tenant registry;
// edit adjusts its options.
func newEnv(t *testing.T, edit func(*Options)) *env {
	t.Helper()
	return newEnvWith(t, settings{}, edit)
}

func newEnvWith(t *testing.T, set settings, edit func(*Options)) *env {
	t.Helper()
	e := &env{t: t, clock: newClock(), log: new(strings.Builder)}
	e.limiters = limiter.NewService(memory.New(e.clock.Limiter(), 0))
	var err error
	e.tenants, err = tenant.New(tenant.Config{Policy: tenantPolicy}, e.clock.Limiter())
	if err != nil {
		t.Fatalf("tenant.New: %v", err)
	}
	o := Options{
		Limiters: e.limiters,
		Tenants:  e.tenants,
		Logger:   slog.New(slog.NewTextHandler(&lockedWriter{w: e.log}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if edit != nil {
		edit(&o)
	}
	h, err := newServer(o, set)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.srv = httptest.NewServer(h)
	t.Cleanup(e.srv.Close)
	e.c, err = client.NewClientWithResponses(e.srv.URL)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return e
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// put creates a limiter through the API.
func (e *env) put(name string, spec client.LimiterSpec) {
	e.t.Helper()
	res, err := e.c.PutLimiterWithResponse(context.Background(), name, spec)
	if err != nil {
		e.t.Fatalf("put %s: %v", name, err)
	}
	if res.StatusCode() != http.StatusCreated && res.StatusCode() != http.StatusOK {
		e.t.Fatalf("put %s: status %d: %s", name, res.StatusCode(), res.Body)
	}
}

// available returns what the named limiter could grant now.
func (e *env) available(name string) int64 {
	e.t.Helper()
	res, err := e.c.GetAvailableWithResponse(context.Background(), name, nil)
	if err != nil {
		e.t.Fatalf("available %s: %v", name, err)
	}
	if res.JSON200 == nil {
		e.t.Fatalf("available %s: status %d: %s", name, res.StatusCode(), res.Body)
	}
	return res.JSON200.Remaining
}

// tenantAvailable returns what the tenant of ip could take now.
func (e *env) tenantAvailable(ip string) int64 {
	e.t.Helper()
	res, err := e.c.GetTenantAvailableWithResponse(context.Background(), ip)
	if err != nil {
		e.t.Fatalf("tenant available %s: %v", ip, err)
	}
	if res.JSON200 == nil {
		e.t.Fatalf("tenant available %s: status %d: %s", ip, res.StatusCode(), res.Body)
	}
	return res.JSON200.Remaining
}

// raw sends a request as is, for what the generated client cannot send.
func (e *env) raw(method, path, contentType, body string, header ...string) (*http.Response, []byte) {
	e.t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, r)
	if err != nil {
		e.t.Fatalf("request: %v", err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("read %s %s: %v", method, path, err)
	}
	return res, b
}

// leakWords are signs of internal text: Go types, decoder and validator
// messages, stack traces.
var leakWords = []string{
	"json:", "Go ", "go:", "int64", "int32", "struct", "unmarshal", "Unmarshal", "runtime", "openapi3", "kin",
	"reflect", "interface", "goroutine", "panic", "%!", "*gen.", "gen.", "limiter:", "tenant:", "schema",
	"doesn't match", "RequestError", "value of type",
}

// checkProblem checks that a response is a problem with the status wanted,
// and returns it.
func checkProblem(t *testing.T, res *http.Response, body []byte, status int) client.Problem {
	t.Helper()
	if res.StatusCode != status {
		t.Fatalf("status: got %d, want %d; body %s", res.StatusCode, status, body)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type: got %q, want application/problem+json", ct)
	}
	var p client.Problem
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("problem %s: %v", body, err)
	}
	if int(p.Status) != status || p.Title != http.StatusText(status) || p.Type != "about:blank" {
		t.Errorf("problem: got status %d title %q type %q, want %d %q about:blank", p.Status, p.Title, p.Type, status, http.StatusText(status))
	}
	if p.Detail == nil || *p.Detail == "" {
		t.Errorf("problem has no detail: %s", body)
	}
	for _, w := range leakWords {
		if strings.Contains(string(body), w) {
			t.Errorf("problem %s contains %q", body, w)
		}
	}
	return p
}

// fieldLocations lists the locations of a problem's field errors.
func fieldLocations(p client.Problem) []string {
	if p.Errors == nil {
		return nil
	}
	var out []string
	for _, e := range *p.Errors {
		out = append(out, e.Location)
	}
	return out
}

func ptr[T any](v T) *T { return &v }
