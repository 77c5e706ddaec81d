package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimiter/ratelimiter/internal/forwardauth"
	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Headers a proxy describes the request it asks about with.
const (
	hdrForwardedMethod = "X-Forwarded-Method"
	hdrOriginalMethod  = "X-Original-Method"
	hdrForwardedHost   = "X-Forwarded-Host"
	hdrForwardedURI    = "X-Forwarded-Uri"
	hdrOriginalURI     = "X-Original-Uri"
	hdrDegraded        = "Ratelimiter-Degraded"
)

type forwardedKey struct{}

// forwardAuthRequest reads what r's proxy says of the request it asks
// about, and hands it to the handler in r's context. Nothing a proxy
// forwards from its client is refused by a schema: a forwarding header
// that names no client yields the peer (see forwardauth.ClientIP). The
// one refusal is a path that a rule needs and the proxy did not send.
func (s *server) forwardAuthRequest(r *http.Request) (*http.Request, *problem) {
	if s.forward == nil {
		return r, nil
	}
	cfg := s.forward.Config()
	req := forwardauth.Request{
		Method: firstOf(r.Header.Get(hdrForwardedMethod), r.Header.Get(hdrOriginalMethod), r.Method),
		Host:   firstOf(r.Header.Get(hdrForwardedHost), r.Host),
		Path:   firstOf(r.Header.Get(hdrForwardedURI), r.Header.Get(hdrOriginalURI)),
		Header: r.Header.Get,
	}
	if req.Path == "" {
		for _, rule := range cfg.Rules {
			if rule.PathPrefix != "" {
				return r, &problem{status: http.StatusBadRequest, detail: "The proxy sent neither X-Forwarded-Uri nor X-Original-URI, and a forward_auth rule matches by path: set one of them in the proxy's configuration."}
			}
		}
	}
	req.Path, _, _ = strings.Cut(req.Path, "?")
	header := forwardauth.XForwardedFor
	if cfg.ClientIP.Header != "" {
		header = cfg.ClientIP.Header
	}
	client, _, ok := cfg.ClientIP.Resolve(r.RemoteAddr, r.Header.Values(header))
	if !ok {
		return r, &problem{status: http.StatusBadRequest, detail: "The connection has no IP address to tell the client by."}
	}
	req.Client = client
	return r.WithContext(context.WithValue(r.Context(), forwardedKey{}, &req)), nil
}

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// ForwardAuth decides whether the request a proxy asks about may pass.
func (s *server) ForwardAuth(ctx context.Context, _ gen.ForwardAuthRequestObject) (gen.ForwardAuthResponseObject, error) {
	req, _ := ctx.Value(forwardedKey{}).(*forwardauth.Request)
	if s.forward == nil || req == nil {
		return nil, &problem{status: http.StatusNotFound, detail: "No forward_auth rules are configured: add them to the configuration file."}
	}
	a, err := s.forward.Decide(ctx, *req)
	if errors.Is(err, forwardauth.ErrNoClient) {
		return nil, &problem{status: http.StatusBadRequest, detail: "The client's address, " + req.Client.String() + ", cannot key a limit."}
	}
	if err != nil {
		return nil, err
	}
	if a.Failed != nil {
		s.log.WarnContext(ctx, "forward-auth decision failed; answered by the failure mode", "error", a.Failed, "allowed", a.Allowed)
	}
	if len(a.Items) > 0 && a.Failed == nil && !a.Verdict.Replayed {
		for _, c := range a.Verdict.Checks {
			s.tel.decided(c.Name, limiter.Decision{Permits: c.Permits, Allowed: a.Verdict.Allowed, Degraded: a.Verdict.Degraded})
		}
	}
	ans := &forwardAnswer{a: a, status: http.StatusOK}
	if !a.Allowed {
		ans.status = s.forward.Config().DenyStatus
	}
	if len(a.Items) > 0 && !a.Degraded() {
		ans.policy, ans.rateLimit = s.verdictHeaders(ctx, a.Verdict)
	}
	return ans, nil
}

// forwardAnswer is the answer to a proxy: 200 when the request may pass,
// the deny status otherwise, with a problem saying why when it is 429.
// The 200 and the 403, nginx's denial, have no body: nginx's auth_request
// reads only an answer's status and headers, and closes its connection to
// the service when a body follows them.
type forwardAnswer struct {
	a                 forwardauth.Answer
	status            int
	policy, rateLimit string
}

var _ gen.ForwardAuthResponseObject = (*forwardAnswer)(nil)

func (f *forwardAnswer) VisitForwardAuthResponse(w http.ResponseWriter) error {
	h := w.Header()
	if f.policy != "" {
		h.Set(hdrPolicy, f.policy)
		h.Set(hdrRateLimit, f.rateLimit)
	}
	if f.a.Degraded() {
		h.Set(hdrDegraded, "true")
	}
	if f.a.Allowed {
		w.WriteHeader(http.StatusOK)
		return nil
	}
	retry, detail := f.denial()
	if retry > 0 {
		h.Set(hdrRetryAfter, strconv.FormatInt(retry, 10))
	}
	if f.status == http.StatusForbidden {
		// nginx's denial: its auth_request discards the body, and would
		// close its connection after one.
		w.WriteHeader(f.status)
		return nil
	}
	h.Set("Content-Type", problemJSON)
	b, err := json.Marshal(gen.Problem{Type: "about:blank", Title: http.StatusText(f.status), Status: int32(f.status), Detail: &detail})
	if err != nil {
		return err
	}
	w.WriteHeader(f.status)
	_, err = w.Write(b)
	return err
}

// denial returns the Retry-After of a denial, in whole seconds (0 for
// none), and why it was denied.
func (f *forwardAnswer) denial() (int64, string) {
	a := f.a
	switch {
	case len(a.Items) == 0:
		return 0, "No forward_auth rule matches the request, and unmatched requests are denied."
	case a.Degraded():
		return 1, "The limits could not be checked, and the failure mode is fail-closed."
	}
	var over []string
	for _, c := range a.Verdict.Checks {
		if !c.Fits {
			over = append(over, c.Name)
		}
	}
	retry := max(1, int64((a.Verdict.RetryAfter+time.Second-1)/time.Second))
	return retry, fmt.Sprintf("Over the limit of %s: retry in %d s.", strings.Join(over, ", "), retry)
}
