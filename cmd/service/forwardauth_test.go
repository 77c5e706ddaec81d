package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
	"github.com/ratelimiter/ratelimiter/internal/redistest"
)

// forwardAuthConfig limits every client to 30 requests and every API key
// to 40, with periods that nothing refills while a test runs.
const forwardAuthConfig = `limiters:
  - {name: per-ip, limit: 30, period: 8000h, keyed: true, group: edge}
  - {name: per-key, limit: 40, period: 8000h, keyed: true, group: edge}
forward_auth:
  rules:
    - {limiter: per-ip, key: client_ip}
    - {limiter: per-key, key: "header:X-Api-Key", path_prefix: /api/}
`

// forwardAuth asks base about a request of client to path, with an API key
// unless key is empty, as a proxy at 127.0.0.1 would, and returns the
// status.
func forwardAuth(t *testing.T, base, client, path, key string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v1/forward-auth", nil)
	if err != nil {
		t.Error(err)
		return 0
	}
	req.Header.Set("X-Forwarded-For", "198.51.100.66, "+client) // the left end is the client's own claim
	req.Header.Set("X-Forwarded-Uri", path)
	if key != "" {
		req.Header.Set("X-Api-Key", key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// remaining is what key has left of the keyed limiter name.
func remaining(t *testing.T, base, name, key string) int64 {
	t.Helper()
	res, err := http.Get(base + "/v1/limiters/" + name + "/available?key=" + key)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var a struct{ Remaining int64 }
	if err := json.NewDecoder(res.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return a.Remaining
}

// TestForwardAuthAcrossReplicas: three replicas on one Redis answer
// concurrent forward-auth requests, as a proxy at 127.0.0.1 sends them,
// for three clients, half of them on /api/ with one of two API keys. Each
// client passes exactly its limit; each key at most its own; and what
// every limit holds is exactly what the allowed requests took, so a
// denied request took nothing, whichever replica answered.
func TestForwardAuthAcrossReplicas(t *testing.T) {
	addr := redistest.Standalone(t)
	env := map[string]string{"RATELIMITER_CONFIG": configFile(t, forwardAuthConfig), "RATELIMITER_TRUSTED_PROXIES": "127.0.0.1"}
	var bases []string
	for range 3 {
		c := replica(t, addr, env)
		bases = append(bases, strings.TrimSuffix(c.ClientInterface.(*client.Client).Server, "/"))
	}
	clients := []string{"203.0.113.1", "203.0.113.2", "203.0.113.3"}
	keys := []string{"k1", "k2"}
	var (
		mu       sync.Mutex
		byClient = map[string]int64{}
		byKey    = map[string]int64{}
		statuses = map[int]int{}
		wg       sync.WaitGroup
	)
	for r, base := range bases {
		for w := range 4 {
			wg.Go(func() {
				for n := range 60 {
					client, key, path := clients[(n+w+r)%3], "", "/page"
					if n%2 == 1 {
						key, path = keys[(n/2+w)%2], "/api/items"
					}
					status := forwardAuth(t, base, client, path, key)
					mu.Lock()
					statuses[status]++
					if status == http.StatusOK {
						byClient[client]++
						if key != "" {
							byKey[key]++
						}
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if statuses[http.StatusOK]+statuses[http.StatusTooManyRequests] != 720 {
		t.Fatalf("answers: got %v, want 720 of 200 or 429", statuses)
	}
	for _, c := range clients {
		if byClient[c] != 30 {
			t.Errorf("client %s passed %d times, want exactly its limit, 30", c, byClient[c])
		}
		if got := remaining(t, bases[0], "per-ip", c); got != 30-byClient[c] {
			t.Errorf("per-ip of %s has %d left after %d passed, want %d", c, got, byClient[c], 30-byClient[c])
		}
	}
	for _, k := range keys {
		if byKey[k] > 40 {
			t.Errorf("key %s passed %d times, more than its limit of 40", k, byKey[k])
		}
		if got := remaining(t, bases[1], "per-key", k); got != 40-byKey[k] {
			t.Errorf("per-key of %s has %d left after %d passed, want %d", k, got, byKey[k], 40-byKey[k])
		}
	}
	t.Logf("answers %v; passed by client %v, by key %v", statuses, byClient, byKey)
}

// TestForwardAuthAnswers: through the generated client, on the memory
// backend. An allowed request is a 200 with no body (nginx would close its
// connection after one) and the RateLimit headers of its limits; one over
// a limit is the deny status with a problem and Retry-After, and takes
// nothing; a request that matches no rule passes, without the headers.
func TestForwardAuthAnswers(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	const cfg = `limiters:
  - {name: per-ip, limit: 2, period: 8000h, keyed: true}
forward_auth:
  rules:
    - {limiter: per-ip, key: client_ip, path_prefix: /api/}
`
	base, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0"}, map[string]string{"RATELIMITER_CONFIG": configFile(t, cfg)})
	c, err := client.NewClientWithResponses(base)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(uri string) *client.ForwardAuthResponse {
		t.Helper()
		res, err := c.ForwardAuthWithResponse(t.Context(), func(_ context.Context, req *http.Request) error {
			req.Header.Set("X-Forwarded-Uri", uri)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for _, left := range []string{"1", "0"} {
		res := ask("/api/items?page=2")
		if res.StatusCode() != http.StatusOK || len(res.Body) != 0 || res.HTTPResponse.ContentLength != 0 {
			t.Errorf("allowed request: got %s with %d bytes (Content-Length %d), want 200 and no body", res.Status(), len(res.Body), res.HTTPResponse.ContentLength)
		}
		if got, want := res.HTTPResponse.Header.Get("Ratelimit"), `"per-ip";r=`+left+";"; !strings.HasPrefix(got, want) {
			t.Errorf("allowed request: RateLimit %q, want it to start %q", got, want)
		}
	}
	res := ask("/api/items")
	if p := res.ApplicationProblemJSON429; p == nil || p.Status != http.StatusTooManyRequests || p.Detail == nil || !strings.Contains(*p.Detail, "per-ip") {
		t.Errorf("request over the limit: got %s %s, want a 429 problem naming per-ip", res.Status(), res.Body)
	}
	if res.HTTPResponse.Header.Get("Retry-After") == "" {
		t.Errorf("request over the limit: no Retry-After")
	}
	if got := remaining(t, base, "per-ip", "127.0.0.1"); got != 0 {
		t.Errorf("per-ip after the denial: %d left, want 0", got)
	}
	res = ask("/static/logo.png")
	if res.StatusCode() != http.StatusOK || len(res.Body) != 0 || res.HTTPResponse.Header.Get("Ratelimit") != "" {
		t.Errorf("unmatched request: got %s %q with RateLimit %q, want 200, no body and no RateLimit", res.Status(), res.Body, res.HTTPResponse.Header.Get("Ratelimit"))
	}
}

// TestForwardAuthDenialForNginx: with deny_status 403, nginx's, a denial
// has Retry-After and the RateLimit headers but no body, which nginx
// would discard and then close its connection to the service.
func TestForwardAuthDenialForNginx(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	const cfg = `limiters:
  - {name: per-ip, limit: 1, period: 8000h, keyed: true}
forward_auth:
  deny_status: 403
  rules:
    - {limiter: per-ip, key: client_ip}
`
	base, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0"}, map[string]string{"RATELIMITER_CONFIG": configFile(t, cfg)})
	c, err := client.NewClientWithResponses(base)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{http.StatusOK, http.StatusForbidden, http.StatusForbidden} {
		res, err := c.ForwardAuthWithResponse(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		h := res.HTTPResponse.Header
		if res.StatusCode() != want || len(res.Body) != 0 || res.HTTPResponse.ContentLength != 0 {
			t.Errorf("request %d: got %s with %d bytes (Content-Length %d), want %d and no body", i+1, res.Status(), len(res.Body), res.HTTPResponse.ContentLength, want)
		}
		if want == http.StatusForbidden && (h.Get("Retry-After") == "" || !strings.HasPrefix(h.Get("Ratelimit"), `"per-ip";r=0;`)) {
			t.Errorf("request %d, denied: Retry-After %q and RateLimit %q, want both, with nothing left", i+1, h.Get("Retry-After"), h.Get("Ratelimit"))
		}
	}
}
