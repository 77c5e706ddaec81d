package forwardauth

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrPath reports a request whose path upstreams route in ways too
// different to match it against a rule's prefix, which the forward-auth
// endpoint refuses (see RoutePath).
var ErrPath = errors.New("forwardauth: a path that upstreams route differently")

// maxDecodings bounds how many times RoutePath decodes a path: one whose
// escapes still change after that many decodings is refused.
const maxDecodings = 3

// RoutePath returns the path of uri (a path, perhaps with a query, or a
// URL in absolute form) as upstreams route it, so that a rule for a
// prefix applies to every spelling of a path that some upstream routes
// under it:
//
//   - the query is cut off;
//   - every valid escape is decoded, and decoded again while that changes
//     the path (IIS and applications that decode what their framework
//     decoded route %2561 as a), up to maxDecodings times; an escape
//     that is not one (%zz, a lone %) is kept as it is, as lenient
//     upstreams (werkzeug, Django) keep it, and does not stop the others
//     from being decoded;
//   - a backslash is a slash (Windows servers, WHATWG URL parsers), and
//     repeated slashes are one;
//   - each segment's parameters, from a ';' on, are dropped (Tomcat,
//     Jetty, Spring), as are its trailing dots and spaces (Windows);
//   - a trailing slash is kept.
//
// The error, wrapping ErrPath, is for a path that no single route stands
// for: one with a dot segment in any spelling (".", "..", "%2e%2e",
// "..;", ".. "), since upstreams resolve them before or after decoding
// and so reach different paths, while no browser or HTTP library sends
// one; one with a control character once decoded; or one whose escapes
// nest more than maxDecodings deep.
//
// Cases are kept: rules compare paths ignoring them (see Rule.PathPrefix).
func RoutePath(uri string) (string, error) {
	p, _, _ := strings.Cut(uri, "?")
	if !strings.HasPrefix(p, "/") {
		// The absolute form, scheme://authority/path: its path.
		if _, rest, ok := strings.Cut(p, "://"); ok {
			_, p, _ = strings.Cut(rest, "/")
		}
		p = "/" + p
	}
	if asRouted(p) {
		return p, nil
	}
	for n := 0; ; n++ {
		d, changed := decode(p)
		if !changed {
			break
		}
		if n == maxDecodings {
			return "", fmt.Errorf("%w: escapes nested more than %d deep", ErrPath, maxDecodings)
		}
		p = d
	}
	for i := range len(p) {
		if c := p[i]; c < 0x20 || c == 0x7f {
			return "", fmt.Errorf("%w: a control character", ErrPath)
		}
	}
	var b strings.Builder
	b.Grow(len(p))
	trailing := false
	for start := 0; start <= len(p); {
		end := strings.IndexAny(p[start:], `/\`)
		if end < 0 {
			end = len(p)
		} else {
			end += start
		}
		seg, _, _ := strings.Cut(p[start:end], ";")
		start = end + 1
		if trailing = seg == ""; trailing {
			continue
		}
		name := strings.TrimRight(seg, ". ")
		if name == "" {
			return "", fmt.Errorf("%w: a dot segment", ErrPath)
		}
		b.WriteByte('/')
		b.WriteString(name)
	}
	if trailing || b.Len() == 0 {
		b.WriteByte('/')
	}
	return b.String(), nil
}

// asRouted reports whether p, which starts with a slash, is written as
// RoutePath returns it, as most paths are: without an escape, a control
// character, a backslash, a parameter, an empty segment but the last, or
// a segment that ends in a dot or a space (a dot segment among them).
func asRouted(p string) bool {
	for i := 1; i < len(p); i++ {
		switch c := p[i]; {
		case c < 0x20 || c == 0x7f || c == '%' || c == '\\' || c == ';':
			return false
		case c == '/' && (p[i-1] == '/' || p[i-1] == '.' || p[i-1] == ' '):
			return false
		}
	}
	last := p[len(p)-1]
	return last != '.' && last != ' '
}

// decode decodes every valid escape of p, keeping the rest as it is, and
// reports whether there was one.
func decode(p string) (string, bool) {
	i := strings.IndexByte(p, '%')
	for i >= 0 && !isEscape(p, i) {
		j := strings.IndexByte(p[i+1:], '%')
		if j < 0 {
			return p, false
		}
		i += 1 + j
	}
	if i < 0 {
		return p, false
	}
	b := make([]byte, 0, len(p))
	b = append(b, p[:i]...)
	for ; i < len(p); i++ {
		if p[i] == '%' && isEscape(p, i) {
			b = append(b, unhex(p[i+1])<<4|unhex(p[i+2]))
			i += 2
			continue
		}
		b = append(b, p[i])
	}
	return string(b), true
}

// isEscape reports whether p[i:] starts with a valid escape, '%' and two
// hexadecimal digits.
func isEscape(p string, i int) bool {
	return i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2])
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// checkPrefix reports why prefix, a rule's path_prefix, is not written as
// RoutePath writes the paths it is matched against.
func checkPrefix(prefix string) error {
	routed, err := RoutePath(prefix)
	switch {
	case !utf8.ValidString(prefix):
		return fmt.Errorf("path_prefix %q is not UTF-8", prefix)
	case errors.Is(err, ErrPath):
		return fmt.Errorf("path_prefix %q would never match: requests with a dot segment, a control character or escapes nested deeper than %d are refused, not matched; write the path the upstream serves", prefix, maxDecodings)
	case strings.Contains(prefix, "%") && routed == prefix:
		return fmt.Errorf("path_prefix %q: a %% that is no escape cannot be matched the same way by every upstream: leave it out", prefix)
	case routed != prefix:
		return fmt.Errorf("path_prefix %q would never match: write it as the upstream routes it, %q", prefix, routed)
	}
	return nil
}

// hasPrefixFold reports whether s starts with prefix, cases ignored as
// Unicode's simple folding ignores them: Express and ASP.NET route paths
// so, and the latter upper-cases ſ to S.
func hasPrefixFold(s, prefix string) bool {
	for prefix != "" {
		if s == "" {
			return false
		}
		p, s0 := prefix[0], s[0]
		if p < utf8.RuneSelf && s0 < utf8.RuneSelf {
			if p != s0 && lower(p) != lower(s0) {
				return false
			}
			prefix, s = prefix[1:], s[1:]
			continue
		}
		pr, pn := utf8.DecodeRuneInString(prefix)
		sr, sn := utf8.DecodeRuneInString(s)
		if !foldEqual(pr, sr) {
			return false
		}
		prefix, s = prefix[pn:], s[sn:]
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// foldEqual reports whether a and b are one rune under simple folding.
func foldEqual(a, b rune) bool {
	if a == b {
		return true
	}
	for r := unicode.SimpleFold(a); r != a; r = unicode.SimpleFold(r) {
		if r == b {
			return true
		}
	}
	return false
}
