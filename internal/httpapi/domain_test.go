package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// fakeLimiters answers every call with acquire.
type fakeLimiters struct {
	acquire func(name string, permits int64) (limiter.Decision, error)
}

func (f fakeLimiters) Put(context.Context, limiter.Definition) (bool, error) { return true, nil }
func (f fakeLimiters) Get(context.Context, string) (limiter.Definition, error) {
	return limiter.Definition{}, limiter.ErrNotFound
}
func (f fakeLimiters) List(context.Context, string, int) ([]limiter.Definition, error) {
	return nil, nil
}
func (f fakeLimiters) Delete(context.Context, string) error { return nil }
func (f fakeLimiters) Acquire(_ context.Context, name string, permits int64) (limiter.Decision, error) {
	return f.acquire(name, permits)
}
func (f fakeLimiters) AcquireBatch(_ context.Context, reqs []limiter.Request, out []limiter.Result) error {
	for i, r := range reqs {
		out[i].Decision, out[i].Err = f.acquire(r.Name, r.Permits)
	}
	return nil
}
func (f fakeLimiters) Available(context.Context, string) (limiter.Availability, error) {
	return limiter.Availability{}, nil
}
func (f fakeLimiters) AcquireKey(_ context.Context, name, _ string, permits int64) (limiter.KeyDecision, error) {
	d, err := f.acquire(name, permits)
	return limiter.KeyDecision{Decision: d}, err
}
func (f fakeLimiters) AvailableKey(context.Context, string, string) (limiter.KeyAvailability, error) {
	return limiter.KeyAvailability{}, nil
}
func (f fakeLimiters) Lowest(_ context.Context, name string, _ int) ([]limiter.KeyEntry, error) {
	_, err := f.acquire(name, 1)
	return nil, err
}
func (f fakeLimiters) Reserve(_ context.Context, items []limiter.Item, _ time.Duration, _ string) (limiter.Verdict, error) {
	_, err := f.acquire(items[0].Name, items[0].Permits)
	return limiter.Verdict{}, err
}
func (f fakeLimiters) Settle(context.Context, string, []limiter.Item, string) (limiter.Verdict, error) {
	return limiter.Verdict{}, limiter.ErrReservationNotFound
}
func (f fakeLimiters) Decide(_ context.Context, items []limiter.Item, _ limiter.Mode, _ string) (limiter.Verdict, error) {
	_, err := f.acquire(items[0].Name, items[0].Permits)
	return limiter.Verdict{}, err
}

// fakeTenants answers every call with err.
type fakeTenants struct{ err error }

func (f fakeTenants) Acquire(context.Context, string, int64) (tenant.Decision, error) {
	return tenant.Decision{}, f.err
}
func (f fakeTenants) Available(context.Context, string) (tenant.Availability, error) {
	return tenant.Availability{}, f.err
}
func (f fakeTenants) Lowest(context.Context, int) ([]tenant.Entry, error) { return nil, f.err }
func (f fakeTenants) Policy() limiter.Policy                              { return tenantPolicy }

// TestDomainErrors checks the one mapping of domain errors to problems:
// the status, and that the real error is logged but never sent.
func TestDomainErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		panics bool
		status int
		logged string // what the log must say, at error level
	}{
		{name: "not found", err: fmt.Errorf("limiter: acquire %q: %w", "x", limiter.ErrNotFound), status: 404},
		{name: "invalid permits", err: fmt.Errorf("limiter: acquire: %w: permits must be between 1 and 1000000000, got 0", limiter.ErrInvalidPermits), status: 400},
		{name: "invalid name", err: fmt.Errorf("limiter: acquire: %w", limiter.ErrInvalidName), status: 400},
		{name: "unavailable", err: fmt.Errorf("limiter: acquire: %w: dial tcp 10.1.2.3:6379: connection refused", limiter.ErrUnavailable), status: 503},
		{name: "deadline", err: fmt.Errorf("limiter: acquire: %w", context.DeadlineExceeded), status: 503},
		{name: "anything else", err: errors.New("store: corrupted entry 0xdeadbeef at shard 7"), status: 500, logged: "corrupted entry 0xdeadbeef"},
		{name: "panic", panics: true, status: 500, logged: "panic serving request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log strings.Builder
			h, err := New(Options{
				Limiters: fakeLimiters{acquire: func(string, int64) (limiter.Decision, error) {
					if tc.panics {
						panic("store: nil map write in shard 7")
					}
					return limiter.Decision{}, tc.err
				}},
				Tenants: fakeTenants{},
				Logger:  slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelError})),
			})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			e := &env{t: t, srv: srv}
			res, body := e.raw(http.MethodPost, "/v1/limiters/x/acquire", "", "")
			checkProblem(t, res, body, tc.status)
			for _, secret := range []string{"10.1.2.3", "0xdeadbeef", "shard", "nil map"} {
				if strings.Contains(string(body), secret) {
					t.Errorf("the problem %s leaks %q", body, secret)
				}
			}
			if tc.logged != "" && !strings.Contains(log.String(), tc.logged) {
				t.Errorf("log %q: want it to say %q", log.String(), tc.logged)
			}
			if tc.logged == "" && strings.Contains(log.String(), "level=ERROR") {
				t.Errorf("log %q: a %d is no server error", log.String(), tc.status)
			}

			// In a batch, the same failure is the acquisition's own result,
			// with the same status and nothing leaked.
			if tc.status == http.StatusBadRequest || tc.panics {
				return // a batch with invalid input is refused whole; a panic fails it whole
			}
			log.Reset()
			res, body = e.raw(http.MethodPost, "/v1/acquire", "application/json", `{"acquisitions":[{"limiter":"x"}]}`)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("batch: got %s %s, want 200", res.Status, body)
			}
			var batch struct {
				Results []struct {
					Status  int `json:"status"`
					Problem struct {
						Status int    `json:"status"`
						Detail string `json:"detail"`
					} `json:"problem"`
				} `json:"results"`
			}
			if err := json.Unmarshal(body, &batch); err != nil || len(batch.Results) != 1 {
				t.Fatalf("batch: %s: %v", body, err)
			}
			if r := batch.Results[0]; r.Status != tc.status || r.Problem.Status != tc.status || r.Problem.Detail == "" {
				t.Errorf("batch result: got %+v, want status %d with a problem", r, tc.status)
			}
			for _, secret := range []string{"10.1.2.3", "0xdeadbeef", "shard"} {
				if strings.Contains(string(body), secret) {
					t.Errorf("the batch answer %s leaks %q", body, secret)
				}
			}
			if tc.logged != "" && !strings.Contains(log.String(), tc.logged) {
				t.Errorf("batch: log %q: want it to say %q", log.String(), tc.logged)
			}
		})
	}
}

func TestTenantDomainErrors(t *testing.T) {
	for _, tc := range []struct {
		err    error
		path   string
		status int
		field  string
	}{
		{err: fmt.Errorf("tenant: %w: %q", tenant.ErrInvalidIP, "1.2.3"), path: "/v1/tenants/1.2.3/available", status: 400, field: "path.ip"},
		{err: fmt.Errorf("tenant: lowest: %w: 0", tenant.ErrInvalidK), path: "/v1/tenants/lowest?k=5", status: 400, field: "query.k"},
		{err: fmt.Errorf("tenant: %w", limiter.ErrUnavailable), path: "/v1/tenants/1.2.3.4/available", status: 503},
	} {
		t.Run(tc.path, func(t *testing.T) {
			h, err := New(Options{Limiters: fakeLimiters{}, Tenants: fakeTenants{err: tc.err}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			e := &env{t: t, srv: srv}
			res, body := e.raw(http.MethodGet, tc.path, "", "")
			p := checkProblem(t, res, body, tc.status)
			if tc.field != "" && (p.Errors == nil || (*p.Errors)[0].Location != tc.field) {
				t.Errorf("field errors: got %v, want %s", fieldLocations(p), tc.field)
			}
		})
	}
}

func TestNewRejectsMissingOptions(t *testing.T) {
	for _, o := range []Options{
		{Tenants: fakeTenants{}},
		{Limiters: fakeLimiters{}},
		{Limiters: fakeLimiters{}, Tenants: fakeTenants{}, MaxBodyBytes: -1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v): got no error", o)
		}
	}
}
