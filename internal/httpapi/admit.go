package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// admit lets a routed request through to the generated handler only once
// it is authorized and valid: bearer token, body size, Content-Type, JSON
// syntax, then the spec, through kin-openapi or, for the hot operations,
// through validateFast. It runs as the generated routes' middleware.
func (s *server) admit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := s.operationOf(r)
		raw := w
		if rec, ok := w.(*recorder); ok {
			rec.op = op
			raw = rec.ResponseWriter
		}
		if op == nil { // every generated route is an operation of the spec
			next.ServeHTTP(w, r)
			return
		}
		if op.scope != 0 {
			if p := s.authorize(r, op.scope); p != nil {
				s.writeProblem(w, r, p)
				return
			}
		}
		var b *body
		if op.body {
			var p *problem
			if b, p = s.readBody(raw, r); p != nil {
				s.writeProblem(w, r, p)
				return
			}
			if b != nil {
				defer b.release()
			}
		}
		if b != nil {
			// Before any validator walks the body: bounded in depth, and
			// free of what kin-openapi would let through. The hot
			// operations' own checks refuse duplicates and nulls.
			check := checkMembers
			if op.fast != fastNone {
				check = checkDepth
			}
			if p := check(b.buf); p != nil {
				s.writeProblem(w, r, p)
				return
			}
		}
		if op.fast != fastNone {
			r, p := validateFast(op, r, b)
			if p != nil {
				s.writeProblem(w, r, p)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if r.Method == http.MethodHead {
			// kin-openapi knows the GET operation only: check the request
			// as that GET, and serve the HEAD.
			get := r.Clone(r.Context())
			get.Method = http.MethodGet
			s.validator(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { next.ServeHTTP(w, r) })).ServeHTTP(w, get)
			return
		}
		s.validator(next).ServeHTTP(w, r)
	})
}

// body is a request body read ahead of the handlers, from a pool.
type body struct {
	buf   []byte
	rd    bytes.Reader
	value map[string]any // the body as validateFast checked it
}

var bodies = sync.Pool{New: func() any { return &body{buf: make([]byte, 0, 512), value: make(map[string]any, 1)} }}

func (b *body) Read(p []byte) (int, error) { return b.rd.Read(p) }
func (b *body) Close() error               { return nil }

func (b *body) release() {
	if cap(b.buf) > DefaultMaxBodyBytes {
		return // leave large buffers to the garbage collector
	}
	b.buf = b.buf[:0]
	b.rd.Reset(nil)
	bodies.Put(b)
}

// checkedBody is a body validateFast has checked. Like the bodies
// kin-openapi validates, it gives the generated handler the checked value
// through ValidatedValue, which oapi-codegen's runtime binds instead of
// decoding the JSON again.
type checkedBody struct{ *body }

// ValidatedValue returns the body as a generic JSON value.
func (c checkedBody) ValidatedValue() any { return c.value }

// readBody reads r's body, if any, within the size limit, checks that it
// is JSON, and sets it as r.Body again. It returns nil and no problem for a
// request without a body.
func (s *server) readBody(w http.ResponseWriter, r *http.Request) (*body, *problem) {
	if r.ContentLength > s.maxBody {
		return nil, s.tooLarge()
	}
	if r.ContentLength == 0 {
		return nil, nil
	}
	ct := r.Header.Get("Content-Type")
	if ct != "" && !isJSON(ct) {
		return nil, unsupportedMediaType()
	}
	b := bodies.Get().(*body)
	var err error
	b.buf, err = readAll(b.buf[:0], http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		b.release()
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, s.tooLarge()
		}
		return nil, &problem{status: http.StatusBadRequest, detail: "The request body could not be read."}
	}
	if len(b.buf) == 0 {
		b.release()
		r.Body = http.NoBody
		return nil, nil
	}
	if !isJSON(ct) {
		b.release()
		return nil, unsupportedMediaType()
	}
	if !json.Valid(b.buf) {
		b.release()
		return nil, invalid("body", "is not valid JSON")
	}
	b.rd.Reset(b.buf)
	r.Body = b
	return b, nil
}

func (s *server) tooLarge() *problem {
	return &problem{status: http.StatusRequestEntityTooLarge, detail: fmt.Sprintf("The request body exceeds %d bytes.", s.maxBody)}
}

func unsupportedMediaType() *problem {
	return &problem{status: http.StatusUnsupportedMediaType, detail: "The request body must be application/json."}
}

// isJSON reports whether a Content-Type is application/json, with or
// without parameters.
func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// readAll appends all of r to dst.
func readAll(dst []byte, r io.Reader) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}
