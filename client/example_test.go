package client_test

import (
	"context"
	"fmt"
	"log"
	"net/http/httptest"
	"time"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/httpapi"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// startServer runs a ratelimiter server in the process, for the example.
func startServer() *httptest.Server {
	tenants, err := tenant.New(tenant.Config{Policy: limiter.Policy{Limit: 100, Period: time.Minute}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	h, err := httpapi.New(httpapi.Options{
		Limiters: limiter.NewService(memory.New(nil, 0)),
		Tenants:  tenants,
	})
	if err != nil {
		log.Fatal(err)
	}
	return httptest.NewServer(h)
}

func Example() {
	srv := startServer()
	defer srv.Close()
	ctx := context.Background()

	c, err := client.NewClientWithResponses(srv.URL)
	if err != nil {
		log.Fatal(err)
	}

	// 9 permits a minute.
	created, err := c.PutLimiterWithResponse(ctx, "checkout-api", client.LimiterSpec{Limit: 9, Period: "1m"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("created:", created.StatusCode(), created.JSON201.Name, created.JSON201.Period)

	// More than the limiter can ever hold: denied, and waiting won't help.
	ten := int64(10)
	res, err := c.AcquireWithResponse(ctx, "checkout-api", client.AcquireRequest{Permits: &ten})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("10 permits: allowed", res.JSON200.Allowed, "exceeds capacity", res.JSON200.ExceedsCapacity)

	five := int64(5)
	res, err = c.AcquireWithResponse(ctx, "checkout-api", client.AcquireRequest{Permits: &five})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("5 permits: allowed", res.JSON200.Allowed, "remaining", res.JSON200.Remaining)
	fmt.Println("RateLimit-Policy:", res.Headers200.RateLimitPolicy)

	// 5 more do not fit: a denial, with the time to wait.
	res, err = c.AcquireWithResponse(ctx, "checkout-api", client.AcquireRequest{Permits: &five})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("5 more: allowed", res.JSON200.Allowed, "retry after", time.Duration(*res.JSON200.RetryAfterMs)*time.Millisecond > 6*time.Second)

	// An error is a problem document.
	missing, err := c.GetAvailableWithResponse(ctx, "no-such-limiter", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("unknown limiter:", missing.StatusCode(), *missing.ApplicationProblemJSON404.Detail)

	// Output:
	// created: 201 checkout-api 1m0s
	// 10 permits: allowed false exceeds capacity true
	// 5 permits: allowed true remaining 4
	// RateLimit-Policy: "checkout-api";q=9;w=60
	// 5 more: allowed false retry after true
	// unknown limiter: 404 Limiter "no-such-limiter" does not exist.
}
