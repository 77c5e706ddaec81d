package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/ratelimiter/ratelimiter/internal/gen"
	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The acquireBatch operation is hot and its body large: kin-openapi would
// spend more on validating it than the decisions cost, and encoding/json
// more on the answer. checkBatch reads the body by hand, as strictly as the
// spec (TestFastValidationAgreesWithSpec), and batchAnswer writes the
// answer by hand, as the generated code would (TestBatchAnswerMatchesGenerated).

// batch is the acquisitions of one acquireBatch request and room for their
// results. Batches are reused from one request to the next: a batch of 100
// would otherwise leave about 9 KB a request to the garbage collector.
type batch struct {
	reqs    []limiter.Request
	results []limiter.Result
}

var batches = sync.Pool{New: func() any { return new(batch) }}

// release returns b for reuse, holding no names or errors.
func (b *batch) release() {
	clear(b.reqs)
	clear(b.results)
	b.reqs, b.results = b.reqs[:0], b.results[:0]
	batches.Put(b)
}

// batchKey is the context key of the batch checkBatch read.
type batchKey struct{}

// withBatch hands the generated handler the batch validateFast read, which
// the generated code has no other way to carry.
func withBatch(r *http.Request, b *batch) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), batchKey{}, b))
}

// batchOf returns the batch validateFast read, if it did.
func batchOf(ctx context.Context) (*batch, bool) {
	b, ok := ctx.Value(batchKey{}).(*batch)
	return b, ok
}

// checkBatch reads a BatchAcquireRequest body, which is valid JSON: an
// object whose only member is "acquisitions", an array of 1 to
// limiter.MaxBatch objects, each with a "limiter" name, an optional "key"
// and optional "permits". It appends the acquisitions to reqs, permits
// defaulting to 1, or returns the first thing wrong with the body.
func checkBatch(data []byte, reqs []limiter.Request) ([]limiter.Request, *problem) {
	p := checkEnvelope(data, "acquisitions", func(value []byte) (p *problem) {
		reqs, p = checkAcquisitions(value, reqs)
		return p
	})
	if p != nil {
		return nil, p
	}
	return reqs, nil
}

// checkEnvelope reads a body, which is valid JSON, that must be an object
// whose only member is the one named member, and has read read its value.
func checkEnvelope(data []byte, member string, read func(value []byte) *problem) *problem {
	var (
		p    *problem
		seen bool
	)
	isObject := members(data, func(name, value []byte) bool {
		switch {
		case string(name) != member:
			p = invalid("body."+string(name), "is not a known field")
		case seen:
			p = invalid("body."+member, "appears more than once")
		default:
			seen = true
			p = read(value)
		}
		return p == nil
	})
	switch {
	case !isObject:
		return invalid("body", "must be an object")
	case p == nil && !seen:
		return invalid("body."+member, "is required")
	}
	return p
}

// checkAcquisitions appends the acquisitions of the array in data to reqs.
func checkAcquisitions(data []byte, reqs []limiter.Request) ([]limiter.Request, *problem) {
	// Room for as many acquisitions as the array can hold at its shortest,
	// {"limiter":"x"} with a comma, so that it never grows.
	reqs = slices.Grow(reqs, min(len(data)/len(`{"limiter":"x"},`)+1, limiter.MaxBatch))
	p := checkList(data, "body.acquisitions", limiter.MaxBatch, func(r limiter.Request) { reqs = append(reqs, r) })
	return reqs, p
}

// checkList reads the array at location list, of 1 to most objects that
// checkAcquisition reads, and calls add with each of them, in order.
func checkList(data []byte, list string, most int, add func(limiter.Request)) *problem {
	switch data[0] {
	case 'n':
		return invalid(list, "must not be null")
	case '[':
	default:
		return invalid(list, "must be an array")
	}
	var (
		p    *problem
		n    int
		prev string
	)
	elements(data, func(value []byte) bool {
		if n == most {
			p = invalid(list, fmt.Sprintf("must have at most %d items", most))
			return false
		}
		var r limiter.Request
		if r, p = checkAcquisition(value, list, n, prev); p != nil {
			return false
		}
		add(r)
		n, prev = n+1, r.Name
		return true
	})
	if p == nil && n == 0 {
		p = invalid(list, "must have at least 1 item")
	}
	return p
}

// checkAcquisition reads the object at index i of the list at location
// list: a BatchAcquisition or a DecideItem, which have the same members.
// prev is the limiter of the one before it: a batch often names one
// limiter many times, and the same name is then the same string.
func checkAcquisition(data []byte, list string, i int, prev string) (limiter.Request, *problem) {
	// where is the place of the object's field in the body, for a
	// problem: it is only built for one.
	where := func(field string) string { return list + "." + strconv.Itoa(i) + field }
	r := limiter.Request{Permits: 1}
	switch data[0] {
	case 'n':
		return r, invalid(where(""), "must not be null")
	case '{':
	default:
		return r, invalid(where(""), "must be an object")
	}
	var (
		p                           *problem
		hasName, hasPermits, hasKey bool
	)
	members(data, func(key, value []byte) bool {
		switch string(key) {
		case "limiter":
			switch {
			case hasName:
				p = invalid(where(".limiter"), "appears more than once")
			case value[0] == 'n':
				p = invalid(where(".limiter"), "must not be null")
			case value[0] != '"':
				p = invalid(where(".limiter"), "must be a string")
			default:
				hasName = true
				if v := value[1 : len(value)-1]; prev != "" && string(v) == prev {
					r.Name = prev // an escape-free string equal to prev: prev's value
				} else {
					r.Name = jsonString(value)
				}
				if msg := checkName(r.Name); msg != "" {
					p = invalid(where(".limiter"), msg)
				}
			}
		case "key":
			if hasKey {
				p = invalid(where(".key"), "appears more than once")
				break
			}
			hasKey = true
			var msg string
			if r.Key, msg = checkKey(value); msg != "" {
				p = invalid(where(".key"), msg)
			}
		case "permits":
			if hasPermits {
				p = invalid(where(".permits"), "appears more than once")
				break
			}
			hasPermits = true
			var msg string
			if r.Permits, msg = checkPermits(value); msg != "" {
				p = invalid(where(".permits"), msg)
			}
		default:
			p = invalid(where("."+string(key)), "is not a known field")
		}
		return p == nil
	})
	if p == nil && !hasName {
		p = invalid(where(".limiter"), "is required")
	}
	return r, p
}

// jsonString is the value of the JSON string v, which is valid, as
// encoding/json reads it: escapes decoded, and each byte that is not UTF-8
// replaced by U+FFFD, so that the fast paths and the generated ones read
// one key alike.
func jsonString(v []byte) string {
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return string(s)
	}
	var out string
	_ = json.Unmarshal(v, &out) // valid JSON: cannot fail
	return out
}

// maxPooledAnswer bounds the answer buffers kept for reuse: the answer to
// a large batch is left to the garbage collector.
const maxPooledAnswer = 64 << 10

// batchAnswer is the 200 answer of acquireBatch: results[i] answers
// reqs[i], with problems[i] when it failed. Writing it returns the batch to
// batches when pooled is set, that is when the batch came from there.
type batchAnswer struct {
	*batch
	problems map[int]*gen.Problem
	pooled   bool
}

var _ gen.AcquireBatchResponseObject = (*batchAnswer)(nil)

func (a *batchAnswer) VisitAcquireBatchResponse(w http.ResponseWriter) error {
	if a.pooled {
		defer a.release()
	}
	buf := buffers.Get().(*[]byte)
	defer buffers.Put(buf)
	b := append((*buf)[:0], `{"results":[`...)
	for i, r := range a.results {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		status := http.StatusOK
		p := a.problems[i]
		if p == nil {
			b = append(b, `"decision":`...)
			key := a.reqs[i].Key
			b = appendDecision(b, r.Decision, key != "", key, r.KeysFull)
			b = append(b, ',')
		}
		b = append(b, `"limiter":`...)
		b = appendJSONString(b, a.reqs[i].Name)
		if p != nil {
			// Rare: encoding/json, as the generated code would.
			js, err := json.Marshal(p)
			if err != nil {
				return err
			}
			b = append(b, `,"problem":`...)
			b = append(b, js...)
			status = int(p.Status)
		}
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(status), 10)
		b = append(b, '}')
	}
	b = append(b, "]}\n"...)
	if cap(b) <= maxPooledAnswer {
		*buf = b
	}
	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	h["Content-Length"] = []string{strconv.Itoa(len(b))}
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(b)
	return err
}
