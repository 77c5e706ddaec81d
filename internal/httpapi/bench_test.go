package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// BenchmarkAcquireHTTP measures one acquire through the whole handler:
// routing, validation, the strict server, telemetry, the memory store and
// the JSON answer with its headers. Compare it with BenchmarkTrivialHTTP,
// the least a net/http handler can do for the same request:
//
//	go test -run '^$' -bench 'HTTP' -benchmem -cpu 1 ./internal/httpapi
func BenchmarkAcquireHTTP(b *testing.B) {
	for _, bc := range []struct {
		name      string
		set       settings
		telemetry bool
	}{
		{name: "fast"}, // production: hand validation of the hot path
		{name: "kin", set: settings{kinEverywhere: true}}, // kin-openapi on the hot path too
		{name: "fast+sdk", telemetry: true},               // SDK meter provider, 1% parent-based sampling
	} {
		b.Run(bc.name, func(b *testing.B) {
			o := benchOptions(b)
			if bc.telemetry {
				o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				o.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))))
			}
			h, err := newServer(o, bc.set)
			if err != nil {
				b.Fatal(err)
			}
			serve(b, h, "/v1/limiters/bench/acquire", `{"permits":1}`)
		})
	}
}

func benchOptions(b *testing.B) Options {
	b.Helper()
	limiters := limiter.NewService(memory.New(nil, 0))
	if _, err := limiters.Put(b.Context(), limiter.Definition{Name: "bench", Policy: limiter.Policy{Limit: limiter.MaxLimit, Period: time.Millisecond}}); err != nil {
		b.Fatal(err)
	}
	tenants, err := tenant.New(tenant.Config{Policy: tenantPolicy}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return Options{Limiters: limiters, Tenants: tenants}
}

// BenchmarkTrivialHTTP is the baseline: net/http routing and encoding/json,
// no validation, telemetry or state.
func BenchmarkTrivialHTTP(b *testing.B) {
	type request struct {
		Permits int64 `json:"permits"`
	}
	type decision struct {
		Allowed      bool  `json:"allowed"`
		Permits      int64 `json:"permits"`
		Remaining    int64 `json:"remaining"`
		Limit        int64 `json:"limit"`
		ResetAfterMS int64 `json:"reset_after_ms"`
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/limiters/{name}/acquire", func(w http.ResponseWriter, r *http.Request) {
		var req request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(decision{Allowed: true, Permits: req.Permits, Remaining: 999, Limit: 1000, ResetAfterMS: 1})
	})
	serve(b, mux, "/v1/limiters/bench/acquire", `{"permits":1}`)
}

// serve POSTs body to path through h until b is done, failing on any
// answer but 200.
func serve(b *testing.B, h http.Handler, path, body string) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
}

// BenchmarkAcquireBatchHTTP measures a batch of 100 acquisitions of 1
// permit from one limiter through the whole handler, as the benchmark
// harness's batch comparison sends it; ns/op is per batch.
//
//	go test -run '^$' -bench 'BatchHTTP' -benchmem ./internal/httpapi
func BenchmarkAcquireBatchHTTP(b *testing.B) {
	h, err := newServer(benchOptions(b), settings{})
	if err != nil {
		b.Fatal(err)
	}
	body := `{"acquisitions":[` + strings.Repeat(`{"limiter":"bench","permits":1},`, 99) + `{"limiter":"bench","permits":1}]}`
	serve(b, h, "/v1/acquire", body)
}

// BenchmarkDecideHTTP measures a decision of three limiters of one group
// through the whole handler, beside BenchmarkAcquireHTTP's single acquire:
//
//	go test -run '^$' -bench 'AcquireHTTP/fast$|DecideHTTP' -benchmem -cpu 1 ./internal/httpapi
func BenchmarkDecideHTTP(b *testing.B) {
	for _, bc := range []struct {
		name string
		set  settings
	}{
		{name: "fast"},
		{name: "kin", set: settings{kinEverywhere: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			o := benchOptions(b)
			for _, name := range []string{"burst", "hourly", "daily"} {
				d := limiter.Definition{Name: name, Group: "checkout", Policy: limiter.Policy{Limit: limiter.MaxLimit, Period: time.Millisecond}}
				if _, err := o.Limiters.Put(b.Context(), d); err != nil {
					b.Fatal(err)
				}
			}
			h, err := newServer(o, bc.set)
			if err != nil {
				b.Fatal(err)
			}
			serve(b, h, "/v1/decide", `{"items":[{"limiter":"burst"},{"limiter":"hourly"},{"limiter":"daily","permits":1}]}`)
		})
	}
}

// BenchmarkForwardAuthHTTP measures the auth subrequest nginx sends for
// every request (examples/forward-auth/nginx.conf) through the whole
// handler ("service"): one rule keyed by the client's address, read from
// X-Forwarded-For behind a trusted proxy, beside BenchmarkAcquireHTTP's
// acquire of one key; and, with the same requests, a handler that answers
// a bare 200 ("bare"), the floor of any handler, as the benchmark
// harness's ceiling answers nginx:
//
//	go test -run '^$' -bench 'AcquireHTTP/fast$|ForwardAuthHTTP' -benchmem -cpu 1 ./internal/httpapi
func BenchmarkForwardAuthHTTP(b *testing.B) {
	o := benchOptions(b)
	d := limiter.Definition{Name: "per-ip", Keyed: true, Policy: limiter.Policy{Limit: limiter.MaxLimit, Period: time.Millisecond}}
	if _, err := o.Limiters.Put(b.Context(), d); err != nil {
		b.Fatal(err)
	}
	cfg := forwardauth.Config{
		Rules:      []forwardauth.Rule{{Limiter: "per-ip", Key: forwardauth.ByClientIP, Permits: 1}},
		DenyStatus: http.StatusForbidden,
		IPv6Prefix: 64,
		ClientIP:   forwardauth.ClientIP{Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}},
	}
	if err := cfg.Check(map[string]limiter.Definition{d.Name: d}); err != nil {
		b.Fatal(err)
	}
	o.ForwardAuth = forwardauth.NewService(cfg, o.Limiters, false)
	service, err := newServer(o, settings{})
	if err != nil {
		b.Fatal(err)
	}
	bare := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{{"service", service}, {"bare", bare}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, "/v1/forward-auth", nil)
				req.RemoteAddr = "127.0.0.1:40000"
				// The headers of examples/forward-auth/nginx.conf.
				req.Header.Set("X-Forwarded-Method", "GET")
				req.Header.Set("X-Forwarded-Host", "localhost")
				req.Header.Set("X-Forwarded-Uri", "/")
				req.Header.Set("X-Original-Method", "GET")
				req.Header.Set("X-Original-Uri", "/")
				req.Header.Set("X-Forwarded-For", "203.0.113.7")
				rec := httptest.NewRecorder()
				bc.h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
