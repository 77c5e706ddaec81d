package tenant_test

import (
	"testing"

	"github.com/ratelimiter/ratelimiter/internal/tenant"
	"github.com/ratelimiter/ratelimiter/internal/tenant/tenanttest"
)

// TestRegistrySuite runs the behavioural suite every tenant backend passes,
// on the real clock.
func TestRegistrySuite(t *testing.T) {
	tenanttest.Run(t, func(t *testing.T, cfg tenant.Config) tenanttest.Tenants {
		r, err := tenant.New(cfg, nil)
		if err != nil {
			t.Fatalf("New(%+v): %v", cfg, err)
		}
		return r
	})
}

// TestRegistrySpans: a Service over a Registry traces each decision once.
func TestRegistrySpans(t *testing.T) {
	tenanttest.RunSpans(t, func(t *testing.T, cfg tenant.Config) tenanttest.Tenants {
		r, err := tenant.New(cfg, nil)
		if err != nil {
			t.Fatalf("New(%+v): %v", cfg, err)
		}
		return r
	})
}
