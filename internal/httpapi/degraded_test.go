package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// downStore is a limiter store, and downTenants a tenant backend, whose
// shared backend does not answer.
type (
	downStore   struct{ limiter.Store }
	downTenants struct{ *tenant.Registry }
)

var errDown = fmt.Errorf("%w: connection refused", limiter.ErrUnavailable)

func (downStore) Acquire(context.Context, string, int64) (limiter.Decision, error) {
	return limiter.Decision{}, errDown
}

func (downStore) Available(context.Context, string) (limiter.Availability, error) {
	return limiter.Availability{}, errDown
}

func (downTenants) Acquire(context.Context, string, int64) (tenant.Decision, error) {
	return tenant.Decision{}, errDown
}

// Decisions made without the backend are answered 200 and say so, without
// rate-limit headers; queries that need the backend are answered 503, and
// the outage is logged once, not once per request.
func TestDegradedDecisions(t *testing.T) {
	for _, mode := range []limiter.FailureMode{limiter.FailClosed, limiter.FailOpen} {
		t.Run(mode.String(), func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			e := newEnv(t, func(o *Options) {
				o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
				reg, err := tenant.New(tenant.Config{Policy: tenantPolicy}, nil)
				if err != nil {
					t.Fatal(err)
				}
				opts := limiter.ServiceOptions{FailureMode: mode}
				o.Limiters = limiter.NewServiceWith(downStore{}, opts)
				o.Tenants = tenant.NewService(downTenants{reg}, opts)
			})
			ctx := context.Background()
			one := int64(1)
			wantAllowed := mode == limiter.FailOpen

			res, err := e.c.AcquireWithResponse(ctx, "api", client.AcquireRequest{Permits: &one})
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode() != http.StatusOK || res.JSON200 == nil {
				t.Fatalf("acquire: got %s %s, want 200", res.Status(), res.Body)
			}
			if d := res.JSON200; d.Allowed != wantAllowed || d.Degraded == nil || !*d.Degraded || d.Limit != 0 || d.Remaining != 0 {
				t.Errorf("acquire: got %s, want allowed %v, degraded, limit and remaining 0", res.Body, wantAllowed)
			}
			for _, h := range []string{"RateLimit", "RateLimit-Policy", "Retry-After"} {
				if v := res.HTTPResponse.Header.Get(h); v != "" {
					t.Errorf("acquire: header %s = %q, want none on a degraded decision", h, v)
				}
			}

			bres, err := e.c.AcquireBatchWithResponse(ctx, client.BatchAcquireRequest{Acquisitions: []client.BatchAcquisition{{Limiter: "api"}}})
			if err != nil {
				t.Fatal(err)
			}
			if bres.JSON200 == nil || len(bres.JSON200.Results) != 1 {
				t.Fatalf("acquireBatch: got %s %s, want 200 with one result", bres.Status(), bres.Body)
			}
			if r := bres.JSON200.Results[0]; r.Status != 200 || r.Decision == nil || r.Decision.Allowed != wantAllowed || r.Decision.Degraded == nil || !*r.Decision.Degraded {
				t.Errorf("acquireBatch: got %s, want a degraded decision, allowed %v", bres.Body, wantAllowed)
			}

			tres, err := e.c.AcquireTenantWithResponse(ctx, "192.0.2.9", client.AcquireTenantJSONRequestBody{Permits: &one})
			if err != nil {
				t.Fatal(err)
			}
			if tres.JSON200 == nil || tres.JSON200.Allowed != wantAllowed || tres.JSON200.Degraded == nil || tres.JSON200.Tenant != "192.0.2.9" {
				t.Errorf("acquireTenant: got %s %s, want a degraded decision for 192.0.2.9", tres.Status(), tres.Body)
			}

			result, permits := "denied", "denied"
			if wantAllowed {
				result, permits = "allowed", "granted"
			}
			m := collect(t, reader)
			for _, tc := range []struct {
				metric, limiter, result string
				want                    int64
			}{
				{"ratelimiter.decisions", "api", result, 2}, // acquire and acquireBatch
				{"ratelimiter.permits", "api", permits, 2},
				{"ratelimiter.decisions", TenantLimiter, result, 1},
				{"ratelimiter.permits", TenantLimiter, permits, 1},
			} {
				lim := attribute.String("limiter", tc.limiter)
				if got := sum(t, m[tc.metric], lim, attribute.String("result", tc.result), attribute.Bool("degraded", true)); got != tc.want {
					t.Errorf("%s{limiter=%s,result=%s,degraded=true}: got %d, want %d", tc.metric, tc.limiter, tc.result, got, tc.want)
				}
				if got := sum(t, m[tc.metric], lim, attribute.String("result", tc.result)); got != 0 {
					t.Errorf("%s{limiter=%s,result=%s} without degraded: got %d, want 0", tc.metric, tc.limiter, tc.result, got)
				}
			}

			for range 5 {
				av, err := e.c.GetAvailableWithResponse(ctx, "api", nil)
				if err != nil {
					t.Fatal(err)
				}
				if av.StatusCode() != http.StatusServiceUnavailable || av.ApplicationProblemJSON503 == nil {
					t.Fatalf("available: got %s %s, want a 503 problem", av.Status(), av.Body)
				}
			}
			if n := strings.Count(e.log.String(), `msg="limiter backend unavailable"`); n != 1 {
				t.Errorf("the outage was logged %d times over 5 failed requests, want once:\n%s", n, e.log.String())
			}
		})
	}
}
