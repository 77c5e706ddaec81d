package redis

import (
	"context"
	"fmt"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Groups. A limiter in no group keeps its keys under its own hash tag,
// {<name>}; a limiter in group G keeps them under the group's,
// <prefix>{G}:<name>:def and <prefix>{G}:<name>:st, so that every limiter of
// a group lives in one Redis Cluster slot and one script can decide them
// together (see Decide). The name rule has no ':', '{' or '}', so the two
// layouts never meet.
//
// The directory, <prefix>groups, is a hash of every limiter's name to its
// group ("" for none), written by Put before the definition and removed by
// Delete after it: it is where a replica learns where a limiter it has not
// met lives, and the one place two Puts of a new name in different groups
// meet, atomically, so that at most one of them creates it (claim.lua).
// Limiters created before the directory have no entry and live in no group.
//
// Each Store keeps what it has learnt of the directory in memory (locations)
// and decides on it without asking. A limiter it places wrongly (deleted and
// created again in another group through another replica) answers "not
// defined" where it looked, since its group only changes through a Delete;
// the Store then reads the directory and, when the limiter has moved, makes
// the call again where it now lives (relocated).

// maxLocations bounds the locations a Store remembers: past it they are
// forgotten and learnt again.
func (s *Store) maxLocations() int { return 2 * s.max }

// groupOf returns where the Store believes name lives: its group, "" for
// none (also for a name it has not met).
func (s *Store) groupOf(name string) string {
	s.locMu.RLock()
	g := s.locations[name]
	s.locMu.RUnlock()
	return g
}

// known reports the group of name, and whether the Store has met it.
func (s *Store) known(name string) (string, bool) {
	s.locMu.RLock()
	g, ok := s.locations[name]
	s.locMu.RUnlock()
	return g, ok
}

// learn records that name lives in group.
func (s *Store) learn(name, group string) {
	s.locMu.Lock()
	if len(s.locations) >= s.maxLocations() {
		clear(s.locations)
	}
	s.locations[name] = group
	s.locMu.Unlock()
}

// forget drops what the Store knows of name.
func (s *Store) forget(name string) {
	s.locMu.Lock()
	delete(s.locations, name)
	s.locMu.Unlock()
}

// keysIn are the definition and state keys of name in group.
func (s *Store) keysIn(name, group string) []string {
	if group == "" {
		return []string{s.defKey(name), s.stateKey(name)}
	}
	base := s.prefix + "{" + group + "}:" + name
	return []string{base + ":def", base + ":st"}
}

// keys are name's keys where the Store believes it lives.
func (s *Store) keys(name string) []string { return s.keysIn(name, s.groupOf(name)) }

// lookup reads the groups of names from the directory, in one call, and
// remembers them; a name without an entry is in no group, and is not
// remembered, so that names that do not exist take no memory.
func (s *Store) lookup(ctx context.Context, names ...string) ([]string, error) {
	c := s.client
	vals, err := c.Do(ctx, c.B().Hmget().Key(s.directory).Field(names...).Build()).ToArray()
	if err != nil {
		return nil, err
	}
	if len(vals) != len(names) {
		return nil, fmt.Errorf("directory: %d answers for %d names", len(vals), len(names))
	}
	groups := make([]string, len(names))
	for i, v := range vals {
		if v.IsNil() {
			s.forget(names[i])
			continue
		}
		if groups[i], err = v.ToString(); err != nil {
			return nil, err
		}
		s.learn(names[i], groups[i])
	}
	return groups, nil
}

// relocated reports, after a call on name where the Store believed it
// lived found no definition, whether the directory places it elsewhere: the
// call is then to be made again, on keys(name).
func (s *Store) relocated(ctx context.Context, name string) bool {
	was := s.groupOf(name)
	groups, err := s.lookup(ctx, name)
	return err == nil && groups[0] != was
}

// claim places a limiter not yet in the directory in def.Group, or checks
// that the directory already places it there; the error wraps
// limiter.ErrGroupConflict when it places it elsewhere.
func (s *Store) claim(ctx context.Context, def limiter.Definition) error {
	legacy := "0"
	if def.Group != "" {
		// A limiter made before the directory existed has no entry and
		// lives in no group.
		n, err := s.client.Do(ctx, s.client.B().Exists().Key(s.defKey(def.Name)).Build()).AsInt64()
		if err != nil {
			return unavailable("put", def.Name, err)
		}
		if n == 1 {
			legacy = "1"
		}
	}
	reply, err := claimScript.Exec(ctx, s.client, []string{s.directory}, []string{def.Name, def.Group, legacy}).ToArray()
	if err != nil {
		return unavailable("put", def.Name, err)
	}
	ok, err := reply[0].AsInt64()
	if err != nil {
		return unavailable("put", def.Name, err)
	}
	if ok == 1 {
		s.learn(def.Name, def.Group)
		return nil
	}
	cur, err := reply[1].ToString()
	if err != nil {
		return unavailable("put", def.Name, err)
	}
	s.learn(def.Name, cur)
	return fmt.Errorf("redis: put %q: %w", def.Name, limiter.GroupConflict(cur, def.Group))
}

// unclaim removes name's directory entry if it places it in group, after
// a Delete removed its definition there.
func (s *Store) unclaim(ctx context.Context, name, group string) error {
	return unclaimScript.Exec(ctx, s.client, []string{s.directory}, []string{name, group}).Error()
}

// groupArgs appends the definition hash's group field to args, for a
// limiter in a group.
func groupArgs(args []string, group string) []string {
	if group == "" {
		return args
	}
	return append(args, fieldGroup, group)
}
