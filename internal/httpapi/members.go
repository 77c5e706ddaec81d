package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// maxDepth bounds how deeply arrays and objects nest in a request body,
// the body itself counting as the first level. The deepest request schema
// nests three (a batch, its acquisitions, one acquisition); a deeper body
// is refused before any validator sees it, since kin-openapi decodes and
// walks every level of what it is given.
const maxDepth = 32

// maxMembers bounds the members of an object in a body checked by
// checkMembers. No request schema has more than four properties, nor lets
// others in; a wide object is refused before kin-openapi, which would
// decode it whole and answer with one field error per unknown member.
const maxMembers = 64

// smallObject is how many member names an object may have before its
// names go into a map: below it, comparing with each one is cheaper.
const smallObject = 16

// checkMembers refuses what kin-openapi would let through in a body, at any
// depth: duplicate members, of which it keeps the last rather than guess
// which one the caller meant, and null members or elements, which it
// replaces with their default. No request schema has a nullable value. It
// also refuses a body nested deeper than maxDepth, and an object with more
// than maxMembers members. data must be valid JSON
// (json.Valid); checkMembers reads it once, in time linear in its length,
// and reports the first problem in the order of the text.
func checkMembers(data []byte) *problem {
	var c scan
	return c.run(data, true)
}

// checkDepth refuses a body nested deeper than maxDepth, and nothing else:
// the hot operations' own checks refuse duplicates and nulls. data must be
// valid JSON.
func checkDepth(data []byte) *problem {
	var c scan
	return c.run(data, false)
}

// checkText refuses a body, which is valid JSON, with a string, a
// member's name or a value, that is not UTF-8 or that escapes half of a
// UTF-16 surrogate pair alone (RFC 8259, 8.1 and 8.2). encoding/json,
// which the generated code and kin-openapi decode with, reads each such
// byte or escape as U+FFFD: distinct keys, or names, would be one. It
// reports the first such string in the order of the text, and a body
// nested deeper than maxDepth, as checkDepth does. A body in UTF-8 without
// an escaped surrogate, nearly all of them, is only looked through.
func checkText(data []byte) *problem {
	if utf8.Valid(data) && !surrogateEscape(data) {
		return nil
	}
	c := scan{text: true}
	return c.run(data, false)
}

// surrogateEscape reports whether data may escape a UTF-16 surrogate,
// \ud800 to \udfff: whether it has a backslash, u, d, and a digit from 8
// to f. Other escapes, such as the \u00e9 of encoders that write ASCII
// only, need no scan.
func surrogateEscape(data []byte) bool {
	for {
		i := bytes.Index(data, []byte(`\u`))
		if i < 0 || i+3 >= len(data) {
			return false
		}
		data = data[i+2:]
		if c := data[1] | 0x20; data[0]|0x20 == 'd' && (c == '8' || c == '9' || 'a' <= c && c <= 'f') {
			return true
		}
	}
}

// scan is one pass over a valid JSON value. It keeps the path to where it
// is, so that a problem can name its location, but builds that location
// only for a problem.
type scan struct {
	stack [maxDepth]frame
	depth int      // open arrays and objects, stack[:depth]
	names [][]byte // member names of the open small objects, outermost first
	text  bool     // check that each string is text: see checkText
}

// frame is an open array or object.
type frame struct {
	object  bool
	wantKey bool   // an object's next string is a member name
	index   int    // an array's current element, or an object's members so far
	key     []byte // an object's current member name, unescaped
	names   int    // where the object's names start in scan.names
	set     map[string]struct{}
}

// run scans data, checking members and nulls too when members is set.
func (c *scan) run(data []byte, members bool) *problem {
	for i := 0; i < len(data); {
		switch data[i] {
		case '{', '[':
			if c.depth == maxDepth {
				return invalid(c.location(c.depth), fmt.Sprintf("nests arrays and objects deeper than %d levels", maxDepth))
			}
			object := data[i] == '{'
			c.stack[c.depth] = frame{object: object, wantKey: object, names: len(c.names)}
			c.depth++
			i++
		case '}', ']':
			c.depth--
			c.names = c.names[:c.stack[c.depth].names]
			c.stack[c.depth] = frame{} // let go of the names
			i++
		case ',':
			if f := c.top(); f.object {
				f.wantKey = true
			} else {
				f.index++
			}
			i++
		case '"':
			end := skipString(data, i)
			if c.text {
				if p := c.checkString(data[i+1 : end-1]); p != nil {
					return p
				}
			}
			if f := c.top(); f != nil && f.wantKey {
				f.wantKey = false
				f.key = data[i+1 : end-1]
				if bytes.IndexByte(f.key, '\\') >= 0 {
					var name string
					_ = json.Unmarshal(data[i:end], &name) // valid JSON: cannot fail
					f.key = []byte(name)
				}
				f.index++
				switch {
				case !members:
				case f.index > maxMembers:
					return invalid(c.location(c.depth-1), fmt.Sprintf("has more than %d members", maxMembers))
				case c.seen(f):
					return invalid(c.location(c.depth), "appears more than once")
				}
			}
			i = end
		case 'n':
			if members && c.depth > 0 {
				return invalid(c.location(c.depth), "must not be null")
			}
			i += len("null")
		default: // space, colon, number, true or false
			i++
		}
	}
	return nil
}

// checkString refuses the string s, as it is between its quotes, at the
// current place of the scan, when it is not text: see checkText.
func (c *scan) checkString(s []byte) *problem {
	msg := textProblem(s)
	switch f := c.top(); {
	case msg == "":
		return nil
	case f != nil && f.wantKey:
		// The name cannot be shown: the object it is in can.
		return invalid(c.location(c.depth-1), "has a member name that is not UTF-8")
	default:
		return invalid(c.location(c.depth), msg)
	}
}

// textProblem tells why the JSON string s, as it is between its quotes,
// is not text, or returns "".
func textProblem(s []byte) string {
	if !utf8.Valid(s) {
		return "must be UTF-8"
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		if i++; s[i] != 'u' {
			continue // a one-letter escape
		}
		r := hexRune(s[i+1 : i+5])
		i += 4 // at the escape's last digit
		if !utf16.IsSurrogate(r) {
			continue
		}
		if i+6 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' && utf16.DecodeRune(r, hexRune(s[i+3:i+7])) != utf8.RuneError {
			i += 6 // a pair
			continue
		}
		return `must not hold a lone surrogate escape (\ud800 to \udfff)`
	}
	return ""
}

// hexRune is the rune of the four hex digits of a \u escape.
func hexRune(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c <= '9':
			c -= '0'
		case c <= 'F':
			c -= 'A' - 10
		default:
			c -= 'a' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// top is the innermost open array or object, or nil.
func (c *scan) top() *frame {
	if c.depth == 0 {
		return nil
	}
	return &c.stack[c.depth-1]
}

// seen reports whether f's current member name came before in f, and
// remembers it. A small object compares it with each name before; a
// larger one looks it up in a set, so that a wide object costs time
// linear in its width.
func (c *scan) seen(f *frame) bool {
	if f.set != nil {
		if _, ok := f.set[string(f.key)]; ok {
			return true
		}
		f.set[view(f.key)] = struct{}{}
		return false
	}
	before := c.names[f.names:]
	for _, name := range before {
		if bytes.Equal(name, f.key) {
			return true
		}
	}
	if len(before) < smallObject {
		c.names = append(c.names, f.key)
		return false
	}
	f.set = make(map[string]struct{}, maxMembers)
	for _, name := range before {
		f.set[view(name)] = struct{}{}
	}
	f.set[view(f.key)] = struct{}{}
	c.names = c.names[:f.names]
	return false
}

// location names the value at the current place in the body, or the
// array or object levels up from it, for a problem: "body", then each
// member name or array index on the way.
func (c *scan) location(levels int) string {
	b := []byte("body")
	for _, f := range c.stack[:levels] {
		b = append(b, '.')
		if f.object {
			b = append(b, f.key...)
		} else {
			b = strconv.AppendInt(b, int64(f.index), 10)
		}
	}
	return string(b)
}

// view is b as a string, without a copy: the names of the body, which
// stays as it is for as long as a scan, which is as long as its sets.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
