// Package client is the Go SDK of ratelimiter, generated from the service's
// OpenAPI contract (api/openapi.yaml) by oapi-codegen; client.gen.go is
// never edited by hand.
//
// Create a client with the base URL of a ratelimiter server:
//
//	c, err := client.NewClientWithResponses("http://ratelimiter:8080")
//
// Each operation of the API is a method. The ...WithResponse methods decode
// the answer: JSON200 (JSON201 for a created limiter) holds the success
// body, ApplicationProblemJSON400 and its siblings hold the RFC 9457
// problem of an error answer, and Headers200 the rate-limit headers.
//
// Ask for permits before doing rate-limited work. A denial is an ordinary
// answer, not an error: check Allowed, and wait RetryAfterMs milliseconds
// before trying again when it is set. ExceedsCapacity means no wait will
// help: more permits were asked for than the limiter can ever hold.
//
//	res, err := c.AcquireWithResponse(ctx, "checkout-api", client.AcquireRequest{Permits: &n})
//	if err != nil {
//		return err // the server could not be reached
//	}
//	switch d := res.JSON200; {
//	case d == nil:
//		return fmt.Errorf("acquire: %s", res.Status()) // a problem: see res.ApplicationProblemJSON400…
//	case d.Allowed:
//		// go ahead
//	case d.RetryAfterMs != nil:
//		// come back in *d.RetryAfterMs milliseconds
//	}
//
// An acquisition takes 1 permit when the body is left out:
//
//	res, err := c.AcquireWithBodyWithResponse(ctx, "checkout-api", "application/json", nil)
//
// Creating, replacing and deleting limiters need the admin token when the
// server is configured with one; pass it with a request editor:
//
//	c, err := client.NewClientWithResponses(url, client.WithRequestEditorFn(
//		func(_ context.Context, req *http.Request) error {
//			req.Header.Set("Authorization", "Bearer "+token)
//			return nil
//		}))
//
// The client is safe for concurrent use; give it an http.Client with
// timeouts through WithHTTPClient.
package client
