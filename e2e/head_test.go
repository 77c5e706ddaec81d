package e2e

import (
	"net/http"
	"testing"

	"github.com/ratelimiter/ratelimiter/client"
)

// TestHead: HEAD is answered wherever GET is, with GET's status and
// headers and no body, and takes nothing; an acquisition is not a GET, so
// HEAD on it is refused.
func TestHead(t *testing.T) {
	t.Parallel()
	svc := sharedService(t)
	const name = "head"
	put(t, svc.api, name, client.LimiterSpec{Limit: 5, Period: "1h"})
	take(t, svc.api, name, 2, true)

	for _, path := range []string{
		"/livez", "/readyz", "/metrics", "/openapi.yaml", "/openapi.json", "/docs/",
		"/v1/limiters", "/v1/limiters/" + name, "/v1/limiters/" + name + "/available",
		"/v1/limiters/head-absent", "/v1/tenants/policy", "/v1/tenants/lowest", "/v1/tenants/192.0.2.77/available",
		"/docs/no-such-file",
	} {
		t.Run(path, func(t *testing.T) {
			get, _ := send(t, svc, http.MethodGet, path)
			head, body := send(t, svc, http.MethodHead, path)
			if head.StatusCode != get.StatusCode {
				t.Errorf("HEAD %s: got %d, want GET's %d", path, head.StatusCode, get.StatusCode)
			}
			if got, want := head.Header.Get("Content-Type"), get.Header.Get("Content-Type"); got != want {
				t.Errorf("HEAD %s: Content-Type %q, want GET's %q", path, got, want)
			}
			if len(body) != 0 {
				t.Errorf("HEAD %s: got a body of %d bytes, want none", path, len(body))
			}
		})
	}
	t.Run("acquire", func(t *testing.T) {
		res, _ := send(t, svc, http.MethodHead, "/v1/limiters/"+name+"/acquire")
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != http.MethodPost {
			t.Errorf("HEAD on acquire: got %d, Allow %q; want 405, Allow POST", res.StatusCode, res.Header.Get("Allow"))
		}
		if got := available(t, svc.api, name); got != 3 {
			t.Errorf("available after the HEADs: got %d, want 3", got)
		}
	})
}
