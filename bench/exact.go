package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The correctness check: a limit of 100 per minute on a fresh key, asked
// for 1 permit by 2,000 requests at once; each system should admit exactly
// 100.
const (
	exactLimit    = 100
	exactRequests = 2000
	exactConns    = 200 // requests in flight at once
)

// exactRun is what one system needs for the check: a fresh key's request,
// and how to tell a grant.
type exactRun struct {
	name string
	// prepare makes key ready (defines its limit where the system needs
	// that) and returns the URL and body of one acquisition from it.
	prepare func(key string) (url, body string, err error)
	// admitted tells a grant from its answer.
	admitted func(status int, body []byte) (bool, error)
}

func exactRuns(rig *redisRig, guber, envoy *proc) []exactRun {
	ours := func(name string, p *proc) exactRun {
		return exactRun{
			name: name,
			prepare: func(key string) (string, string, error) {
				_, err := call("PUT", p.url("/v1/limiters/"+key), fmt.Sprintf(`{"limit":%d,"period":"1m"}`, exactLimit))
				return p.url("/v1/limiters/" + key + "/acquire"), acquireBody, err
			},
			admitted: func(status int, body []byte) (bool, error) {
				switch {
				case status != http.StatusOK:
					return false, fmt.Errorf("answered %d %s", status, body)
				case strings.Contains(string(body), `"degraded"`):
					return false, fmt.Errorf("decided without Redis: %s", body)
				}
				return strings.Contains(string(body), `"allowed":true`), nil
			},
		}
	}
	runs := []exactRun{ours("ratelimiter, memory backend (GCRA)", rig.svcMemory), ours("ratelimiter, Redis backend (GCRA)", rig.svcRedis)}
	if guber != nil {
		runs = append(runs, exactRun{
			name: "gubernator v2.13.0 (token bucket)",
			prepare: func(key string) (string, string, error) {
				return guber.url("/v1/GetRateLimits"), fmt.Sprintf(`{"requests":[{"name":"exact","unique_key":%q,"hits":1,"limit":%d,"duration":60000,"algorithm":"TOKEN_BUCKET"}]}`, key, exactLimit), nil
			},
			admitted: func(status int, body []byte) (bool, error) {
				if status != http.StatusOK || !strings.Contains(string(body), `"error":""`) {
					return false, fmt.Errorf("answered %d %s", status, body)
				}
				return strings.Contains(string(body), `"status":"UNDER_LIMIT"`), nil
			},
		})
	}
	if envoy != nil {
		runs = append(runs, exactRun{
			name: "envoy ratelimit (fixed window)",
			prepare: func(key string) (string, string, error) {
				return envoy.url("/json"), fmt.Sprintf(`{"domain":"bench","descriptors":[{"entries":[{"key":"exact","value":%q}]}],"hits_addend":1}`, key), nil
			},
			admitted: func(status int, body []byte) (bool, error) {
				switch status {
				case http.StatusOK:
					return strings.Contains(string(body), `"overallCode":"OK"`), nil
				case http.StatusTooManyRequests:
					return false, nil
				}
				return false, fmt.Errorf("answered %d %s", status, body)
			},
		})
	}
	return runs
}

// exactness sends exactRequests concurrent acquisitions to a fresh key of
// each system, once per round, and reports how many each admitted.
func exactness(cfg config, runs []exactRun, sec *section) error {
	tr := &http.Transport{MaxIdleConnsPerHost: exactConns, MaxConnsPerHost: exactConns}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	admitted := make([][]float64, len(runs))
	lasted := make([][]float64, len(runs)) // ms
	for round := range cfg.rounds {
		for i, r := range runs {
			key := fmt.Sprintf("exact-%d-%d-%d", time.Now().UnixNano(), round, i)
			url, body, err := r.prepare(key)
			if err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			began := time.Now()
			var (
				wg    sync.WaitGroup
				mu    sync.Mutex
				n     int
				first error
			)
			for range exactRequests {
				wg.Go(func() {
					ok, err := func() (bool, error) {
						resp, err := client.Post(url, "application/json", strings.NewReader(body))
						if err != nil {
							return false, err
						}
						defer resp.Body.Close()
						b, err := io.ReadAll(resp.Body)
						if err != nil {
							return false, err
						}
						return r.admitted(resp.StatusCode, b)
					}()
					mu.Lock()
					defer mu.Unlock()
					if err != nil && first == nil {
						first = err
					}
					if ok {
						n++
					}
				})
			}
			wg.Wait()
			if first != nil {
				return fmt.Errorf("%s: %w", r.name, first)
			}
			admitted[i] = append(admitted[i], float64(n))
			lasted[i] = append(lasted[i], float64(time.Since(began).Milliseconds()))
			cfg.progress("round %d  exactness        %-56s admitted %d of %d (limit %d)", round+1, r.name, n, exactRequests, exactLimit)
		}
	}
	sec.printf("\n### Correctness under load\n\nA fresh key with a limit of %d per minute, asked for 1 permit by %d requests at once (%d in flight), once per round: how many each system admitted, median (min–max). Exactly %d is right for every algorithm here while the burst lasts less than the time one permit takes to come back (0.6 s at 100 per minute for a token bucket), and unless a fixed window's boundary falls inside it (envoy ratelimit's windows are aligned to the clock: a burst that straddles a minute boundary can be admitted up to twice the limit).\n\n| system | admitted of %d | the burst lasted, ms |\n|---|---|---|\n",
		exactLimit, exactRequests, exactConns, exactLimit, exactRequests)
	for i, r := range runs {
		sec.printf("| %s | %s | %s |\n", r.name, stat(admitted[i], "%.0f"), stat(lasted[i], "%.0f"))
	}
	return nil
}
