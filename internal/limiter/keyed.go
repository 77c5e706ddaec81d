package limiter

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// Bounds of keyed limiters (see Definition.Keyed).
const (
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 128
	// DefaultMaxKeys is the bound a zero Definition.MaxKeys stands for.
	DefaultMaxKeys = 10_000
	// MaxMaxKeys is the largest Definition.MaxKeys.
	MaxMaxKeys = 10_000_000
	// MaxLowest is the largest k Lowest accepts.
	MaxLowest = 1000
	// KeyBudget is the most keys a store's keyed limiters may hold
	// together: the sum of their MaxKeys (see ErrTooManyKeys). It bounds
	// the embedded store's memory for keys at about 36 bytes a key of up
	// to 8 bytes and about its length more for a longer one (560 bytes at
	// worst, keys of MaxKeyLen bytes under GCRA): 60 MB for keys of 20
	// bytes. Each keyed limiter also costs about 1 KB before its first key
	// (its tables grow a shard per 1,024 keys of its MaxKeys, up to 64).
	// On Redis it is shared by every replica on one prefix; a key there
	// takes a few hundred bytes (384 at worst for a tenant's 16-byte key
	// under GCRA, more for a longer key, which its state's name and its
	// index member both hold).
	KeyBudget = 1_000_000
)

// Errors of keyed limiters.
var (
	// ErrInvalidKey reports a key that breaks CheckKey's rule.
	ErrInvalidKey = errors.New("invalid key")
	// ErrKeyMismatch reports a key given to a limiter that is not keyed,
	// or none given to one that is.
	ErrKeyMismatch = errors.New("key mismatch")
	// ErrTooManyKeys reports a Put of a keyed limiter whose MaxKeys would
	// take the store past its budget of keys (the sum of MaxKeys over its
	// keyed limiters); replacing a limiter with the same MaxKeys or fewer
	// never does.
	ErrTooManyKeys = errors.New("too many keys")
	// ErrInvalidK reports a Lowest count outside 1..MaxLowest.
	ErrInvalidK = errors.New("invalid number of keys")
)

// KeyEntry is one key of a keyed limiter in a Lowest answer, as seen at the
// instant of the call.
type KeyEntry struct {
	Key string
	Availability
}

// CheckKey reports whether key can name a key of a keyed limiter: 1 to
// MaxKeyLen bytes of UTF-8 without control characters (U+0000 to U+001F
// and U+007F to U+009F). Keys are otherwise opaque: "user-42", an API
// key, an e-mail address and "/v1/search" are all keys. The error wraps
// ErrInvalidKey.
func CheckKey(key string) error {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: must be 1 to %d bytes long, got %d", ErrInvalidKey, MaxKeyLen, len(key))
	}
	if !utf8.ValidString(key) {
		return fmt.Errorf("%w: must be UTF-8", ErrInvalidKey)
	}
	for _, r := range key {
		if r < 0x20 || 0x7f <= r && r <= 0x9f {
			return fmt.Errorf("%w: must not hold control characters, found %U", ErrInvalidKey, r)
		}
	}
	return nil
}

// DigestKey is the key that stands for parts where they cannot be a key
// as they are (too long, control characters, or ambiguous when joined):
// '#' and 32 characters of the SHA-256 of the parts, each prefixed with
// its length, which no key that does not start with '#' can equal.
func DigestKey(parts ...string) string {
	h := sha256.New()
	var size [8]byte
	for _, s := range parts {
		binary.BigEndian.PutUint64(size[:], uint64(len(s)))
		h.Write(size[:])
		h.Write([]byte(s))
	}
	return "#" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:24])
}

// CheckKeyed reports why def's keyed settings are invalid, wrapping
// ErrInvalidPolicy, or nil: MaxKeys must be 0 (DefaultMaxKeys) to
// MaxMaxKeys for a keyed limiter, and 0 for one that is not.
func CheckKeyed(def Definition) error {
	switch {
	case !def.Keyed && def.MaxKeys != 0:
		return fmt.Errorf("%w: max_keys applies to keyed limiters only", ErrInvalidPolicy)
	case def.MaxKeys < 0 || def.MaxKeys > MaxMaxKeys:
		return fmt.Errorf("%w: max_keys must be between 1 and %d, got %d", ErrInvalidPolicy, MaxMaxKeys, def.MaxKeys)
	}
	return nil
}

// KeyMismatch is the error of a call that names a key of the limiter name,
// or none, against its definition; it wraps ErrKeyMismatch.
func KeyMismatch(name string, keyed bool) error {
	if keyed {
		return fmt.Errorf("%w: limiter %q is keyed: name the key to decide on", ErrKeyMismatch, name)
	}
	return fmt.Errorf("%w: limiter %q is not keyed: it takes no key", ErrKeyMismatch, name)
}

// AcquireKey takes permits from key's bucket of the named keyed limiter,
// all or nothing. Invalid names, keys and permit counts are rejected before
// the store is consulted; a limiter that is not keyed gives an error
// wrapping ErrKeyMismatch. When the store cannot answer, the decision is
// Degraded by the FailureMode, as for Acquire.
func (s *Service) AcquireKey(ctx context.Context, name, key string, permits int64) (d KeyDecision, err error) {
	ctx, span := s.start(ctx, "limiter.AcquireKey", name)
	defer func() {
		if err == nil && span.IsRecording() {
			span.SetAttributes(attribute.String("ratelimiter.key", key), attribute.Int64("ratelimiter.permits", permits),
				attribute.Bool("ratelimiter.allowed", d.Allowed), attribute.Int64("ratelimiter.remaining", d.Remaining))
		}
		end(span, err)
	}()
	if err := CheckName(name); err != nil {
		return KeyDecision{}, fmt.Errorf("limiter: acquire: %w", err)
	}
	if err := CheckKey(key); err != nil {
		return KeyDecision{}, fmt.Errorf("limiter: acquire %q: %w", name, err)
	}
	if err := CheckPermits(permits); err != nil {
		return KeyDecision{}, fmt.Errorf("limiter: acquire %q: %w", name, err)
	}
	sctx, cancel := s.bound(ctx)
	d, err = s.store.AcquireKey(sctx, name, key, permits)
	cancel()
	if err != nil {
		if s.unavailable(ctx, err) {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.Bool("ratelimiter.degraded", true))
			return KeyDecision{Decision: Degraded(permits, s.opts.FailureMode)}, nil
		}
		return KeyDecision{}, fmt.Errorf("limiter: acquire %q: %w", name, err)
	}
	return d, nil
}

// AvailableKey reports what key's bucket of the named keyed limiter could
// grant now, without taking anything.
func (s *Service) AvailableKey(ctx context.Context, name, key string) (a KeyAvailability, err error) {
	ctx, span := s.start(ctx, "limiter.AvailableKey", name)
	defer func() { end(span, err) }()
	if err := CheckName(name); err != nil {
		return KeyAvailability{}, fmt.Errorf("limiter: available: %w", err)
	}
	if err := CheckKey(key); err != nil {
		return KeyAvailability{}, fmt.Errorf("limiter: available %q: %w", name, err)
	}
	sctx, cancel := s.bound(ctx)
	a, err = s.store.AvailableKey(sctx, name, key)
	cancel()
	if err != nil {
		return KeyAvailability{}, fmt.Errorf("limiter: available %q: %w", name, err)
	}
	return a, nil
}

// Lowest returns up to k keys of the named keyed limiter (1 <= k <=
// MaxLowest, otherwise the error wraps ErrInvalidK) with the fewest permits
// left, fewest first; keys whose bucket is full are not listed. Ties are
// ordered as the per-IP tenants' are: under GCRA by the latest TAT, under
// the sliding log by the latest reset, then by key, bytewise.
func (s *Service) Lowest(ctx context.Context, name string, k int) (entries []KeyEntry, err error) {
	ctx, span := s.start(ctx, "limiter.Lowest", name)
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(attribute.Int("ratelimiter.k", k), attribute.Int("ratelimiter.keys", len(entries)))
		}
		end(span, err)
	}()
	if err := CheckName(name); err != nil {
		return nil, fmt.Errorf("limiter: lowest: %w", err)
	}
	if k < 1 || k > MaxLowest {
		return nil, fmt.Errorf("limiter: lowest %q: %w: k must be between 1 and %d, got %d", name, ErrInvalidK, MaxLowest, k)
	}
	sctx, cancel := s.bound(ctx)
	entries, err = s.store.Lowest(sctx, name, k)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("limiter: lowest %q: %w", name, err)
	}
	return entries, nil
}

// KeyDecision is the answer to an acquisition from a keyed limiter.
type KeyDecision struct {
	Decision
	// KeysFull reports a denial of a key the limiter did not remember,
	// made because it holds its MaxKeys keys and all of them are limited
	// (see Definition.MaxKeys). Remaining is then 0, and RetryAfter and
	// ResetAfter say when room can be made.
	KeysFull bool
}

// KeyAvailability is what a key of a keyed limiter could take now.
type KeyAvailability struct {
	Availability
	// KeysFull reports a key the limiter does not remember and could not
	// remember now (see KeyDecision.KeysFull): Remaining is then 0 and
	// ResetAfter is when room can be made.
	KeysFull bool
}
