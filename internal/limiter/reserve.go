package limiter

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// Reservations. A reservation is a Take that is settled later, once the
// real cost is known: Settle charges what was spent beyond what was
// reserved and refunds what was not spent, limiter by limiter, in one
// step; Cancel refunds everything. A reservation not settled within its
// TTL stays charged as it was reserved. Its ID names where its limiters
// live, so that a shared store finds it without being told the limiters.

// Bounds of a reservation.
const (
	// DefaultReservationTTL is how long a reservation waits to be
	// settled when its caller does not say.
	DefaultReservationTTL = 5 * time.Minute
	// MaxReservationTTL is the longest a reservation can wait.
	MaxReservationTTL = time.Hour
	// MaxReservations bounds the reservations the memory store holds at
	// once: a reservation beyond it is refused (ErrTooManyReservations),
	// and nothing is taken.
	MaxReservations = 100_000
)

// Errors of reservations.
var (
	// ErrReservationNotFound reports a reservation that does not exist:
	// never made, already settled or cancelled, or past its TTL.
	ErrReservationNotFound = errors.New("reservation not found")
	// ErrInvalidReservation reports a malformed reservation ID, a TTL out
	// of range, or a settlement naming a limiter the reservation does
	// not hold.
	ErrInvalidReservation = errors.New("invalid reservation")
	// ErrTooManyReservations reports a memory store holding
	// MaxReservations already.
	ErrTooManyReservations = errors.New("too many reservations")
)

// Held is what a reservation holds of one bucket, so that settling it
// gives back no more than that: permits a reservation took and did not
// spend count as never taken, and those of them that have already
// drained from the bucket (GCRA) or left its window (sliding log) are no
// longer there to give back. A refund beyond that would give the bucket
// room that other callers' grants still hold.
type Held struct {
	// At is an instant at or before the one the reservation was granted
	// at (nanoseconds since the Unix epoch): a sliding log gives back from
	// its oldest grant made at or after At, where the reservation's
	// permits are, and nothing once At has left the window.
	At int64
	// Until is, for GCRA, a TAT at or before the one the reservation's
	// grant left: its permits have drained from the bucket by then, and a
	// refund at now gives back at most Until − now of them.
	Until TAT
}

// NewReservationID returns a new, random reservation ID for the decision
// whose Scope is scope: "g.<group>.<32 hex digits>",
// "l.<limiter>.<32 hex digits>", or for a key of a keyed limiter in no
// group "k.<limiter>.<the key in unpadded base64url>.<32 hex digits>".
func NewReservationID(scope string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	kind, where, _ := strings.Cut(scope, ":")
	if name, key, ok := strings.Cut(where, "\x00"); ok {
		where = name + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
	}
	return kind + "." + where + "." + hex.EncodeToString(b[:])
}

// ParseReservationID returns the Scope of the decision a reservation ID
// belongs to, and its random part (32 lowercase hex digits), or an error
// wrapping ErrInvalidReservation.
func ParseReservationID(id string) (scope, random string, err error) {
	invalid := fmt.Errorf("%w: %q is not a reservation ID", ErrInvalidReservation, truncate(id, 3*MaxNameLen))
	if len(id) < 4 || (id[:2] != "g." && id[:2] != "l." && id[:2] != "k.") {
		return "", "", invalid
	}
	i := strings.LastIndexByte(id, '.')
	if i < 2 {
		return "", "", invalid
	}
	where, random := id[2:i], id[i+1:]
	if len(random) != 32 || strings.Trim(random, "0123456789abcdef") != "" {
		return "", "", invalid
	}
	if id[0] == 'k' {
		// The key's base64url holds no '.': the limiter's name ends at
		// the last one.
		j := strings.LastIndexByte(where, '.')
		if j < 0 {
			return "", "", invalid
		}
		// Strict decoding still skips CR and LF; a key's text holds neither.
		enc := where[j+1:]
		key, err := base64.RawURLEncoding.Strict().DecodeString(enc)
		if err != nil || strings.ContainsAny(enc, "\r\n") || CheckKey(string(key)) != nil || !ValidName(where[:j]) {
			return "", "", invalid
		}
		where = where[:j] + "\x00" + string(key)
	} else if !ValidName(where) {
		return "", "", invalid
	}
	return id[:1] + ":" + where, random, nil
}

// InvalidSettlement is the error of a settlement of the reservation id
// naming a limiter (and key) that it does not hold.
func InvalidSettlement(id string, it Item) error {
	if it.Key != "" {
		return fmt.Errorf("%w: reservation %s holds nothing of key %q of limiter %q", ErrInvalidReservation, id, it.Key, it.Name)
	}
	return fmt.Errorf("%w: reservation %s holds nothing of limiter %q", ErrInvalidReservation, id, it.Name)
}

// CheckSettlementScope reports whether actual can settle the reservation
// id, whose Scope is scope, by where its limiters live: a reservation of a
// limiter in no group holds that limiter only (or that key of it), so a
// settlement naming any other is refused with InvalidSettlement before
// anything is looked up.
func CheckSettlementScope(scope, id string, actual []Item) error {
	kind, where, _ := strings.Cut(scope, ":")
	if kind == "g" {
		return nil
	}
	name, key, _ := strings.Cut(where, "\x00")
	for _, it := range actual {
		if it.Name != name || it.Key != key {
			return InvalidSettlement(id, it)
		}
	}
	return nil
}

// CheckSettlement reports why actual cannot settle a reservation: from 1
// to MaxItems items, each naming a limiter by CheckName's rule and 0 to
// MaxLimit permits (0: nothing was spent on it).
func CheckSettlement(actual []Item) error {
	if len(actual) == 0 || len(actual) > MaxItems {
		return fmt.Errorf("%w: %d items, want 1 to %d", ErrInvalidItems, len(actual), MaxItems)
	}
	for i, it := range actual {
		if err := CheckName(it.Name); err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
		if it.Key != "" {
			if err := CheckKey(it.Key); err != nil {
				return fmt.Errorf("item %d (%q): %w", i, it.Name, err)
			}
		}
		if it.Permits < 0 || it.Permits > MaxLimit {
			return fmt.Errorf("item %d (%q): %w: a settlement's permits must be between 0 and %d, got %d", i, it.Name, ErrInvalidPermits, int64(MaxLimit), it.Permits)
		}
	}
	return nil
}

// Settle settles the reservation id with what was actually spent: for each
// limiter actual names (items on one limiter are summed, as in a
// decision), permits spent beyond what was reserved are charged and
// permits not spent are refunded, all in one step; a limiter of the
// reservation that actual does not name stays charged as reserved. A nil
// actual cancels: every limiter gets back all that was reserved. Settling
// ends the reservation, and once makes it idempotent as for Decide. The
// verdict has one check per item of actual (per limiter reserved, for a
// cancel) and is always Allowed. It fails with an error wrapping
// ErrReservationNotFound when the reservation is gone (settled, cancelled
// or past its TTL) and ErrInvalidReservation when actual names a limiter
// the reservation does not hold; nothing changes then.
func (s *Service) Settle(ctx context.Context, id string, actual []Item, once string) (v Verdict, err error) {
	ctx, span := s.start(ctx, "limiter.Settle", "")
	defer func() { end(span, err) }()
	if _, _, err := ParseReservationID(id); err != nil {
		return Verdict{}, fmt.Errorf("limiter: settle: %w", err)
	}
	if actual != nil {
		if err := CheckSettlement(actual); err != nil {
			return Verdict{}, fmt.Errorf("limiter: settle %s: %w", id, err)
		}
	}
	if once != "" {
		if err := CheckOnceKey(once); err != nil {
			return Verdict{}, fmt.Errorf("limiter: settle: %w", err)
		}
	}
	sctx, cancel := s.bound(ctx)
	v, err = s.store.Settle(sctx, id, actual, once)
	cancel()
	if err != nil {
		if s.unavailable(ctx, err) {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.Bool("ratelimiter.degraded", true))
		}
		return Verdict{}, fmt.Errorf("limiter: settle %s: %w", id, err)
	}
	return v, nil
}

// Reserve takes items as Decide does under Take (with once, idempotently)
// and, when they fit, holds them as a reservation for ttl (0 means
// DefaultReservationTTL, at most MaxReservationTTL) to be settled: the
// verdict's Reservation names it. A denial holds nothing and names none,
// and so does a degraded verdict, even when the failure mode allows it:
// without the store there is nothing to settle later.
func (s *Service) Reserve(ctx context.Context, items []Item, ttl time.Duration, once string) (v Verdict, err error) {
	ctx, span := s.start(ctx, "limiter.Reserve", "")
	defer func() {
		if err == nil && span.IsRecording() {
			span.SetAttributes(attribute.Int("ratelimiter.items", len(items)), attribute.Bool("ratelimiter.allowed", v.Allowed))
		}
		end(span, err)
	}()
	if ttl == 0 {
		ttl = DefaultReservationTTL
	}
	if ttl < time.Millisecond || ttl > MaxReservationTTL {
		return Verdict{}, fmt.Errorf("limiter: reserve: %w: the TTL must be between 1ms and %s, got %s", ErrInvalidReservation, MaxReservationTTL, ttl)
	}
	// A degraded verdict has no Reservation: no reservation can be
	// promised without the store, under either failure mode.
	return s.joint(ctx, span, "reserve", items, once, func(ctx context.Context) (Verdict, error) {
		return s.store.Reserve(ctx, items, ttl, once)
	})
}
