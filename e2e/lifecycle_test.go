package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/client"
)

// shutdownDelay is how long the server keeps serving, unready, after
// SIGTERM in TestGracefulShutdown.
const shutdownDelay = 2 * time.Second

// TestGracefulShutdown stops the container during a burst of requests: the
// server reports itself unready at once, keeps answering for the shutdown
// delay, never answers 5xx to an acquisition, and exits with status 0. On
// Redis, whose state outlives the replica, a second replica then counts the
// permits taken: exactly one per acquisition answered, so that a request
// that failed as the server stopped took nothing and may safely be retried.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	env := map[string]string{"RATELIMITER_SHUTDOWN_DELAY": shutdownDelay.String()}
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		gracefulShutdown(t, startService(t, env), nil)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		// A generous Redis timeout: the suite's other tests share the
		// cores, and a degraded denial would be a wrong answer here.
		env := maps.Clone(env)
		env["RATELIMITER_REDIS_TIMEOUT"] = "2s"
		_, replicas := sharedRedis(t, 2, env)
		gracefulShutdown(t, replicas[0], replicas[1])
	})
}

// gracefulShutdown runs TestGracefulShutdown's burst against svc and stops
// it; counter, when not nil, shares svc's state and counts the permits
// taken once svc has stopped.
func gracefulShutdown(t *testing.T, svc, counter *service) {
	ctx := t.Context()
	const name = "shutdown-burst"
	// A sliding log over an hour: nothing taken comes back during the
	// test, so what is available afterwards tells exactly how much was
	// taken.
	const limit = 1_000_000
	algorithm := client.AlgorithmSlidingLog
	put(t, svc.api, name, client.LimiterSpec{Limit: limit, Period: "1h", Algorithm: &algorithm})

	var (
		done      = make(chan struct{}) // closed once the container has exited
		wg        sync.WaitGroup
		unreadyAt atomic.Int64 // unix nanoseconds of the first 503 from /readyz
		unready   atomic.Pointer[client.GetReadinessResponse]
		mu        sync.Mutex
		answered  []time.Time // when each acquisition was answered 200
		refused   int         // acquisitions that failed to connect or were cut
		bad       []string    // what must not happen
	)
	record := func(f func()) {
		mu.Lock()
		defer mu.Unlock()
		f()
	}

	const workers = 6
	for range workers {
		wg.Go(func() {
			one := int64(1)
			for {
				select {
				case <-done:
					return
				default:
				}
				res, err := svc.api.AcquireWithResponse(ctx, name, client.AcquireRequest{Permits: &one})
				now := time.Now()
				switch {
				case err != nil && isConnectionError(err):
					record(func() { refused++ })
					time.Sleep(10 * time.Millisecond)
				case err != nil:
					record(func() { bad = append(bad, "acquire: "+err.Error()) })
				case res.StatusCode() >= 500:
					record(func() { bad = append(bad, "acquire: got "+res.Status()+" "+string(res.Body)+", want no 5xx") })
				case res.JSON200 == nil || !res.JSON200.Allowed:
					record(func() { bad = append(bad, "acquire: got "+res.Status()+" "+string(res.Body)+", want a grant") })
				default:
					record(func() { answered = append(answered, now) })
				}
			}
		})
	}
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			res, err := svc.api.GetReadinessWithResponse(ctx)
			if err != nil || unreadyAt.Load() != 0 {
				continue
			}
			switch {
			case res.StatusCode() == http.StatusServiceUnavailable:
				unready.Store(res)
				unreadyAt.Store(time.Now().UnixNano())
			case res.StatusCode() != http.StatusOK:
				record(func() {
					bad = append(bad, "readyz: got "+res.Status()+" "+string(res.Body)+", want 200 or a 503 problem")
				})
			}
		}
	})

	// Let the burst run a moment, then stop the container as an
	// orchestrator would: SIGTERM, and SIGKILL after the timeout.
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n, b := len(answered), len(bad)
		mu.Unlock()
		if n >= 50 {
			break
		}
		if b > 0 || time.Since(start) > 30*time.Second {
			close(done)
			wg.Wait()
			t.Fatalf("before stopping: got %d acquisitions answered in %v, want 50; failures: %q", n, time.Since(start), bad)
		}
	}
	timeout := shutdownDelay + 20*time.Second
	stopAt := time.Now()
	stopErr := svc.ctr.Stop(ctx, &timeout)
	stoppedAt := time.Now()
	close(done)
	wg.Wait()
	if stopErr != nil {
		t.Fatalf("stop: %v", stopErr)
	}

	state, err := svc.ctr.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if state.Running || state.ExitCode != 0 || state.OOMKilled {
		t.Errorf("after stop: got running %v, exit code %d, OOM-killed %v; want exited with 0", state.Running, state.ExitCode, state.OOMKilled)
	}
	if took := stoppedAt.Sub(stopAt); took < shutdownDelay {
		t.Errorf("the container exited %v after SIGTERM, want no sooner than the shutdown delay, %v", took, shutdownDelay)
	}
	for _, b := range bad {
		t.Error(b)
	}

	unreadySince := time.Unix(0, unreadyAt.Load())
	if res := unready.Load(); res == nil || unreadySince.Before(stopAt) || unreadySince.After(stoppedAt) {
		t.Errorf("/readyz: got no 503 between SIGTERM and exit, want one during the shutdown delay")
	} else {
		checkProblem(t, res, http.StatusServiceUnavailable, "/readyz", "")
	}
	afterUnready := 0
	for _, at := range answered {
		if unreadyAt.Load() != 0 && at.After(unreadySince) {
			afterUnready++
		}
	}
	if afterUnready == 0 {
		t.Errorf("got no acquisition answered once /readyz said 503, want the server to keep serving during the delay")
	}
	t.Logf("%d acquisitions answered (%d while unready), %d refused or cut; exited %v after SIGTERM",
		len(answered), afterUnready, refused, stoppedAt.Sub(stopAt).Round(time.Millisecond))
	if counter != nil {
		if taken := limit - available(t, counter.api, name); taken != int64(len(answered)) {
			t.Errorf("permits taken: got %d, want %d, one per acquisition answered (%d failed as the server stopped)", taken, len(answered), refused)
		}
	}

	t.Run("logs", func(t *testing.T) {
		_, stderr, err := svc.logs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var msgs []string
		sc := bufio.NewScanner(bytes.NewReader(stderr))
		for sc.Scan() {
			var rec struct{ Level, Msg string }
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				t.Fatalf("stderr: want JSON log records, got %q: %v", sc.Text(), err)
			}
			if rec.Level == "ERROR" {
				t.Errorf("log: got an error record %s", sc.Text())
			}
			msgs = append(msgs, rec.Msg)
		}
		n := len(msgs)
		if n < 2 || msgs[n-2] != "shutting down" || msgs[n-1] != "stopped" {
			t.Errorf("log: got %q, want it to end with \"shutting down\" and \"stopped\"", msgs)
		}
	})
}

// isConnectionError reports whether err is a failure to connect, or a
// connection closed before the whole answer came: what a client of a
// server that stops may see, as opposed to a wrong answer.
func isConnectionError(err error) bool {
	var (
		urlErr *url.Error
		opErr  *net.OpError
	)
	if errors.As(err, &urlErr) && urlErr.Timeout() {
		return false // a server that hangs is not one that stops
	}
	return errors.As(err, &urlErr) || errors.As(err, &opErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED)
}
