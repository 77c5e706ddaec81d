package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
	"github.com/ratelimiter/ratelimiter/internal/tenant"
)

// problem is an RFC 9457 problem detail to answer with. It is an error so
// that handlers can return one; see problemFor.
type problem struct {
	status       int
	detail       string
	errors       []gen.FieldError
	allow        string // Allow header, for 405
	authenticate string // WWW-Authenticate header, for 401
	// Accept-Encoding header, for a 415 refusing a content coding.
	acceptEncoding string
}

func (p *problem) Error() string {
	return fmt.Sprintf("%d %s: %s", p.status, http.StatusText(p.status), p.detail)
}

// invalid is the 400 problem of one invalid part of a request.
func invalid(location, message string) *problem {
	return &problem{
		status: http.StatusBadRequest,
		detail: "The request is invalid: " + location + " " + message + ".",
		errors: []gen.FieldError{{Location: location, Message: message}},
	}
}

// rejected is the 400 problem of a request the domain refused, with the
// domain's reason.
func rejected(location, reason string) *problem {
	return &problem{
		status: http.StatusBadRequest,
		detail: strings.ToUpper(reason[:1]) + reason[1:] + ".",
		errors: []gen.FieldError{{Location: location, Message: reason}},
	}
}

// invalidAll is the 400 problem of several invalid parts of a request.
func invalidAll(errs []gen.FieldError) *problem {
	if len(errs) == 1 {
		return invalid(errs[0].Location, errs[0].Message)
	}
	return &problem{status: http.StatusBadRequest, detail: "The request is invalid.", errors: errs}
}

const problemJSON = "application/problem+json"

// writeProblem answers r with p.
func (s *server) writeProblem(w http.ResponseWriter, r *http.Request, p *problem) {
	h := w.Header()
	h.Set("Content-Type", problemJSON)
	h.Del("Content-Length")
	if p.allow != "" {
		h.Set("Allow", p.allow)
	}
	if p.authenticate != "" {
		h.Set("WWW-Authenticate", p.authenticate)
	}
	if p.acceptEncoding != "" {
		h.Set("Accept-Encoding", p.acceptEncoding)
	}
	detail, instance := p.detail, r.URL.EscapedPath()
	body := gen.Problem{
		Type:     "about:blank",
		Title:    http.StatusText(p.status),
		Status:   int32(p.status),
		Detail:   &detail,
		Instance: &instance,
	}
	if len(p.errors) > 0 {
		body.Errors = &p.errors
	}
	b, err := json.Marshal(body)
	if err != nil { // cannot happen: every field is a string or a number
		b = []byte(`{"type":"about:blank","title":"Internal Server Error","status":500}`)
	}
	w.WriteHeader(p.status)
	_, _ = w.Write(b)
}

// problemFor maps an error returned by a handler to the problem answered.
// It is the one place where domain errors become HTTP statuses: invalid
// input is a 400, an unknown limiter a 404, a limiter beyond the maximum
// or moved to another group a 409, an unavailable backend, a definition
// not written to disk or an expired request a 503, and anything
// else a 500 whose cause is logged, never sent.
func (s *server) problemFor(r *http.Request, err error) *problem {
	var p *problem
	switch {
	case errors.As(err, &p):
		return p
	case errors.Is(err, limiter.ErrNotFound):
		return &problem{status: http.StatusNotFound, detail: fmt.Sprintf("Limiter %q does not exist.", pathParam(r, "name"))}
	case errors.Is(err, limiter.ErrTooManyLimiters):
		// A conflict with the state of the collection, which the caller can
		// resolve by deleting a limiter (RFC 9110, 15.5.10); not a 507,
		// which would blame the server for a bound set on purpose.
		return &problem{status: http.StatusConflict, detail: fmt.Sprintf("Limiter %q was not created: the service holds its maximum number of limiters. "+
			"Delete one first; replacing an existing limiter is always allowed.", pathParam(r, "name"))}
	case errors.Is(err, limiter.ErrGroupConflict):
		return &problem{status: http.StatusConflict, detail: fmt.Sprintf("Limiter %q was not changed: %s.", pathParam(r, "name"),
			strings.TrimPrefix(reason(err, limiter.ErrGroupConflict), limiter.ErrGroupConflict.Error()+": "))}
	case errors.Is(err, limiter.ErrTooManyKeys):
		return &problem{status: http.StatusConflict, detail: fmt.Sprintf("Limiter %q was not changed: %s.", pathParam(r, "name"),
			strings.TrimPrefix(reason(err, limiter.ErrTooManyKeys), limiter.ErrTooManyKeys.Error()+": "))}
	case errors.Is(err, limiter.ErrNotDurable):
		// A full or failing disk: the operator must see why, the caller
		// what became of its request and that it may retry.
		s.log.ErrorContext(r.Context(), "change not written to the data directory",
			"method", r.Method, "path", r.URL.Path, "error", err)
		if name := pathParam(r, "name"); name != "" {
			return &problem{status: http.StatusServiceUnavailable, detail: fmt.Sprintf("Limiter %q was not changed: the change could not be written to the service's data directory. "+
				"The definition in force before this request still is.", name)}
		}
		// A refund or settlement with an Idempotency-Key: made, and kept
		// under its key, but not yet on disk.
		return &problem{status: http.StatusServiceUnavailable, detail: "The permits were given back, but the record of this request could not be written to the service's data directory. " +
			"Retry it with the same Idempotency-Key: the retry is answered from the record and gives back nothing more."}
	case errors.Is(err, limiter.ErrInvalidKey):
		return rejected(keyLocation(r), reason(err, limiter.ErrInvalidKey))
	case errors.Is(err, limiter.ErrKeyMismatch):
		return rejected(keyLocation(r), strings.TrimPrefix(reason(err, limiter.ErrKeyMismatch), limiter.ErrKeyMismatch.Error()+": "))
	case errors.Is(err, limiter.ErrInvalidK):
		return rejected("query.k", reason(err, limiter.ErrInvalidK))
	case errors.Is(err, limiter.ErrInvalidGroup):
		return rejected("body.group", reason(err, limiter.ErrInvalidGroup))
	case errors.Is(err, limiter.ErrInvalidName):
		return rejected("path.name", reason(err, limiter.ErrInvalidName))
	case errors.Is(err, limiter.ErrInvalidPermits):
		return rejected("body.permits", reason(err, limiter.ErrInvalidPermits))
	case errors.Is(err, limiter.ErrInvalidPolicy):
		return rejected("body", reason(err, limiter.ErrInvalidPolicy))
	case errors.Is(err, limiter.ErrInvalidBatch):
		return rejected("body.acquisitions", reason(err, limiter.ErrInvalidBatch))
	case errors.Is(err, limiter.ErrInvalidPageSize):
		return rejected("query.page_size", reason(err, limiter.ErrInvalidPageSize))
	case errors.Is(err, tenant.ErrInvalidIP):
		return rejected("path.ip", reason(err, tenant.ErrInvalidIP))
	case errors.Is(err, tenant.ErrInvalidK):
		return rejected("query.k", reason(err, tenant.ErrInvalidK))
	case r.Context().Err() != nil:
		// The caller went away: whatever failed, no one reads this answer,
		// and the backend is not to blame.
		return &problem{status: http.StatusServiceUnavailable, detail: "The request was cancelled or timed out."}
	case errors.Is(err, limiter.ErrUnavailable):
		// An outage makes every request fail alike: log one in a while, with
		// how many failed since the last record.
		n := s.unavailable.Add(1)
		s.unavailableLog.Do(func() {
			s.log.WarnContext(r.Context(), "limiter backend unavailable",
				"method", r.Method, "path", r.URL.Path, "error", err, "failures_since_last_record", n-s.unavailableLogged.Swap(n))
		})
		return &problem{status: http.StatusServiceUnavailable, detail: "The limiter backend is unavailable."}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return &problem{status: http.StatusServiceUnavailable, detail: "The request was cancelled or timed out."}
	default:
		s.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		return &problem{status: http.StatusInternalServerError, detail: "internal error"}
	}
}

// keyLocation is where a request names the key of a keyed limiter: in the
// query of a GET (or HEAD), in the body otherwise.
func keyLocation(r *http.Request) string {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return "query.key"
	}
	return "body.key"
}

// reason is the part of a domain error meant for the caller: the text from
// the sentinel on, without the package and operation that wrapped it.
func reason(err, sentinel error) string {
	msg, s := err.Error(), sentinel.Error()
	if i := strings.Index(msg, s); i >= 0 {
		return msg[i:]
	}
	return s
}

// responseError answers the error a handler returned, or that writing its
// answer met.
func (s *server) responseError(w http.ResponseWriter, r *http.Request, err error) {
	if rec, ok := w.(*recorder); ok && rec.status != 0 {
		// The answer is under way: all that is left is to say so.
		s.log.WarnContext(r.Context(), "writing the response failed", "method", r.Method, "path", r.URL.Path, "error", err)
		return
	}
	s.writeProblem(w, r, s.problemFor(r, err))
}

// requestError answers a body the generated code could not decode. The
// validation that ran before makes it rare: a number with a fraction or an
// exponent where an integer is expected.
func (s *server) requestError(w http.ResponseWriter, r *http.Request, err error) {
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te) && te.Field != "":
		s.writeProblem(w, r, invalid("body."+te.Field, kindExpectation(te.Type)))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		s.writeProblem(w, r, invalid("body", "is required"))
	default:
		s.writeProblem(w, r, invalid("body", "does not fit this operation"))
	}
}

func kindExpectation(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "has the wrong type"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "must be an integer"
	case reflect.String:
		return "must be a string"
	case reflect.Bool:
		return "must be a boolean"
	default:
		return "has the wrong type"
	}
}

// paramError answers a path or query parameter the generated code could
// not bind.
func (s *server) paramError(w http.ResponseWriter, r *http.Request, err error) {
	if rec, ok := w.(*recorder); ok {
		rec.op = s.operationOf(r)
	}
	var name string
	var required bool
	var (
		formatErr   *gen.InvalidParamFormatError
		requiredErr *gen.RequiredParamError
		jsonErr     *gen.UnmarshalingParamError
		manyErr     *gen.TooManyValuesForParamError
	)
	switch {
	case errors.As(err, &formatErr):
		name = formatErr.ParamName
	case errors.As(err, &requiredErr):
		name, required = requiredErr.ParamName, true
	case errors.As(err, &jsonErr):
		name = jsonErr.ParamName
	case errors.As(err, &manyErr):
		name = manyErr.ParamName
	}
	info, ok := s.params[name]
	switch {
	case !ok:
		s.writeProblem(w, r, invalidAll(nil))
	case required:
		s.writeProblem(w, r, invalid(info.in+"."+name, "is required"))
	default:
		s.writeProblem(w, r, invalid(info.in+"."+name, info.want))
	}
}

// notFound answers a path no operation serves.
func (s *server) notFound(w http.ResponseWriter, r *http.Request) {
	s.writeProblem(w, r, &problem{status: http.StatusNotFound, detail: fmt.Sprintf("Nothing is served at %s.", r.URL.EscapedPath())})
}

// methodNotAllowed answers a method a path does not support, listing those
// it does.
func (s *server) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodPost, http.MethodDelete} {
		if s.router.Match(chi.NewRouteContext(), routeMethod(m), r.URL.Path) {
			allowed = append(allowed, m)
		}
	}
	s.writeProblem(w, r, &problem{
		status: http.StatusMethodNotAllowed,
		detail: fmt.Sprintf("%s is not allowed on %s.", r.Method, r.URL.EscapedPath()),
		allow:  strings.Join(allowed, ", "),
	})
}
