package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// MaxItems is the most items one decision names (see Service.Decide).
const MaxItems = 32

// Errors of joint decisions, besides those of single acquisitions.
var (
	// ErrInvalidItems reports a decision with no item or more than
	// MaxItems.
	ErrInvalidItems = errors.New("invalid items")
	// ErrCrossGroup reports a decision whose items name limiters of
	// different groups, or limiters in no group: their state could live
	// on different Redis Cluster nodes, where no one script can decide
	// them together.
	ErrCrossGroup = errors.New("limiters of different groups")
	// ErrGroupConflict reports a Put that would move an existing limiter
	// to another group: delete it first. Moving it in place would let two
	// replicas decide on its old and its new state at once.
	ErrGroupConflict = errors.New("limiter is in another group")
	// ErrInvalidGroup reports a group name that breaks CheckName's rule.
	ErrInvalidGroup = errors.New("invalid group name")
)

// CheckGroup reports whether g can name a group: empty (no group), or a
// name by CheckName's rule. The error wraps ErrInvalidGroup.
func CheckGroup(g string) error {
	if g != "" && !ValidName(g) {
		return fmt.Errorf("%w: %q must be 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalidGroup, truncate(g, MaxNameLen+1), MaxNameLen)
	}
	return nil
}

// GroupConflict is the error of a Put that would move a limiter from group
// old to group new; it wraps ErrGroupConflict.
func GroupConflict(old, new string) error {
	return fmt.Errorf("%w: it is in %s and the definition puts it in %s; delete it first to move it", ErrGroupConflict, groupWords(old), groupWords(new))
}

func groupWords(g string) string {
	if g == "" {
		return "no group"
	}
	return fmt.Sprintf("group %q", g)
}

// MissingError is the error of a decision naming a limiter that does not
// exist; it wraps ErrNotFound.
type MissingError struct{ Name string }

func (e *MissingError) Error() string { return fmt.Sprintf("limiter %q not found", e.Name) }

// Unwrap returns ErrNotFound.
func (e *MissingError) Unwrap() error { return ErrNotFound }

// Item is one part of a joint decision: Permits from the limiter Name, or,
// for a keyed limiter, from its bucket of Key (empty for a limiter that is
// not keyed).
type Item struct {
	Name    string
	Key     string
	Permits int64
}

// Mode says what a joint decision does when every item fits.
type Mode uint8

const (
	// Take records every item's permits when all of them fit. It is the
	// zero value.
	Take Mode = iota
	// Peek records nothing: it answers what Take would answer now.
	Peek
	// Charge records every item's permits whether or not they fit: a
	// limiter charged past empty is in debt, and grants nothing until
	// time has repaid it (see Rate.Charge and Log.Charge for the caps).
	// It reports what costs were incurred, not whether they may be.
	Charge
	// Refund gives every item's permits back: a limiter never holds more
	// than when full, and a sliding log gives back its newest grants
	// first (see Log.Refund).
	Refund
)

// String returns "take", "peek", "charge" or "refund".
func (m Mode) String() string {
	switch m {
	case Peek:
		return "peek"
	case Charge:
		return "charge"
	case Refund:
		return "refund"
	}
	return "take"
}

// Verdict is the answer to a joint decision: all of its items' permits were
// taken, or none were.
type Verdict struct {
	// Allowed reports whether every item fits: under Take their permits
	// were all recorded; under Peek nothing was. When false and not
	// Degraded, nothing was recorded. Charge and Refund always apply, and
	// are always Allowed.
	Allowed bool
	// ExceedsCapacity reports that some item can never fit, however long
	// the caller waits (see Check.ExceedsCapacity).
	ExceedsCapacity bool
	// Degraded reports a verdict made without the store (see
	// Decision.Degraded): Allowed follows the FailureMode, and every
	// Check holds its Permits only.
	Degraded bool
	// RetryAfter is how long until every item fits at once, when denied
	// and ExceedsCapacity is false; 0 otherwise. It assumes nobody else
	// takes permits from these limiters meanwhile.
	RetryAfter time.Duration
	// Checks has one entry per item, in the order of the items.
	Checks []Check
	// Replayed reports the answer to an earlier decision made with the
	// same idempotency key, given back unchanged: nothing was decided now.
	Replayed bool
	// Reservation is the ID of the reservation an allowed Reserve made;
	// empty otherwise.
	Reservation string
	// Local reports a denial made without asking a shared store, from what
	// its earlier answers prove (the Redis store's CacheDenials): nothing
	// was recorded. Each Check then holds what the store last said of its
	// limiter (Remaining, Limit, ResetAfter less the time since), Fits
	// false for those proven short, and RetryAfter the least time until
	// they might fit.
	Local bool
}

// Check is what one item of a joint decision found. Items that name the
// same limiter are decided as one: they fit when the sum of their permits
// does, and each reports that limiter's state.
type Check struct {
	// Name, Key and Permits are the item's.
	Name    string
	Key     string
	Permits int64
	// Fits reports whether the item's limiter could grant it now. In a
	// denial, the items that do not fit are the ones that denied. After a
	// Charge or a Refund, which always apply, it is true.
	Fits bool
	// ExceedsCapacity reports that the permits asked of this limiter (the
	// sum over the items naming it) exceed what it can ever hold.
	ExceedsCapacity bool
	// Remaining is what the limiter could grant right after the verdict:
	// after the permits were taken when they were, as it is now otherwise.
	Remaining int64
	// Limit is the policy's Limit.
	Limit int64
	// RetryAfter is how long until this limiter could grant the permits
	// asked of it, when it cannot now and they do not exceed its capacity.
	RetryAfter time.Duration
	// KeysFull reports an item of a keyed limiter whose key is not
	// remembered and cannot be now: the limiter holds its MaxKeys keys,
	// all limited (see Definition.MaxKeys). Fits is then false, Remaining
	// 0, and RetryAfter and ResetAfter say when room can be made. A Take
	// or Peek of more than the capacity reports ExceedsCapacity instead,
	// as an acquisition does: room would not make it fit.
	KeysFull bool
	// ResetAfter is how long until the limiter is full again if nobody
	// acquires meanwhile.
	ResetAfter time.Duration

	held Held // what a grant made under Take left; see Held
}

// Held returns what the grant c reports holds of its bucket, for a
// reservation to settle; the zero Held (nothing to give back) when c
// granted nothing.
func (c Check) Held() Held { return c.held }

// CheckItems reports why items cannot make a decision, or nil: their count
// (ErrInvalidItems), or the first invalid name or permit count, wrapped
// with the item's index.
func CheckItems(items []Item) error {
	if len(items) == 0 || len(items) > MaxItems {
		return fmt.Errorf("%w: %d items, want 1 to %d", ErrInvalidItems, len(items), MaxItems)
	}
	for i, it := range items {
		if err := CheckName(it.Name); err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
		if it.Key != "" {
			if err := CheckKey(it.Key); err != nil {
				return fmt.Errorf("item %d (%q): %w", i, it.Name, err)
			}
		}
		if err := CheckPermits(it.Permits); err != nil {
			return fmt.Errorf("item %d (%q): %w", i, it.Name, err)
		}
	}
	return nil
}

// CheckGroups reports whether limiters can be decided together: one
// limiter (however many items name it) and, when it is keyed, one of its
// keys, or limiters (and keys) that all share one group. groups[i] is the
// group of the limiter items[i] names. The error wraps ErrCrossGroup and
// names the first two items that differ.
func CheckGroups(items []Item, groups []string) error {
	first := items[0]
	for i, it := range items[1:] {
		if it.Name == first.Name && it.Key == first.Key || groups[i+1] == groups[0] && groups[0] != "" {
			continue
		}
		if it.Name == first.Name {
			return fmt.Errorf("%w: items 0 and %d name two keys of %q %s: the keys of one decision must belong to limiters of one group",
				ErrCrossGroup, i+1, it.Name, groupPhrase(groups[0]))
		}
		return fmt.Errorf("%w: item 0 names %q %s and item %d names %q %s: the limiters of one decision must share a group",
			ErrCrossGroup, first.Name, groupPhrase(groups[0]), i+1, it.Name, groupPhrase(groups[i+1]))
	}
	return nil
}

func groupPhrase(g string) string { return "(" + groupWords(g) + ")" }

// Totals folds items naming the same limiter (and key) into one: names are
// the distinct names in order of first appearance, totals[j] the sum of
// the permits asked of names[j], and index[i] the position in names of
// items[i]'s limiter. The sums never overflow: each of at most MaxItems
// items asks for at most MaxLimit permits. It is for items without keys;
// see Parts.
func Totals(items []Item) (names []string, totals []int64, index []int) {
	parts, index := Parts(items)
	names, totals = make([]string, len(parts)), make([]int64, len(parts))
	for j, p := range parts {
		names[j], totals[j] = p.Name, p.Permits
	}
	return names, totals, index
}

// Parts folds items naming the same limiter and key into one: parts are
// the distinct (Name, Key) pairs in order of first appearance, each with
// the sum of the permits asked of it, and index[i] the position in parts of
// items[i]'s pair.
func Parts(items []Item) (parts []Item, index []int) {
	index = make([]int, len(items))
	for i, it := range items {
		j := 0
		for j < len(parts) && (parts[j].Name != it.Name || parts[j].Key != it.Key) {
			j++
		}
		if j == len(parts) {
			parts = append(parts, Item{Name: it.Name, Key: it.Key})
		}
		parts[j].Permits += it.Permits
		index[i] = j
	}
	return parts, index
}

// NewVerdict builds the verdict on items from what their limiters found:
// found[index[i]] is the Check of the limiter items[i] names, for every
// permit asked of it (see Totals), with its Name and Permits left for
// NewVerdict to fill in per item.
func NewVerdict(items []Item, found []Check, index []int) Verdict {
	v := Verdict{Allowed: true, Checks: make([]Check, len(items))}
	for _, c := range found {
		v.Allowed = v.Allowed && c.Fits
		v.ExceedsCapacity = v.ExceedsCapacity || c.ExceedsCapacity
		v.RetryAfter = max(v.RetryAfter, c.RetryAfter)
	}
	if v.Allowed || v.ExceedsCapacity {
		v.RetryAfter = 0
	}
	for i, it := range items {
		c := found[index[i]]
		c.Name, c.Key, c.Permits, c.held = it.Name, it.Key, it.Permits, Held{}
		v.Checks[i] = c
	}
	return v
}

// DegradedVerdict is the verdict on items that the store could not
// answer, by mode; see Decision.Degraded.
func DegradedVerdict(items []Item, mode FailureMode) Verdict {
	v := Verdict{Allowed: mode == FailOpen, Degraded: true, Checks: make([]Check, len(items))}
	for i, it := range items {
		v.Checks[i] = Check{Name: it.Name, Key: it.Key, Permits: it.Permits}
	}
	return v
}

// Decide decides items together, all or nothing: under Take either every
// item's permits are recorded or none are; under Peek nothing is. Items
// naming the same limiter (and key) are summed (see Check). A decision of
// more than one limiter, or of more than one key, needs them all in one
// group (see Definition.Group), so that a shared store can decide them in
// one atomic step; otherwise the error wraps ErrCrossGroup and nothing is
// decided. An item names a key exactly when its limiter is keyed, or the
// error wraps ErrKeyMismatch. Invalid items are refused
// before the store is consulted (see CheckItems); an unknown limiter fails
// the whole decision with an error wrapping a *MissingError. A store that
// cannot answer gives a DegradedVerdict by the FailureMode.
//
// A non-empty once makes a Take, Charge or Refund idempotent (see
// OnceTTL): a retry with the same once, items and mode gets the first
// answer back and changes nothing; the same once with other items or
// another mode is refused with an error wrapping ErrOnceMismatch. A Peek
// changes nothing and ignores once.
func (s *Service) Decide(ctx context.Context, items []Item, mode Mode, once string) (v Verdict, err error) {
	ctx, span := s.start(ctx, "limiter.Decide", "")
	defer func() {
		if err == nil && span.IsRecording() {
			span.SetAttributes(attribute.String("ratelimiter.mode", mode.String()), attribute.Int("ratelimiter.items", len(items)),
				attribute.Bool("ratelimiter.allowed", v.Allowed), attribute.Bool("ratelimiter.replayed", v.Replayed))
		}
		end(span, err)
	}()
	if mode == Peek {
		once = ""
	}
	return s.joint(ctx, span, "decide", items, once, func(ctx context.Context) (Verdict, error) {
		return s.store.Decide(ctx, items, mode, once)
	})
}

// joint checks items and once, and makes call under the Service's bound:
// the store's decision on them, or, when the store cannot answer, a
// DegradedVerdict by the FailureMode. op names the call in errors.
func (s *Service) joint(ctx context.Context, span trace.Span, op string, items []Item, once string, call func(context.Context) (Verdict, error)) (Verdict, error) {
	if err := CheckItems(items); err != nil {
		return Verdict{}, fmt.Errorf("limiter: %s: %w", op, err)
	}
	if once != "" {
		if err := CheckOnceKey(once); err != nil {
			return Verdict{}, fmt.Errorf("limiter: %s: %w", op, err)
		}
	}
	sctx, cancel := s.bound(ctx)
	v, err := call(sctx)
	cancel()
	if err != nil {
		if s.unavailable(ctx, err) {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.Bool("ratelimiter.degraded", true))
			return DegradedVerdict(items, s.opts.FailureMode), nil
		}
		return Verdict{}, fmt.Errorf("limiter: %s: %w", op, err)
	}
	return v, nil
}
