// Package keystest holds the reference model that the tables of per-key
// buckets (memory.Keys, the per-IP tenants, keyed limiters on every
// backend) are held to in property tests.
package keystest

import (
	"cmp"
	"slices"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// Model is a plain map from key to state, with the documented rules of a
// bounded table of keys (see memory.Keys) written out as directly as
// possible. Full buckets are dropped eagerly, so every key it holds is one
// the table must remember. It is not safe for concurrent use.
type Model struct {
	policy limiter.Policy
	rate   limiter.Rate
	window limiter.Window
	max    int
	tats   map[string]limiter.TAT // GCRA
	logs   map[string]*refLog     // SlidingLog
}

type refLog struct {
	log   limiter.Log
	reset int64
}

// Entry is one key of a Lowest answer.
type Entry struct {
	Key string
	limiter.Availability
}

// NewModel returns an empty model of a table of at most maxKeys keys under
// policy p, which must be valid.
func NewModel(p limiter.Policy, maxKeys int) *Model {
	p = p.Normalize()
	m := &Model{policy: p, max: maxKeys, tats: map[string]limiter.TAT{}, logs: map[string]*refLog{}}
	if p.Algorithm == limiter.GCRA {
		m.rate = limiter.NewRate(p)
	} else {
		m.window = limiter.NewWindow(p)
	}
	return m
}

// Max is the bound on keys the model enforces.
func (m *Model) Max() int { return m.max }

func (m *Model) gcra() bool { return m.policy.Algorithm == limiter.GCRA }

// Prune drops every key whose bucket is full at now.
func (m *Model) Prune(now int64) {
	for k, t := range m.tats {
		if t.FullAt(now) {
			delete(m.tats, k)
		}
	}
	for k, l := range m.logs {
		if l.reset <= now {
			delete(m.logs, k)
		}
	}
}

// Size counts the keys held, full buckets included until pruned.
func (m *Model) Size() int { return len(m.tats) + len(m.logs) }

// Acquire takes n permits from key at now, as the table must, and reports
// whether a denial is due to a table full of limited keys.
func (m *Model) Acquire(key string, now, n int64) (limiter.Decision, bool) {
	if m.Size() >= m.max {
		m.Prune(now)
	}
	if m.gcra() {
		t, ok := m.tats[key]
		tat, d := m.rate.Acquire(t, now, n)
		if !d.Allowed {
			return d, false
		}
		if !ok && len(m.tats) == m.max {
			vk, vt := m.gcraVictim()
			if m.rate.Available(vt, now).Remaining == 0 {
				_, vd := m.rate.Acquire(vt, now, 1)
				return limiter.Decision{Permits: n, Limit: m.policy.Limit, RetryAfter: vd.RetryAfter, ResetAfter: vd.RetryAfter}, true
			}
			delete(m.tats, vk)
		}
		m.tats[key] = tat
		return d, false
	}
	l, ok := m.logs[key]
	if !ok {
		l = &refLog{}
	}
	d := l.log.Acquire(m.window, now, n)
	if !d.Allowed {
		return d, false
	}
	l.reset = now + int64(d.ResetAfter)
	if !ok && len(m.logs) == m.max {
		vk, v := m.logVictim()
		if v.log.Available(m.window, now).Remaining == 0 {
			vd := v.log.Acquire(m.window, now, 1)
			return limiter.Decision{Permits: n, Limit: m.policy.Limit, RetryAfter: vd.RetryAfter, ResetAfter: vd.RetryAfter}, true
		}
		delete(m.logs, vk)
	}
	m.logs[key] = l
	return d, false
}

// Refund gives n permits back to key at now, never beyond full, as a
// refund of the table must; a key the model does not hold is full, and
// stays so.
func (m *Model) Refund(key string, now, n int64) {
	if m.gcra() {
		if t, ok := m.tats[key]; ok {
			m.tats[key] = m.rate.Refund(t, now, n)
		}
		return
	}
	if l, ok := m.logs[key]; ok {
		l.log.Refund(m.window, now, n)
		l.reset = now + int64(l.log.Available(m.window, now).ResetAfter)
	}
}

// gcraVictim is the key evicted first: the earliest TAT, then the largest
// key.
func (m *Model) gcraVictim() (string, limiter.TAT) {
	var vk string
	var vt limiter.TAT
	first := true
	for k, t := range m.tats {
		if c := t.Compare(vt); first || c < 0 || c == 0 && k > vk {
			vk, vt, first = k, t, false
		}
	}
	return vk, vt
}

// logVictim is the key evicted first: the log that empties first, then
// the largest key.
func (m *Model) logVictim() (string, *refLog) {
	var vk string
	var v *refLog
	for k, x := range m.logs {
		if v == nil || x.reset < v.reset || x.reset == v.reset && k > vk {
			vk, v = k, x
		}
	}
	return vk, v
}

// Available is what Acquire would tell key about one permit, changing
// nothing a table could tell apart: it may drop full buckets.
func (m *Model) Available(key string, now int64) (limiter.Availability, bool) {
	_, heldT := m.tats[key]
	_, heldL := m.logs[key]
	if !heldT && !heldL && m.Size() >= m.max {
		m.Prune(now)
	}
	if m.gcra() {
		if !heldT && len(m.tats) == m.max {
			_, vt := m.gcraVictim()
			if m.rate.Available(vt, now).Remaining == 0 {
				_, vd := m.rate.Acquire(vt, now, 1)
				return limiter.Availability{Limit: m.policy.Limit, ResetAfter: vd.RetryAfter}, true
			}
		}
		return m.rate.Available(m.tats[key], now), false
	}
	if l, ok := m.logs[key]; ok {
		return l.log.Available(m.window, now), false
	}
	if len(m.logs) == m.max {
		_, v := m.logVictim()
		if v.log.Available(m.window, now).Remaining == 0 {
			vd := v.log.Acquire(m.window, now, 1)
			return limiter.Availability{Limit: m.policy.Limit, ResetAfter: vd.RetryAfter}, true
		}
	}
	var empty limiter.Log
	return empty.Available(m.window, now), false
}

// Lowest sorts every key by the documented order (fewest permits left;
// then, under GCRA, the latest TAT, under the sliding log the latest
// reset; then the smallest key, bytewise) and keeps k.
func (m *Model) Lowest(now int64, k int) []Entry {
	m.Prune(now)
	type row struct {
		key string
		tat limiter.TAT // GCRA only
		av  limiter.Availability
	}
	var rows []row
	for key, t := range m.tats {
		rows = append(rows, row{key, t, m.rate.Available(t, now)})
	}
	for key, l := range m.logs {
		rows = append(rows, row{key: key, av: l.log.Available(m.window, now)})
	}
	slices.SortFunc(rows, func(a, b row) int {
		if c := cmp.Compare(a.av.Remaining, b.av.Remaining); c != 0 {
			return c
		}
		if m.gcra() {
			if c := b.tat.Compare(a.tat); c != 0 {
				return c
			}
		} else if c := cmp.Compare(b.av.ResetAfter, a.av.ResetAfter); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	})
	out := make([]Entry, 0, min(k, len(rows)))
	for _, r := range rows[:min(k, len(rows))] {
		out = append(out, Entry{Key: r.key, Availability: r.av})
	}
	return out
}
