package limiter

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Idempotent decisions. A Take, Charge or Refund may carry a key: the
// first decision made with it is remembered for OnceTTL, with what it
// asked, and a retry with the same key and the same items and mode gets
// that first answer back (Verdict.Replayed) and changes nothing. This is
// what makes a retry safe after a call that timed out: the store may have
// decided it, and the retry is then charged nothing more. The key is
// remembered where the decision's limiters live (their group, or the one
// limiter in no group), in the same atomic step as the decision.

// OnceTTL is how long a decision made with a key is remembered.
const OnceTTL = 10 * time.Minute

// MaxOnce bounds the keys the memory store remembers at once: a decision
// with a new key beyond it is refused (ErrTooManyOnce), never forgotten
// early, since forgetting one would charge its retry twice.
const MaxOnce = 100_000

// MaxOnceKeyLen is the longest key.
const MaxOnceKeyLen = 128

// Errors of idempotent decisions.
var (
	// ErrInvalidOnceKey reports a key that breaks the rule of CheckOnceKey.
	ErrInvalidOnceKey = errors.New("invalid idempotency key")
	// ErrOnceMismatch reports a key already used, within OnceTTL, for a
	// decision of other items or another mode: nothing is decided.
	ErrOnceMismatch = errors.New("idempotency key already used for another request")
	// ErrTooManyOnce reports a memory store that remembers MaxOnce keys
	// already: nothing is decided.
	ErrTooManyOnce = errors.New("too many idempotency keys remembered")
)

// CheckOnceKey reports whether key can make a decision idempotent: 1 to
// MaxOnceKeyLen ASCII letters, digits, '.', '_', '-' or ':' (a UUID, a
// request ID). The error wraps ErrInvalidOnceKey.
func CheckOnceKey(key string) error {
	ok := len(key) >= 1 && len(key) <= MaxOnceKeyLen
	for i := 0; ok && i < len(key); i++ {
		c := key[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':'
	}
	if !ok {
		return fmt.Errorf("%w: %q must be 1 to %d letters, digits, '.', '_', '-' or ':'", ErrInvalidOnceKey, truncate(key, MaxOnceKeyLen+1), MaxOnceKeyLen)
	}
	return nil
}

// Fingerprint is what a key remembers of a decision, to tell a retry from
// another request under the same key: the mode and every item, in order.
func Fingerprint(items []Item, mode Mode) string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(int(mode)))
	for _, it := range items {
		b.WriteByte(' ')
		b.WriteString(it.Name)
		if it.Key != "" {
			// Neither a name nor a key holds a NUL.
			b.WriteByte(0)
			b.WriteString(it.Key)
		}
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(it.Permits, 10))
	}
	return b.String()
}

// Scope is where a decision's key is remembered: the group of its
// limiters, or the name of its one limiter in no group (and its one key,
// for a keyed limiter), set apart so that they never meet. groups[i] is
// the group of items[i]'s limiter, which CheckGroups has accepted.
func Scope(items []Item, groups []string) string {
	switch {
	case groups[0] != "":
		return "g:" + groups[0]
	case items[0].Key != "":
		return "k:" + items[0].Name + "\x00" + items[0].Key
	}
	return "l:" + items[0].Name
}
