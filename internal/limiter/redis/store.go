// Package redis is the limiter Store kept in Redis, shared by every replica
// of the service: a limiter created through one replica is visible through
// all, and all of them draw on the same state.
//
// Each decision is one atomic server-side script that reads the limiter's
// definition and state and writes the new state, implementing the same
// algorithms with the same semantics as the in-memory store: all or nothing,
// Available without consuming, the same Decision fields, exact integer
// arithmetic. Time comes from the Redis server holding the limiter (TIME),
// so the clocks of the service's replicas cannot change a decision; Redis
// time has microsecond resolution, so decisions do too (the in-memory store
// resolves nanoseconds): grants within the same microsecond count as
// simultaneous.
//
// Keys, under a prefix chosen by the caller:
//
//	<prefix>{<name>}:def  hash: the definition (see definitionArgs); never expires
//	<prefix>{<name>}:st   the state: GCRA's TAT as a string, or a sliding log as a
//	                      sorted set; expires when the limiter would be full again,
//	                      so idle limiters cost nothing but their definition
//	<prefix>names         sorted set of every limiter name, for List and for
//	                      the bound on the number of limiters
//	<prefix>groups        hash: each limiter's group (see groups.go); a
//	                      limiter in group G has its two keys at
//	                      <prefix>{G}:<name>:def and <prefix>{G}:<name>:st
//
// The braces are a Redis Cluster hash tag: a limiter's two keys share a slot,
// so its scripts run on one node, and so do a group's. The name index lives in another slot, so
// Put and Delete update it in a second call; see their docs for the order
// that keeps List consistent.
package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/rueidis"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

var _ limiter.Store = (*Store)(nil)

// Store keeps named limiters in Redis, standalone or Cluster. It is safe for
// concurrent use; concurrent calls are pipelined on the client's
// connections. Every error wraps limiter.ErrNotFound for an unknown limiter
// or limiter.ErrUnavailable when Redis cannot answer (network failure,
// timeout, or an error reply); a context deadline bounds each call.
type Store struct {
	client    rueidis.Client
	prefix    string
	names     string
	directory string
	max       int

	// Calls in flight, and the calls that wait for them (see coalescer):
	// acquisitions by limiter, decisions by slot.
	acquisitions *coalescer[int64, limiter.Result]
	decisions    *coalescer[scriptCall, scriptReply]

	locMu     sync.RWMutex
	locations map[string]string // name to group, as last read; see groups.go

	denials *denials // nil unless CacheDenials turned it on
}

// New returns a Store over client whose keys all start with prefix (which
// may be empty, and must not contain '{' or '}': they would break the hash
// tags), holding at most maxLimiters limiters (limiter.DefaultMaxLimiters
// when 0 or less): every Store on the same Redis and prefix shares the
// bound. The client must talk to Redis 7.0 or later; Store never closes it.
func New(client rueidis.Client, prefix string, maxLimiters int) (*Store, error) {
	if client == nil {
		return nil, errors.New("redis: nil client")
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("redis: key prefix %q must not contain '{' or '}'", prefix)
	}
	if maxLimiters <= 0 {
		maxLimiters = limiter.DefaultMaxLimiters
	}
	s := &Store{
		client: client, prefix: prefix, names: prefix + "names", directory: prefix + "groups", max: maxLimiters,
		locations: make(map[string]string),
	}
	s.acquisitions = newCoalescer(func(ctx context.Context, name string, permits []int64, out []limiter.Result) {
		s.decide(ctx, name, permits, "", out)
	}, func(int64) int { return 1 })
	s.decisions = newCoalescer(s.runDecisions, func(c scriptCall) int { return c.parts() })
	return s, nil
}

func (s *Store) defKey(name string) string   { return s.prefix + "{" + name + "}:def" }
func (s *Store) stateKey(name string) string { return s.prefix + "{" + name + "}:st" }

// unavailable wraps a failure to reach or use Redis.
func unavailable(op, name string, err error) error {
	return fmt.Errorf("redis: %s %q: %w: %w", op, name, limiter.ErrUnavailable, err)
}

func notFound(op, name string) error {
	return fmt.Errorf("redis: %s %q: %w", op, name, limiter.ErrNotFound)
}

// Put creates the limiter or replaces its policy, and reports whether it was
// created. An identical policy keeps the limiter's state; a different one
// starts it full. A keyed limiter whose MaxKeys would take the keyed
// limiters past limiter.KeyBudget (the sum of their MaxKeys, kept in
// <prefix>keys by every Store on the prefix) fails with an error wrapping
// limiter.ErrTooManyKeys and changes nothing; replacing one with the same
// MaxKeys or fewer never does. def.Name must pass limiter.CheckName and def.Policy must
// be valid; the errors wrap limiter.ErrInvalidName or ErrInvalidPolicy.
// Creating a limiter while the index holds the Store's maximum of names
// fails with an error wrapping limiter.ErrTooManyLimiters; replacing one
// never does.
//
// The name is first reserved in the index, atomically with counting it
// (see reserve.lua); then the definition is written, atomically with its
// state; then the name is added to the index once more, for a Delete of
// the same name that may have removed it meanwhile (see Delete). If the
// definition cannot be written the error wraps ErrUnavailable and the name
// stays in the index without a limiter: List skips it, and it counts
// against the maximum until the name is put or deleted again. A Put racing
// a Delete of the same name can thus take one name more than the maximum,
// the room that Delete freed for a moment. Between the index and the
// definition the limiter's group is claimed in the directory (see
// groups.go): a limiter the directory places in another group is refused
// with an error wrapping limiter.ErrGroupConflict.
func (s *Store) Put(ctx context.Context, def limiter.Definition) (bool, error) {
	if s.denials != nil {
		// A new policy starts the limiter full.
		defer s.denials.forget(nil, def.Name)
	}
	if err := limiter.CheckName(def.Name); err != nil {
		return false, fmt.Errorf("redis: put: %w", err)
	}
	if err := def.Policy.Validate(); err != nil {
		return false, fmt.Errorf("redis: put %q: %w", def.Name, err)
	}
	if err := limiter.CheckKeyed(def); err != nil {
		return false, fmt.Errorf("redis: put %q: %w", def.Name, err)
	}
	def = def.Normalize()
	if def.Keyed {
		if err := s.keyBudget(ctx, def.Name, def.MaxKeys, budgetGrow); err != nil {
			return false, err
		}
	}
	room, err := reserveScript.Exec(ctx, s.client, []string{s.names}, []string{def.Name, strconv.Itoa(s.max)}).AsInt64()
	if err != nil {
		return false, unavailable("put", def.Name, err)
	}
	if room == 0 {
		// A new name, refused: it holds no keys.
		if def.Keyed {
			if err := s.keyBudget(ctx, def.Name, 0, budgetSet); err != nil {
				return false, err
			}
		}
		return false, fmt.Errorf("redis: put %q: %w: the maximum is %d", def.Name, limiter.ErrTooManyLimiters, s.max)
	}
	if err := limiter.CheckGroup(def.Group); err != nil {
		return false, fmt.Errorf("redis: put %q: %w", def.Name, err)
	}
	if err := s.claim(ctx, def); err != nil {
		return false, err
	}
	maxKeys := ""
	args := groupArgs(definitionArgs(def.Policy), def.Group)
	if def.Keyed {
		maxKeys = strconv.Itoa(def.MaxKeys)
		args = append(args, fieldMaxKeys, maxKeys)
	}
	args = append(args, fieldGen, newGeneration())
	keys := s.keysIn(def.Name, def.Group)
	idx, exp := tableKeys(keys[0])
	created, err := putScript.Exec(ctx, s.client, append(keys, idx, exp), append([]string{maxKeys}, args...)).AsInt64()
	if err != nil {
		return false, unavailable("put", def.Name, err)
	}
	c := s.client
	if err := c.Do(ctx, c.B().Zadd().Key(s.names).ScoreMember().ScoreMember(0, def.Name).Build()).Error(); err != nil {
		return false, unavailable("put", def.Name, err)
	}
	// Fewer keys than before, or none: given back now that the
	// definition holds it.
	if err := s.keyBudget(ctx, def.Name, def.MaxKeys, budgetSet); err != nil {
		return false, err
	}
	return created == 1, nil
}

// Get returns the limiter's definition, with defaults filled in.
func (s *Store) Get(ctx context.Context, name string) (limiter.Definition, error) {
	c := s.client
	for again := true; ; again = false {
		group := s.groupOf(name)
		vals, err := c.Do(ctx, c.B().Hmget().Key(s.keysIn(name, group)[0]).Field(definitionFields...).Build()).ToArray()
		if err != nil {
			return limiter.Definition{}, unavailable("get", name, err)
		}
		def, found, err := definitionOf(name, group, vals)
		if err != nil {
			return limiter.Definition{}, unavailable("get", name, err)
		}
		if found {
			return def, nil
		}
		if !again || !s.relocated(ctx, name) {
			return limiter.Definition{}, notFound("get", name)
		}
	}
}

// definitionOf parses an HMGET reply of definitionFields for the limiter
// name in group; found is false when the definition does not exist.
func definitionOf(name, group string, vals []rueidis.RedisMessage) (def limiter.Definition, found bool, err error) {
	if len(vals) != len(definitionFields) {
		return limiter.Definition{}, false, fmt.Errorf("definition: %d fields, want %d", len(vals), len(definitionFields))
	}
	strs := make([]string, len(policyFields))
	for i := range strs {
		if vals[i].IsNil() {
			return limiter.Definition{}, false, nil
		}
		if strs[i], err = vals[i].ToString(); err != nil {
			return limiter.Definition{}, false, err
		}
	}
	def = limiter.Definition{Name: name, Group: group}
	if def.Policy, err = parsePolicy(strs); err != nil {
		return limiter.Definition{}, false, err
	}
	if mk := vals[len(policyFields)]; !mk.IsNil() {
		n, err := mk.AsInt64()
		if err != nil || n < 1 || n > limiter.MaxMaxKeys {
			return limiter.Definition{}, false, fmt.Errorf("stored definition: max_keys %v", mk)
		}
		def.Keyed, def.MaxKeys = true, int(n)
	}
	return def, true, nil
}

// List returns up to count definitions whose names sort after `after` (byte
// order), in name order; none when count <= 0. Names left in the index by an
// interrupted Delete are skipped, and the page is filled from further
// names, so a page shorter than count is the last one.
func (s *Store) List(ctx context.Context, after string, count int) ([]limiter.Definition, error) {
	c := s.client
	defs := make([]limiter.Definition, 0, min(max(count, 0), 1024))
	for len(defs) < count {
		want := count - len(defs)
		from := "-"
		if after != "" {
			from = "(" + after
		}
		names, err := c.Do(ctx, c.B().Zrange().Key(s.names).Min(from).Max("+").Bylex().Limit(0, int64(want)).Build()).AsStrSlice()
		if err != nil {
			return nil, unavailable("list after", after, err)
		}
		if len(names) == 0 {
			break
		}
		groups, err := s.lookup(ctx, names...)
		if err != nil {
			return nil, unavailable("list after", after, err)
		}
		cmds := make(rueidis.Commands, len(names))
		for i, name := range names {
			cmds[i] = c.B().Hmget().Key(s.keysIn(name, groups[i])[0]).Field(definitionFields...).Build()
		}
		for i, res := range c.DoMulti(ctx, cmds...) {
			vals, err := res.ToArray()
			if err != nil {
				return nil, unavailable("list", names[i], err)
			}
			def, found, err := definitionOf(names[i], groups[i], vals)
			if err != nil {
				return nil, unavailable("list", names[i], err)
			}
			if found {
				defs = append(defs, def)
			}
		}
		after = names[len(names)-1]
		if len(names) < want {
			break
		}
	}
	return defs, nil
}

// deleteIn runs delete.lua on the keys of name in group.
func (s *Store) deleteIn(ctx context.Context, name, group string, idle bool) (int64, error) {
	keys := s.keysIn(name, group)
	idx, exp := tableKeys(keys[0])
	var args []string
	if idle {
		args = []string{"idle"}
	}
	return deleteScript.Exec(ctx, s.client, append(keys, idx, exp), args).AsInt64()
}

// Delete removes the limiter and its state, or returns an error wrapping
// limiter.ErrNotFound.
//
// The definition and state go first, atomically, then the name leaves the
// index. A Put of the same name racing with Delete could write its
// definition between those two steps and see its name removed, so Delete
// looks at the definition once more afterwards and restores the name if the
// limiter exists again: any Put that wrote its definition after that look
// adds its name itself. The directory entry goes after the definition, and
// comes back by the same look.
func (s *Store) Delete(ctx context.Context, name string) error {
	return s.delete(ctx, name, false)
}

// DeleteIdle deletes the limiter as Delete does, but only while it holds
// no counts, checked by the script that deletes its definition and state
// (see lua/delete.lua): a decision of any replica comes before or after
// it, never between. See limiter.IdleDeleter.
func (s *Store) DeleteIdle(ctx context.Context, name string) error {
	return s.delete(ctx, name, true)
}

func (s *Store) delete(ctx context.Context, name string, idle bool) error {
	if s.denials != nil {
		defer s.denials.forget(nil, name)
	}
	group := s.groupOf(name)
	existed, err := s.deleteIn(ctx, name, group, idle)
	if err != nil {
		return unavailable("delete", name, err)
	}
	if existed == 0 && s.relocated(ctx, name) {
		group = s.groupOf(name)
		if existed, err = s.deleteIn(ctx, name, group, idle); err != nil {
			return unavailable("delete", name, err)
		}
	}
	if existed < 0 {
		return fmt.Errorf("redis: delete %q: %w", name, limiter.ErrNotIdle)
	}
	if err := s.unclaim(ctx, name, group); err != nil {
		return unavailable("delete", name, err)
	}
	if err := s.keyBudget(ctx, name, 0, budgetSet); err != nil {
		return err
	}
	s.forget(name)
	// The name may be in the index even when the definition is gone (an
	// earlier interrupted Delete): remove it in any case.
	c := s.client
	if err := c.Do(ctx, c.B().Zrem().Key(s.names).Member(name).Build()).Error(); err != nil {
		return unavailable("delete", name, err)
	}
	again, err := c.Do(ctx, c.B().Exists().Key(s.keysIn(name, group)[0]).Build()).AsInt64()
	if err != nil {
		return unavailable("delete", name, err)
	}
	if again == 1 {
		restore := c.DoMulti(ctx,
			c.B().Hset().Key(s.directory).FieldValue().FieldValue(name, group).Build(),
			c.B().Zadd().Key(s.names).ScoreMember().ScoreMember(0, name).Build())
		for _, r := range restore {
			if err := r.Error(); err != nil {
				return unavailable("delete", name, err)
			}
		}
		s.learn(name, group)
		// The limiter put again holds its keys in the budget.
		if def, err := s.Get(ctx, name); err == nil && def.Keyed {
			if err := s.keyBudget(ctx, name, def.MaxKeys, budgetForce); err != nil {
				return err
			}
		}
	}
	if existed == 0 {
		return notFound("delete", name)
	}
	return nil
}
