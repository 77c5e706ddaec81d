package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// validateFast checks a request to a hot operation against the spec, as
// kin-openapi would, without its cost: the path parameter, and the
// AcquireRequest, BatchAcquireRequest or DecideRequest body, and the
// Idempotency-Key header. It returns the request to serve, which carries a
// batch's acquisitions or a decision's items.
// TestFastValidationAgreesWithSpec holds the two together.
func validateFast(op *operation, r *http.Request, b *body) (*http.Request, *problem) {
	// A name is checked as sent, escaped, as kin-openapi does: no valid
	// name needs escaping, and '%' is none of its characters. An address
	// is checked unescaped, as the handler gets it, since an IPv6 tenant
	// holds a slash that must be sent as %2F; kin-openapi, which checks
	// the escaped value, would refuse it (see TestTenantKeysRoundTrip).
	switch op.fast {
	case fastLimiter:
		if msg := checkName(chi.URLParam(r, "name")); msg != "" {
			return r, invalid("path.name", msg)
		}
	case fastTenant:
		if msg := checkIP(pathParam(r, "ip")); msg != "" {
			return r, invalid("path.ip", msg)
		}
	case fastBatch:
		if b == nil {
			return r, invalid("body", "is required")
		}
		bt := batches.Get().(*batch)
		var p *problem
		if bt.reqs, p = checkBatch(b.buf, bt.reqs); p != nil {
			bt.release()
			return r, p
		}
		// The generated handler binds an empty body and finds the
		// acquisitions in its context.
		clear(b.value)
		r.Body = checkedBody{b}
		return withBatch(r, bt), nil
	case fastDecide:
		if op.once {
			if p := checkOnceHeader(r.Header); p != nil {
				return r, p
			}
		}
		if b == nil {
			return r, invalid("body", "is required")
		}
		items, p := checkDecide(b.buf)
		if p != nil {
			return r, p
		}
		clear(b.value)
		r.Body = checkedBody{b}
		return withItems(r, items), nil
	}
	if b == nil {
		return r, nil
	}
	permits, key, p := checkAcquire(b.buf)
	if p != nil {
		return r, p
	}
	// Hand the generated handler the value just checked, as kin-openapi
	// does, rather than have it decode the body again.
	clear(b.value)
	if permits != 0 {
		b.value["permits"] = permits
	}
	if key != nil {
		b.value["key"] = *key
	}
	r.Body = checkedBody{b}
	return r, nil
}

// namePattern is the pattern of the LimiterName parameter.
const namePattern = "^[A-Za-z0-9][A-Za-z0-9._-]*$"

// checkName tells what is wrong with a limiter name, or "".
func checkName(name string) string {
	switch {
	case name == "":
		return "must be at least 1 character long"
	case len(name) > limiter.MaxNameLen:
		return fmt.Sprintf("must be at most %d characters long", limiter.MaxNameLen)
	case !limiter.ValidName(name):
		return "must match the pattern " + namePattern
	}
	return ""
}

// ipPattern is the pattern of the TenantIP parameter: an address, or an
// IPv6 tenant with its prefix length. The tenant package decides which
// such strings name a tenant.
const ipPattern = "^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$"

// checkIP tells what is wrong with an IP address parameter, unescaped, or
// "".
func checkIP(ip string) string {
	switch {
	case len(ip) < 2:
		return "must be at least 2 characters long"
	case len(ip) > 49:
		return "must be at most 49 characters long"
	}
	addr, bits, prefix := strings.Cut(ip, "/")
	ok := addr != "" && (!prefix || 1 <= len(bits) && len(bits) <= 3)
	for i := 0; ok && i < len(addr); i++ {
		c := addr[i]
		ok = '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' || c == ':' || c == '.'
	}
	for i := 0; ok && i < len(bits); i++ {
		ok = '0' <= bits[i] && bits[i] <= '9'
	}
	if !ok {
		return "must match the pattern " + ipPattern
	}
	return ""
}

// checkAcquire checks an AcquireRequest body, which is valid JSON: an
// object whose members are "permits", an integer from 1 to
// limiter.MaxLimit, and "key", a string by the Key schema's rule (see
// checkKey). It returns the permits, 0 when left out, and the key, nil
// when left out.
func checkAcquire(data []byte) (int64, *string, *problem) {
	var p *problem
	var permits int64
	var key *string
	isObject := members(data, func(name, value []byte) bool {
		switch {
		case string(name) == "key" && key != nil:
			p = invalid("body.key", "appears more than once")
		case string(name) == "key":
			k, msg := checkKey(value)
			if msg != "" {
				p = invalid("body.key", msg)
			}
			key = &k
		case string(name) != "permits":
			p = invalid("body."+string(name), "is not a known field")
		case permits != 0:
			p = invalid("body.permits", "appears more than once")
		default:
			var msg string
			if permits, msg = checkPermits(value); msg != "" {
				p = invalid("body.permits", msg)
			}
		}
		return p == nil
	})
	if !isObject {
		return 0, nil, invalid("body", "must be an object")
	}
	return permits, key, p
}

// keyPattern is the pattern of the Key schema.
const keyPattern = `^[^\x00-\x1f\x7f-\x9f]+$`

// checkKey reads the JSON value of a key, or tells what is wrong with it by
// the Key schema: a string of 1 to 128 characters, none of them a control
// character. Its length in bytes is the domain's to check
// (limiter.CheckKey).
func checkKey(v []byte) (string, string) {
	if v[0] != '"' {
		return "", "must be a string"
	}
	k := jsonString(v)
	switch n := utf8.RuneCountInString(k); {
	case n == 0:
		return "", "must be at least 1 character long"
	case n > limiter.MaxKeyLen:
		return "", fmt.Sprintf("must be at most %d characters long", limiter.MaxKeyLen)
	}
	for _, r := range k {
		if r < 0x20 || 0x7f <= r && r <= 0x9f {
			return "", "must match the pattern " + keyPattern
		}
	}
	return k, ""
}

// checkPermits reads the JSON value of permits, or tells what is wrong
// with it.
func checkPermits(v []byte) (int64, string) {
	switch v[0] {
	case 'n':
		return 0, "must not be null"
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
	default:
		return 0, "must be an integer"
	}
	neg := v[0] == '-'
	if neg {
		v = v[1:]
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, "must be an integer" // a fraction or an exponent
		}
		if n <= limiter.MaxLimit {
			n = n*10 + int64(c-'0')
		}
	}
	switch {
	case neg || n < 1:
		return 0, "must be at least 1"
	case n > limiter.MaxLimit:
		return 0, fmt.Sprintf("must be at most %d", int64(limiter.MaxLimit))
	}
	return n, ""
}

// members calls fn with the name and raw value of each member of the JSON
// object in data, in order, until fn returns false. data must be valid JSON
// (json.Valid). It reports whether data is an object. The name is only
// valid during the call.
func members(data []byte, fn func(key, value []byte) bool) bool {
	i := skipSpace(data, 0)
	if data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	if data[i] == '}' {
		return true
	}
	for {
		end := skipString(data, i)
		key := data[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var name string
			_ = json.Unmarshal(data[i:end], &name) // valid JSON: cannot fail
			key = []byte(name)
		}
		i = skipSpace(data, skipSpace(data, end)+1) // past the colon
		end = skipValue(data, i)
		if !fn(key, data[i:end]) {
			return true
		}
		i = skipSpace(data, end)
		if data[i] == '}' {
			return true
		}
		i = skipSpace(data, i+1) // past the comma
	}
}

// elements calls fn with the raw value of each element of the JSON array in
// data, in order, until fn returns false. data must be valid JSON and an
// array.
func elements(data []byte, fn func(value []byte) bool) {
	i := skipSpace(data, skipSpace(data, 0)+1) // past the bracket
	if data[i] == ']' {
		return
	}
	for {
		end := skipValue(data, i)
		if !fn(data[i:end]) {
			return
		}
		i = skipSpace(data, end)
		if data[i] == ']' {
			return
		}
		i = skipSpace(data, i+1) // past the comma
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index past the string that starts at data[i].
func skipString(data []byte, i int) int {
	for i++; data[i] != '"'; i++ {
		if data[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// skipValue returns the index past the value that starts at data[i].
func skipValue(data []byte, i int) int {
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for {
			switch data[i] {
			case '"':
				i = skipString(data, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
	default:
		for i < len(data) && !strings.ContainsRune(",}] \t\r\n", rune(data[i])) {
			i++
		}
		return i
	}
}
