package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
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
// is JSON in UTF-8, without a content coding, and sets it as r.Body again.
// It returns nil and no problem for a request without a body.
func (s *server) readBody(w http.ResponseWriter, r *http.Request) (*body, *problem) {
	if r.ContentLength > s.maxBody {
		return nil, s.tooLarge()
	}
	if r.ContentLength == 0 {
		return nil, nil
	}
	if !identity(r.Header[hdrContentEncoding]) {
		return nil, unsupportedCoding()
	}
	ct := r.Header.Get("Content-Type")
	if ct != "" {
		if p := checkMediaType(ct); p != nil {
			return nil, p
		}
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
	if ct == "" {
		b.release()
		return nil, unsupportedMediaType()
	}
	if !json.Valid(b.buf) {
		b.release()
		return nil, invalid("body", "is not valid JSON")
	}
	if p := checkText(b.buf); p != nil {
		b.release()
		return nil, p
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

// unsupportedCoding is the answer to a body with a content coding: RFC
// 9110, 15.5.16, asks that it say in Accept-Encoding which codings would
// have been accepted.
func unsupportedCoding() *problem {
	return &problem{
		status:         http.StatusUnsupportedMediaType,
		detail:         "The request body must be sent as it is, without a Content-Encoding.",
		acceptEncoding: "identity",
	}
}

const hdrContentEncoding = "Content-Encoding"

// identity reports whether the Content-Encoding values name no coding but
// identity (RFC 9110, 8.4): the body is as it reads. No values, or empty
// ones, name none.
func identity(vs []string) bool {
	for _, v := range vs {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return false
			}
		}
	}
	return true
}

// checkMediaType tells what is wrong with the Content-Type of a body, or
// returns nil: it must be application/json, without parameters or with a
// charset of UTF-8 (RFC 8259, 8.1). A malformed parameter leaves the
// charset unknown, and is refused too.
func checkMediaType(ct string) *problem {
	mt, params, ok := strings.Cut(ct, ";")
	if !strings.EqualFold(strings.TrimSpace(mt), "application/json") {
		return unsupportedMediaType()
	}
	if p := strings.TrimSpace(params); !ok || p == "" || strings.EqualFold(p, "charset=utf-8") {
		return nil // the usual cases: nothing to parse
	}
	_, ps, err := mime.ParseMediaType(ct)
	if charset, ok := ps["charset"]; err != nil || ok && !strings.EqualFold(charset, "utf-8") {
		return &problem{status: http.StatusUnsupportedMediaType, detail: "The request body must be application/json in UTF-8, with no other charset."}
	}
	return nil
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
