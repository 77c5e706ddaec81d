package limiter

import (
	"context"
	"fmt"
	"time"
)

// Definition is a named Policy.
type Definition struct {
	// Name identifies the limiter; see CheckName.
	Name   string
	Policy Policy
	// Group names the limiters that may be decided together (see
	// Service.Decide), by the rule of CheckName; empty means none. A
	// shared store keeps a group's limiters together (on Redis Cluster,
	// in one hash slot), so a group is also a unit of placement: group
	// only limiters that are decided together. A limiter's group is fixed
	// when it is created (see ErrGroupConflict).
	Group string
	// Keyed makes the limiter hold one bucket per key, all under Policy:
	// per user, per API key, per route. A key's bucket is made on its first
	// acquisition and forgotten once it is full again, since a full bucket
	// is indistinguishable from one never used. Keyed limiters are decided
	// with a key (Service.AcquireKey, AvailableKey) and list the keys
	// closest to their limit (Service.Lowest).
	Keyed bool
	// MaxKeys bounds the keys a keyed limiter remembers at once, from 1 to
	// MaxMaxKeys; 0 means DefaultMaxKeys. It must be 0 when Keyed is false.
	// A key not yet remembered that takes permits while the limiter holds
	// MaxKeys keys gets room without ever freeing a key that is limited:
	// a key whose bucket is full again is dropped, otherwise the key with
	// the most permits left is evicted if it has one left (it starts again
	// from a full bucket, forgiven at most what it had not used),
	// otherwise the newcomer is denied (KeyDecision.KeysFull) until one
	// regains a permit. A store also bounds the sum of MaxKeys over its
	// keyed limiters (see ErrTooManyKeys).
	MaxKeys int
}

// Normalize returns def with its defaults filled in: its Policy's (see
// Policy.Normalize), and DefaultMaxKeys for a keyed limiter's zero MaxKeys.
func (def Definition) Normalize() Definition {
	def.Policy = def.Policy.Normalize()
	if def.Keyed && def.MaxKeys == 0 {
		def.MaxKeys = DefaultMaxKeys
	}
	return def
}

// Store keeps named limiters and decides acquisitions against them. Each
// implementation reads the current time itself (the memory store from an
// injected clock, a shared store from its server) and is safe for concurrent
// use. Errors wrap ErrNotFound for an unknown name and ErrUnavailable when the
// backend cannot answer.
type Store interface {
	// Put creates the limiter or replaces its policy, and reports whether it
	// was created. Replacing a limiter with an identical policy keeps its
	// state; a different policy starts it full. Creating one beyond the
	// store's maximum number of limiters fails with an error wrapping
	// ErrTooManyLimiters and creates nothing; replacing one never does.
	// Replacing one with a different Group fails with an error wrapping
	// ErrGroupConflict and changes nothing.
	Put(ctx context.Context, def Definition) (created bool, err error)
	// Get returns the limiter's definition, with defaults filled in.
	Get(ctx context.Context, name string) (Definition, error)
	// List returns up to max definitions whose names sort after `after`, in
	// name order; none when max <= 0.
	List(ctx context.Context, after string, max int) ([]Definition, error)
	// Delete removes the limiter and its state.
	Delete(ctx context.Context, name string) error
	// Acquire takes permits from the limiter, all or nothing.
	Acquire(ctx context.Context, name string, permits int64) (Decision, error)
	// Available reports what the limiter could grant now.
	Available(ctx context.Context, name string) (Availability, error)
	// AcquireKey takes permits from key's bucket of a keyed limiter, all
	// or nothing, and AvailableKey reports what that bucket could grant
	// now; Lowest lists up to k keys of a keyed limiter, fewest permits
	// left first. On a limiter that is not keyed they fail with an error
	// wrapping ErrKeyMismatch, as Acquire, Available and AcquireBatch do on
	// one that is, and Decide on an item whose key does not fit its
	// limiter.
	AcquireKey(ctx context.Context, name, key string, permits int64) (KeyDecision, error)
	AvailableKey(ctx context.Context, name, key string) (KeyAvailability, error)
	Lowest(ctx context.Context, name string, k int) ([]KeyEntry, error)
	// Decide decides valid items (CheckItems) together, all or nothing,
	// at one instant, as Service.Decide describes: it refuses limiters
	// of different groups (CheckGroups) and unknown ones (*MissingError),
	// changing nothing. A non-empty once (CheckOnceKey; never with Peek)
	// is checked and remembered atomically with the decision, in its
	// Scope.
	Decide(ctx context.Context, items []Item, mode Mode, once string) (Verdict, error)
	// Reserve is Decide under Take that, when allowed, also holds the
	// items as a reservation for ttl, in the same step, under a new ID
	// (NewReservationID) that the verdict gives; see Service.Reserve.
	Reserve(ctx context.Context, items []Item, ttl time.Duration, once string) (Verdict, error)
	// Settle settles or, with a nil actual, cancels the reservation id
	// (ParseReservationID accepts it), as Service.Settle describes, in one
	// step with the end of the reservation.
	Settle(ctx context.Context, id string, actual []Item, once string) (Verdict, error)
}

// IdleDeleter is a Store that deletes a limiter only while it holds no
// counts (every bucket full: for a keyed limiter, no key remembered), in
// one step with that check, so that no decision made meanwhile is lost
// with it. DeleteIdle fails with an error wrapping ErrNotIdle when the
// limiter holds counts, and ErrNotFound when it does not exist.
type IdleDeleter interface {
	DeleteIdle(ctx context.Context, name string) error
}

// MaxNameLen is the longest limiter name.
const MaxNameLen = 128

// CheckName reports whether name can name a limiter: 1 to MaxNameLen ASCII
// letters, digits, '.', '_' or '-', starting with a letter or digit. The error
// wraps ErrInvalidName.
func CheckName(name string) error {
	if !ValidName(name) {
		return fmt.Errorf("%w: %q must be 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalidName, truncate(name, MaxNameLen+1), MaxNameLen)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// ValidName reports whether name can name a limiter, by the rule CheckName
// states, without building an error: the rule's one home, for callers that
// word their own message. It costs no allocation.
func ValidName(name string) bool {
	if len(name) == 0 || len(name) > MaxNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}
