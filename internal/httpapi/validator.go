package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	nethttpmiddleware "github.com/oapi-codegen/nethttp-middleware"

	"github.com/ratelimiter/ratelimiter/internal/gen"
)

// newValidator returns the kin-openapi request validation of doc, which
// answers invalid requests with problems.
func newValidator(doc *openapi3.T, s *server) func(http.Handler) http.Handler {
	return nethttpmiddleware.OapiRequestValidatorWithOptions(doc, &nethttpmiddleware.Options{
		Options: openapi3filter.Options{
			// Bearer tokens are checked by authorize, before validation.
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
			MultiError:         true,
			SchemaValidationOptions: []openapi3.SchemaValidationOption{
				openapi3.DisableSchemaErrorDetails(),
				openapi3.MultiErrors(),
			},
		},
		ErrorHandlerWithOpts:  s.validationFailed,
		DoNotValidateServers:  true,
		SilenceServersWarning: true,
	})
}

// validationFailed answers a request kin-openapi found invalid.
func (s *server) validationFailed(_ context.Context, err error, w http.ResponseWriter, r *http.Request, opts nethttpmiddleware.ErrorHandlerOpts) {
	switch opts.StatusCode {
	case http.StatusBadRequest:
		s.writeProblem(w, r, invalidAll(fieldErrors(err)))
	case http.StatusNotFound:
		s.notFound(w, r)
	case http.StatusMethodNotAllowed:
		s.methodNotAllowed(w, r)
	default:
		s.writeProblem(w, r, s.problemFor(r, err))
	}
}

// fieldErrors describes the invalid parts of a request from kin-openapi's
// errors, in words of the spec: never Go types nor the validator's text.
func fieldErrors(err error) []gen.FieldError {
	var out []gen.FieldError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case openapi3.MultiError:
			for _, e := range e {
				walk(e)
			}
		case *openapi3filter.RequestError:
			out = append(out, requestErrorFields(e)...)
		default:
			out = append(out, gen.FieldError{Location: "request", Message: "is invalid"})
		}
	}
	walk(err)
	return out
}

func requestErrorFields(re *openapi3filter.RequestError) []gen.FieldError {
	loc := "body"
	var schema *openapi3.Schema
	if p := re.Parameter; p != nil {
		loc = p.In + "." + p.Name
		if p.Schema != nil {
			schema = p.Schema.Value
		}
	}
	var ses []*openapi3.SchemaError
	collectSchemaErrors(re.Err, &ses)
	if len(ses) == 0 {
		msg := "is invalid"
		switch {
		case errors.Is(re.Err, openapi3filter.ErrInvalidRequired):
			msg = "is required"
		case errors.Is(re.Err, openapi3filter.ErrInvalidEmptyValue):
			msg = "must not be empty"
		case schema != nil:
			msg = expectation(schema)
		case re.Parameter == nil:
			msg = "is not valid JSON"
		}
		return []gen.FieldError{{Location: loc, Message: msg}}
	}
	out := make([]gen.FieldError, 0, len(ses))
	for _, se := range ses {
		where := loc
		for _, k := range se.JSONPointer() {
			where += "." + k
		}
		leaf := se
		for {
			var inner *openapi3.SchemaError
			if leaf.Origin == nil || !errors.As(leaf.Origin, &inner) {
				break
			}
			leaf = inner
		}
		where, msg := schemaMessage(where, leaf)
		out = append(out, gen.FieldError{Location: where, Message: msg})
	}
	return out
}

func collectSchemaErrors(err error, out *[]*openapi3.SchemaError) {
	switch e := err.(type) {
	case openapi3.MultiError:
		for _, e := range e {
			collectSchemaErrors(e, out)
		}
	case *openapi3.SchemaError:
		*out = append(*out, e)
	default:
		if se, ok := errors.AsType[*openapi3.SchemaError](err); ok {
			*out = append(*out, se)
		}
	}
}

// schemaMessage words a schema violation at where, and may make where more
// precise.
func schemaMessage(where string, se *openapi3.SchemaError) (string, string) {
	s := se.Schema
	if s == nil {
		return where, "is invalid"
	}
	switch se.SchemaField {
	case "type":
		if types := s.Type.Slice(); len(types) > 0 {
			return where, "must be " + article(types[0])
		}
	case "nullable":
		return where, "must not be null"
	case "minimum":
		return where, "must be at least " + number(s.Min)
	case "maximum":
		return where, "must be at most " + number(s.Max)
	case "minLength":
		return where, fmt.Sprintf("must be at least %d characters long", s.MinLength)
	case "maxLength":
		return where, fmt.Sprintf("must be at most %d characters long", *s.MaxLength)
	case "pattern":
		if msg, ok := s.Extensions["x-pattern-message"].(string); ok {
			return where, msg
		}
		return where, "must match the pattern " + s.Pattern
	case "enum":
		vals := make([]string, len(s.Enum))
		for i, v := range s.Enum {
			vals[i] = fmt.Sprint(v)
		}
		return where, "must be one of " + strings.Join(vals, ", ")
	case "required":
		return where, "is required"
	case "properties", "additionalProperties":
		if name, ok := quotedName(se.Reason); ok {
			return where + "." + name, "is not a known field"
		}
		return where, "has a field that is not known"
	}
	return where, "is invalid"
}

// quotedName extracts x from kin-openapi's `property "x" is unsupported`.
func quotedName(reason string) (string, bool) {
	_, rest, ok := strings.Cut(reason, "property ")
	if !ok {
		return "", false
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", false
	}
	name, err := strconv.Unquote(q)
	return name, err == nil
}

func article(typ string) string {
	switch typ {
	case "integer", "object", "array":
		return "an " + typ
	default:
		return "a " + typ
	}
}

func number(f *float64) string {
	if f == nil {
		return "?"
	}
	return strconv.FormatFloat(*f, 'f', -1, 64)
}
