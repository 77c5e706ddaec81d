package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Keyed limiters. A keyed limiter's definition holds, beside its policy,
// its bound of keys (maxkeys) and the generation of its keys' states
// (gen), and its keys are a table of one shard beside it, in its slot (see
// table.go and lua/table.lua): for a limiter in no group,
//
//	<prefix>{<name>}:idx             the keys' index
//	<prefix>{<name>}:exp             the sliding log's expiry index
//	<prefix>{<name>}:s<gen>:<key>    one key's state
//
// and for one in group G the same under <prefix>{G}:<name>:. Each script
// reads the definition it decides on, as a plain limiter's do, so every
// replica decides on the definition in force; a key's state is named by
// the generation of the definition that made it, so a replaced definition
// starts its keys afresh without deleting them one by one (they expire as
// their buckets fill). A limiter's keys share one Cluster slot, so one
// master holds them: a decision on them is one script, and Lowest one
// read of one index.

// The ways keyBudget records a limiter's bound of keys; see
// lua/budget.lua.
const (
	budgetGrow  = "grow"  // only if it rises, before the definition is written
	budgetSet   = "set"   // as it is, after
	budgetForce = "force" // as it is, even past the budget
)

// keyBudget records, in the budget of keys (<prefix>keys, see
// lua/budget.lua), that the limiter name holds at most maxKeys keys (0
// for a plain limiter or none), by mode. A rise that would take the keyed
// limiters past limiter.KeyBudget fails with an error wrapping
// limiter.ErrTooManyKeys and records nothing, but under budgetForce.
func (s *Store) keyBudget(ctx context.Context, name string, maxKeys int, mode string) error {
	v, err := budgetScript.Exec(ctx, s.client, []string{s.prefix + "keys"}, []string{name, strconv.Itoa(maxKeys), strconv.Itoa(limiter.KeyBudget), mode}).AsIntSlice()
	if err != nil {
		return unavailable("put", name, err)
	}
	if len(v) == 2 && v[0] == 0 {
		return fmt.Errorf("redis: put %q: %w: %d keys would take the keyed limiters to %d, beyond their budget of %d; lower max_keys, or delete a keyed limiter", name, limiter.ErrTooManyKeys, maxKeys, v[1], limiter.KeyBudget)
	}
	if len(v) != 1 || v[0] != 1 {
		return unavailable("put", name, fmt.Errorf("unexpected reply %v", v))
	}
	return nil
}

// tableKeys names the index and expiry index of the keyed limiter whose
// definition is at def.
func tableKeys(def string) (idx, exp string) {
	base := strings.TrimSuffix(def, "def")
	return base + "idx", base + "exp"
}

// newGeneration returns a new generation for a keyed limiter's definition:
// 64 random bits, so that no two definitions of a name share one.
func newGeneration() string {
	return strconv.FormatUint(rand.Uint64(), 36)
}

// keyTable is the table of the keyed limiter name where the Store believes
// it lives, reading its policy from the definition.
func (s *Store) keyTable(name string) *Table {
	def := s.keys(name)[0]
	idx, exp := tableKeys(def)
	return &Table{client: s.client, shards: []Shard{{Idx: idx, Exp: exp}}, def: def, budget: walkBudget}
}

// keyErr is the error of op on a key of the limiter name.
func keyErr(op, name string, err error) error {
	switch {
	case errors.Is(err, errNoDefinition):
		return notFound(op, name)
	case errors.Is(err, errNotKeyed):
		return fmt.Errorf("redis: %s %q: %w", op, name, limiter.KeyMismatch(name, false))
	case errors.Is(err, limiter.ErrUnavailable):
		return fmt.Errorf("redis: %s %q: %w", op, name, err)
	}
	return unavailable(op, name, err)
}

// AcquireKey implements limiter.Store: one script on the limiter's slot
// reads its definition, decides, and keeps its keys' index, as the
// tenants' Acquire does. A key the limiter does not remember while it
// holds max_keys of them evicts the key with the most permits left, or is
// denied with KeysFull when that one is limited. It is never retried.
func (s *Store) AcquireKey(ctx context.Context, name, key string, permits int64) (limiter.KeyDecision, error) {
	return s.acquireKey(ctx, name, key, permits, "")
}

// acquireKey is AcquireKey at nowMicros, like acquire.
func (s *Store) acquireKey(ctx context.Context, name, key string, permits int64, nowMicros string) (limiter.KeyDecision, error) {
	for again := true; ; again = false {
		d, full, err := s.keyTable(name).Acquire(ctx, 0, key, permits, nowMicros)
		if errors.Is(err, errNoDefinition) && again && s.relocated(ctx, name) {
			continue
		}
		if err != nil {
			return limiter.KeyDecision{}, keyErr("acquire", name, err)
		}
		return limiter.KeyDecision{Decision: d, KeysFull: full}, nil
	}
}

// AvailableKey implements limiter.Store, in one read-only script.
func (s *Store) AvailableKey(ctx context.Context, name, key string) (limiter.KeyAvailability, error) {
	return s.availableKey(ctx, name, key, "")
}

// availableKey is AvailableKey at nowMicros, like acquire.
func (s *Store) availableKey(ctx context.Context, name, key, nowMicros string) (limiter.KeyAvailability, error) {
	for again := true; ; again = false {
		a, full, err := s.keyTable(name).Available(ctx, 0, key, nowMicros)
		if errors.Is(err, errNoDefinition) && again && s.relocated(ctx, name) {
			continue
		}
		if err != nil {
			return limiter.KeyAvailability{}, keyErr("available", name, err)
		}
		return limiter.KeyAvailability{Availability: a, KeysFull: full}, nil
	}
}

// maxStale bounds how often Lowest reads a definition again because it was
// replaced between the read and the walk of its keys.
const maxStale = 8

// Lowest implements limiter.Store: the definition is read first, for the
// policy by which the keys are listed, then one script walks the index,
// refusing to if the definition was replaced meanwhile (then both are
// read again). See Table.Lowest for the order and the cost.
func (s *Store) Lowest(ctx context.Context, name string, k int) ([]limiter.KeyEntry, error) {
	return s.lowest(ctx, name, k, "")
}

// lowest is Lowest at nowMicros, like acquire.
func (s *Store) lowest(ctx context.Context, name string, k int, nowMicros string) ([]limiter.KeyEntry, error) {
	if k < 1 || k > limiter.MaxLowest {
		return nil, fmt.Errorf("redis: lowest %q: %w: k must be between 1 and %d, got %d", name, limiter.ErrInvalidK, limiter.MaxLowest, k)
	}
	for range maxStale {
		def, gen, err := s.keyedDefinition(ctx, name)
		if err != nil {
			return nil, err
		}
		t := s.keyTable(name)
		t.setPolicy(def.Policy)
		t.gen = gen
		es, err := t.Lowest(ctx, k, nowMicros)
		if errors.Is(err, errStale) || errors.Is(err, errNoDefinition) {
			continue
		}
		if err != nil {
			return nil, keyErr("lowest", name, err)
		}
		out := make([]limiter.KeyEntry, len(es))
		for i, e := range es {
			out[i] = limiter.KeyEntry{Key: e.Key, Availability: e.Availability}
		}
		return out, nil
	}
	return nil, unavailable("lowest", name, errors.New("the definition kept changing"))
}

// keyedDefinition reads the definition of the keyed limiter name and its
// generation.
func (s *Store) keyedDefinition(ctx context.Context, name string) (limiter.Definition, string, error) {
	c := s.client
	fields := append(definitionFields[:len(definitionFields):len(definitionFields)], fieldGen)
	for again := true; ; again = false {
		group := s.groupOf(name)
		vals, err := c.Do(ctx, c.B().Hmget().Key(s.keysIn(name, group)[0]).Field(fields...).Build()).ToArray()
		if err != nil {
			return limiter.Definition{}, "", unavailable("lowest", name, err)
		}
		def, found, err := definitionOf(name, group, vals[:len(definitionFields)])
		if err != nil {
			return limiter.Definition{}, "", unavailable("lowest", name, err)
		}
		if !found {
			if again && s.relocated(ctx, name) {
				continue
			}
			return limiter.Definition{}, "", notFound("lowest", name)
		}
		if !def.Keyed {
			return limiter.Definition{}, "", fmt.Errorf("redis: lowest %q: %w", name, limiter.KeyMismatch(name, false))
		}
		gen, err := vals[len(definitionFields)].ToString()
		if err != nil {
			return limiter.Definition{}, "", unavailable("lowest", name, fmt.Errorf("stored definition: generation: %w", err))
		}
		return def, gen, nil
	}
}

// AcquireKey implements limiter.Store.
func (l *Lazy) AcquireKey(ctx context.Context, name, key string, permits int64) (limiter.KeyDecision, error) {
	return with(ctx, l, name, func(st *Store) (limiter.KeyDecision, error) { return st.AcquireKey(ctx, name, key, permits) })
}

// AvailableKey implements limiter.Store.
func (l *Lazy) AvailableKey(ctx context.Context, name, key string) (limiter.KeyAvailability, error) {
	return with(ctx, l, name, func(st *Store) (limiter.KeyAvailability, error) { return st.AvailableKey(ctx, name, key) })
}

// Lowest implements limiter.Store.
func (l *Lazy) Lowest(ctx context.Context, name string, k int) ([]limiter.KeyEntry, error) {
	return with(ctx, l, name, func(st *Store) ([]limiter.KeyEntry, error) { return st.Lowest(ctx, name, k) })
}
