package rls

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The limiters the service makes are named by one of two prefixes: a
// rule's limiter "envoy.<rule>.<digest>", a limit set by a request
// "envoy-override.<limit>.<digest>", each in its domain's group
// "envoy.<domain>.<digest>". Sweep deletes the ones it no longer needs, so
// other limiters should not be named so.
const (
	RulePrefix     = "envoy."
	OverridePrefix = "envoy-override."
)

// errTooManyOverrides is a limit set by a request while the backend holds
// MaxOverrides limiters of such limits already.
var errTooManyOverrides = errors.New("rls: too many limits set by requests")

// SweepGrace is how long a limiter that Sweep may delete must have held no
// counts, at every sweep over that time, before a sweep deletes it.
const SweepGrace = time.Minute

// Swept counts what a Sweep did.
type Swept struct {
	// Deleted counts the limiters deleted.
	Deleted int
	// Kept counts the limiters of removed rules kept because they held
	// counts: a later Sweep deletes them once their keys are full again.
	Kept int
	// Waiting counts the limiters found without counts for less than
	// SweepGrace: a later Sweep deletes them if they stay so.
	Waiting int
}

// Sweep deletes the limiters of the service that it does not need, and
// whose deletion changes no decision: those of rules the configuration in
// force no longer has (removed or renamed), and those of limits set by
// requests. Each goes once it has held no counts (every key's bucket full
// again, see Limiters.Lowest) at every sweep for SweepGrace, the first
// such sweep and one at least SweepGrace later at now; one found holding
// counts starts over. A limiter deleted so is what it would be if put
// again: full.
//
// That makes a sweep safe beside processes that run another configuration
// on the same backend, as during a rolling update on Redis: a limiter that
// another process decides on is never deleted while it holds counts, nor
// before sweeps SweepGrace apart have found it without them, and one
// deleted while idle is put back, full, by that process's next decision
// on it. The deletion itself checks, in one step with it, that the
// limiter still holds no counts (Limiters.DeleteIdle), so a decision made
// after a sweep's last look is never forgotten.
//
// Sweeps are made one at a time; the service makes one at start, after
// each reload and periodically (see cmd/service). A sweep stops at the
// first error of the backend, having done what it did.
func (s *Service) Sweep(ctx context.Context, now time.Time) (Swept, error) {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	var sw Swept
	cfg := s.config.Load()
	inForce := make(map[string]bool)
	for _, def := range cfg.Limiters() {
		inForce[def.Name] = true
	}
	var candidates, overrides []string
	err := s.each(ctx, "envoy", 1000, func(def limiter.Definition) bool {
		if !def.Keyed || !strings.HasPrefix(def.Group, RulePrefix) {
			return true // not one of the service's
		}
		switch {
		case strings.HasPrefix(def.Name, OverridePrefix):
			overrides = append(overrides, def.Name)
			candidates = append(candidates, def.Name)
		case strings.HasPrefix(def.Name, RulePrefix) && !inForce[def.Name]:
			candidates = append(candidates, def.Name)
		}
		return true
	})
	if err != nil {
		return sw, fmt.Errorf("rls: sweep: %w", err)
	}
	// What this process remembers of the limits set by requests is what
	// the backend holds now, less what this sweep deletes.
	s.keepOverrides(overrides)
	idle := make(map[string]time.Time, len(candidates))
	defer func() { s.idleSince = idle }()
	for _, name := range candidates {
		held, err := s.holdsCounts(ctx, name)
		switch {
		case errors.Is(err, limiter.ErrNotFound):
			continue
		case err != nil:
			return sw, fmt.Errorf("rls: sweep %s: %w", name, err)
		case held:
			if !strings.HasPrefix(name, OverridePrefix) {
				sw.Kept++
			}
			continue
		}
		since, seen := s.idleSince[name]
		if !seen || now.Sub(since) < SweepGrace {
			if !seen {
				since = now
			}
			idle[name] = since
			sw.Waiting++
			continue
		}
		switch err := s.limiters.DeleteIdle(ctx, name); {
		case errors.Is(err, limiter.ErrNotIdle):
			// A decision since the check: it starts over.
			delete(idle, name)
			continue
		case err != nil && !errors.Is(err, limiter.ErrNotFound):
			return sw, fmt.Errorf("rls: sweep %s: %w", name, err)
		}
		sw.Deleted++
		s.forgetOverride(name)
	}
	return sw, nil
}

// holdsCounts reports whether the keyed limiter name holds counts: a key
// whose bucket is not full.
func (s *Service) holdsCounts(ctx context.Context, name string) (bool, error) {
	keys, err := s.limiters.Lowest(ctx, name, 1)
	return len(keys) > 0, err
}

// each calls f with the definitions whose names start with prefix, in
// name order, page limiters at a time, until f returns false.
func (s *Service) each(ctx context.Context, prefix string, page int, f func(limiter.Definition) bool) error {
	// Every name that starts with prefix sorts after prefix less its last
	// byte; those between are skipped.
	after := prefix[:len(prefix)-1]
	for {
		defs, err := s.limiters.List(ctx, after, page)
		if err != nil {
			return err
		}
		for _, def := range defs {
			if !strings.HasPrefix(def.Name, prefix) {
				if def.Name > prefix {
					return nil
				}
				continue
			}
			if !f(def) {
				return nil
			}
		}
		if len(defs) < page {
			return nil
		}
		after = defs[len(defs)-1].Name
	}
}

// countOverrides lists the limiters of limits set by requests that the
// backend holds, up to MaxOverrides+1 of them.
func (s *Service) countOverrides(ctx context.Context) (names []string, err error) {
	err = s.each(ctx, OverridePrefix, MaxOverrides+1, func(def limiter.Definition) bool {
		names = append(names, def.Name)
		return len(names) <= MaxOverrides
	})
	return names, err
}

// fullFor is how long a bound of limits set by requests found full is
// taken as full without listing the backend again, for limits not among
// those it then held: requests that set ever new limits cannot make the
// service list the backend at their own rate.
const fullFor = time.Second

// putOverride puts the limiter of a limit set by a request, unless the
// backend holds MaxOverrides such limiters already (the bound holds for
// every process on the backend, over restarts, and is freed as Sweep
// deletes the ones that no longer hold counts). Two processes that put a
// new one at the same instant may both find the last room: the one that
// counts more than the bound after its put deletes the limiter it just
// created, which holds no counts yet, and refuses.
func (s *Service) putOverride(ctx context.Context, def limiter.Definition) error {
	now := s.now()
	s.mu.Lock()
	full := now.Before(s.fullUntil) && !s.fullHeld[def.Name]
	s.mu.Unlock()
	if full {
		return errTooManyOverrides
	}
	names, err := s.countOverrides(ctx)
	if err != nil {
		return err
	}
	if len(names) >= MaxOverrides && !slices.Contains(names, def.Name) {
		held := make(map[string]bool, len(names))
		for _, n := range names {
			held[n] = true
		}
		s.mu.Lock()
		s.fullUntil, s.fullHeld = now.Add(fullFor), held
		s.mu.Unlock()
		return errTooManyOverrides
	}
	created, err := s.limiters.Put(ctx, def)
	if err != nil || !created {
		return err
	}
	if names, err = s.countOverrides(ctx); err == nil && len(names) > MaxOverrides {
		// Deleted unless another process has decided on it meanwhile:
		// then it stays, one past the bound, until a sweep finds it idle.
		if err := s.limiters.DeleteIdle(ctx, def.Name); err != nil && !errors.Is(err, limiter.ErrNotFound) && !errors.Is(err, limiter.ErrNotIdle) {
			return err
		}
		return errTooManyOverrides
	}
	return nil
}

// putBack puts the limiter of r again, found missing by a decision:
// deleted through the HTTP API, by a sweep of this process, or by one of
// another process on the same backend.
func (s *Service) putBack(ctx context.Context, r *Rule) error {
	if strings.HasPrefix(r.Limiter.Name, OverridePrefix) {
		s.forgetOverride(r.Limiter.Name)
		return s.putOverride(ctx, r.Limiter)
	}
	_, err := s.limiters.Put(ctx, r.Limiter)
	return err
}

// forgetOverride forgets that the limiter name of a limit set by a
// request was put, and that the bound was full: the next request that
// sets it puts it again.
func (s *Service) forgetOverride(name string) {
	s.mu.Lock()
	delete(s.overrides, name)
	s.fullUntil = time.Time{}
	s.mu.Unlock()
}

// keepOverrides forgets every limit set by a request whose limiter is not
// among names, the ones the backend holds: what the process remembers
// stays bounded by what the backend holds.
func (s *Service) keepOverrides(names []string) {
	held := make(map[string]bool, len(names))
	for _, n := range names {
		held[n] = true
	}
	s.mu.Lock()
	for name := range s.overrides {
		if !held[name] {
			delete(s.overrides, name)
		}
	}
	s.mu.Unlock()
}

// noRoom is the status of a limiter that the backend has no room for.
func noRoom(err error) error {
	if errors.Is(err, errTooManyOverrides) {
		return status.Errorf(codes.ResourceExhausted, "requests have set %d distinct limits, the most the service takes", MaxOverrides)
	}
	return status.Error(codes.ResourceExhausted, "the limiter has no room among the service's limiters")
}

// isNoRoom reports whether err is a limiter the backend has no room for.
func isNoRoom(err error) bool {
	return errors.Is(err, errTooManyOverrides) || errors.Is(err, limiter.ErrTooManyLimiters) || errors.Is(err, limiter.ErrTooManyKeys)
}
