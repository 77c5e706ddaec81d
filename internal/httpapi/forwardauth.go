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

// serveForwardAuth serves a proxy's auth subrequest: one for every request
// the proxy forwards, the hottest there is. ServeHTTP sends it here before
// the router, and it takes none of the layers a routed operation takes
// (route context, generated wrapper, admit, strict handler): it has no
// path parameter, body or schema to check, and what it reads, the
// forwarding headers, the operation does not declare. It is measured,
// traced and answered as the forwardAuth operation of its method
// (TestForwardAuthBypassesTheRouter).
func (s *server) serveForwardAuth(w http.ResponseWriter, r *http.Request) {
	byMethod := s.ops[anyMethodPath]
	op := byMethod[r.Method]
	if op == nil {
		op = byMethod[otherMethod]
	}
	rec, _ := w.(*recorder)
	if rec != nil {
		rec.op = op
	}
	if p := s.authorize(r, op.scope); p != nil {
		s.writeProblem(w, r, p)
		return
	}
	if s.forward == nil {
		s.writeProblem(w, r, &problem{status: http.StatusNotFound, detail: "No forward_auth rules are configured: add them to the configuration file."})
		return
	}
	req, p := s.forwardAuthRequest(r)
	if p != nil {
		s.writeProblem(w, r, p)
		return
	}
	ctx, span := s.serverSpan(r.Context(), r.Header, op)
	if span != nil {
		if rec != nil {
			rec.span = span // observe ends it
		} else {
			defer span.End()
		}
	}
	ans, err := s.forwardAuth(ctx, &req)
	if err == nil {
		err = ans.write(w)
	}
	if err != nil {
		s.responseError(w, r, err)
	}
}

// forwardAuthRequest reads what r's proxy says of the request it asks
// about: its method, host and path from the headers above, the first
// found of each (the proxy must set them all, or a client's own would be
// read), and the client from the forwarding header. X-Forwarded-Proto and
// Forwarded's proto= and host= are not read: no rule matches on the
// scheme. Nothing a proxy forwards from its client is refused by a schema:
// a forwarding header that names no client yields the peer (see
// forwardauth.ClientIP). The one refusal is a path that a rule needs and
// the proxy did not send.
func (s *server) forwardAuthRequest(r *http.Request) (forwardauth.Request, *problem) {
	cfg := s.forward.Config()
	req := forwardauth.Request{
		Method: firstOf(r.Header.Get(hdrForwardedMethod), r.Header.Get(hdrOriginalMethod), r.Method),
		Host:   firstOf(r.Header.Get(hdrForwardedHost), r.Host),
		Path:   firstOf(r.Header.Get(hdrForwardedURI), r.Header.Get(hdrOriginalURI)),
		Header: r.Header,
	}
	if req.Path == "" {
		for _, rule := range cfg.Rules {
			if rule.PathPrefix != "" {
				return req, &problem{status: http.StatusBadRequest, detail: "The proxy sent neither X-Forwarded-Uri nor X-Original-URI, and a forward_auth rule matches by path: set one of them in the proxy's configuration."}
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
		return req, &problem{status: http.StatusBadRequest, detail: "The connection has no IP address to tell the client by."}
	}
	req.Client = client
	return req, nil
}

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// ForwardAuth serves the generated route of the forwardAuth operation,
// which no request reaches: ServeHTTP serves its path before the router
// (see serveForwardAuth), since the answer depends on headers the
// operation does not declare, which a strict handler cannot read.
func (s *server) ForwardAuth(context.Context, gen.ForwardAuthRequestObject) (gen.ForwardAuthResponseObject, error) {
	return nil, errors.New("httpapi: forward-auth requests are served before the router")
}

// forwardAuth decides whether the request a proxy asks about may pass.
func (s *server) forwardAuth(ctx context.Context, req *forwardauth.Request) (forwardAnswer, error) {
	a, err := s.forward.Decide(ctx, *req)
	if errors.Is(err, forwardauth.ErrNoClient) {
		return forwardAnswer{}, &problem{status: http.StatusBadRequest, detail: "The client's address, " + req.Client.String() + ", cannot key a limit."}
	}
	if err != nil {
		return forwardAnswer{}, err
	}
	if a.Failed != nil {
		s.log.WarnContext(ctx, "forward-auth decision failed; answered by the failure mode", "error", a.Failed, "allowed", a.Allowed)
	}
	if len(a.Items) > 0 && a.Failed == nil && !a.Verdict.Replayed {
		for _, c := range a.Verdict.Checks {
			s.tel.decided(c.Name, limiter.Decision{Permits: c.Permits, Allowed: a.Verdict.Allowed, Degraded: a.Verdict.Degraded})
		}
	}
	ans := forwardAnswer{a: a, status: http.StatusOK}
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

// write writes f to w.
func (f *forwardAnswer) write(w http.ResponseWriter) error {
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
	h.Set(hdrRetryAfter, strconv.FormatInt(retry, 10))
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

// denial returns the Retry-After of a denial, in whole seconds, and why
// it was denied. Every denial has one, as proxies and clients expect: a
// denial that waiting does not end (a refused path, no rule matches and
// unmatched requests are denied, or a rule asks more than its limiter can
// ever hold) and one made without the backend get 1, the least the header
// says, as no wait is known to help.
func (f *forwardAnswer) denial() (int64, string) {
	a := f.a
	switch {
	case a.Refused != nil:
		return 1, "The request's path is refused: it has a dot segment, a control character or escapes nested too deep, which upstreams route differently."
	case len(a.Items) == 0:
		return 1, "No forward_auth rule matches the request, and unmatched requests are denied."
	case a.Degraded():
		return 1, "The limits could not be checked, and the failure mode is fail-closed."
	}
	var over, never []string
	for _, c := range a.Verdict.Checks {
		switch {
		case c.ExceedsCapacity:
			never = append(never, c.Name)
		case !c.Fits:
			over = append(over, c.Name)
		}
	}
	if len(never) > 0 {
		return 1, fmt.Sprintf("A forward_auth rule asks more of %s than it can ever hold: waiting will not help.", strings.Join(never, ", "))
	}
	retry := max(1, int64((a.Verdict.RetryAfter+time.Second-1)/time.Second))
	return retry, fmt.Sprintf("Over the limit of %s: retry in %d s.", strings.Join(over, ", "), retry)
}
