package rls

import (
	"strings"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Entry is one key and value of a request's descriptor.
type Entry struct {
	Key, Value string
}

// Match finds the rule of a descriptor of domain, as envoyproxy/ratelimit
// finds it: level by level, each entry matches its level's key_value, else
// a wildcard key_value (the first of the file that matches), else its key
// alone; the rule is the one of the level the last entry matched, if it
// has one. It returns nil when no rule applies (an unknown domain, a
// descriptor that leaves the tree, a level without a rate_limit) and
// otherwise the rule and the key its limiter counts the descriptor under
// (see Key). A nil Config has no rule.
func (c *Config) Match(domain string, entries []Entry) (*Rule, string) {
	if c == nil {
		return nil, ""
	}
	level := c.domains[domain]
	if level == nil || len(entries) == 0 {
		return nil, ""
	}
	// The values the key holds: the request's, but the pattern of a
	// share_threshold level matched by a wildcard.
	values := make([]string, len(entries))
	var rule *Rule
	for i, e := range entries {
		full := e.Key + "_" + e.Value
		values[i] = e.Value
		next := level.children[full]
		if next == nil {
			for _, w := range level.wildcards {
				if w.match(full) {
					next = level.children[w.key]
					if next.share != "" {
						values[i] = next.share
					}
					break
				}
			}
		}
		if next == nil {
			next = level.children[e.Key]
		}
		if next == nil {
			return nil, ""
		}
		if i == len(entries)-1 {
			rule = next.rule
		}
		if len(next.children) == 0 {
			break
		}
		level = next
	}
	if rule == nil {
		return nil, ""
	}
	return rule, Key(entries, values)
}

// Key is the key of a keyed limiter under which a descriptor with these
// entries counts, values standing for the entries' values: the entries as
// "key=value" joined by '|', readable in the limiter's lowest keys, when
// that is a valid key (limiter.CheckKey) and unambiguous (no key or value
// holds '=', '|' or '\', and it does not start with '#'); otherwise '#'
// and 32 characters of the SHA-256 of the entries, which no readable key
// can equal.
func Key(entries []Entry, values []string) string {
	n := 0
	plain := true
	for i, e := range entries {
		n += len(e.Key) + 1 + len(values[i]) + 1
		plain = plain && !strings.ContainsAny(e.Key, "=|\\") && !strings.ContainsAny(values[i], "=|\\")
	}
	if plain && n-1 <= limiter.MaxKeyLen && !strings.HasPrefix(entries[0].Key, "#") {
		var b strings.Builder
		b.Grow(n - 1)
		for i, e := range entries {
			if i > 0 {
				b.WriteByte('|')
			}
			b.WriteString(e.Key)
			b.WriteByte('=')
			b.WriteString(values[i])
		}
		if k := b.String(); limiter.CheckKey(k) == nil {
			return k
		}
	}
	parts := make([]string, 0, 2*len(entries))
	for i, e := range entries {
		parts = append(parts, e.Key, values[i])
	}
	return limiter.DigestKey(parts...)
}
