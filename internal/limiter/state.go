package limiter

// State is a bucket's state as a snapshot keeps it, apart from its policy:
// a GCRA bucket's TAT, or a sliding log's grants, oldest first. Its
// instants are on the timeline of the Clock that decided them.
type State struct {
	TAT    TAT     // GCRA
	Grants []Grant // SlidingLog
}

// Grant is N permits granted (or charged) at the instant At, in
// nanoseconds on a Clock's timeline.
type Grant struct {
	At, N int64
}

// State returns the bucket's state; it shares nothing with the bucket.
func (b *Bucket) State() State {
	if b.gcra {
		return State{TAT: b.tat}
	}
	l := &b.log
	gs := make([]Grant, l.size)
	for i := range gs {
		e := l.at(i)
		gs[i] = Grant{At: e.at, N: e.n}
	}
	return State{Grants: gs}
}

// SetState makes s the bucket's state: a TAT for GCRA, the grants for a
// sliding log, recorded oldest first as Charge records them (so the log
// keeps its bound on entries, merging as it would have). Grants of no
// permits are ignored.
func (b *Bucket) SetState(s State) {
	if b.gcra {
		b.tat = s.TAT
		return
	}
	b.log = Log{}
	for _, g := range s.Grants {
		if g.N > 0 {
			b.log.append(b.window, clampNow(g.At), min(g.N, b.window.limit+MaxLogDebt-b.log.used))
		}
	}
}

// Shift returns s with every instant moved by d nanoseconds (see
// ShiftNanos): what a snapshot's state is on the timeline of another
// Clock, whose readings are d ahead of those of the Clock that decided it.
func (s State) Shift(d int64) State {
	out := State{TAT: s.TAT}
	if s.TAT != (TAT{}) {
		out.TAT.NS = ShiftNanos(s.TAT.NS, d)
	}
	if s.Grants != nil {
		out.Grants = make([]Grant, len(s.Grants))
		for i, g := range s.Grants {
			out.Grants[i] = Grant{At: ShiftNanos(g.At, d), N: g.N}
		}
	}
	return out
}

// ShiftNanos returns the instant t moved by d nanoseconds, clamped to
// [0, MaxNanos] as Nanos clamps.
func ShiftNanos(t, d int64) int64 {
	switch {
	case d > 0 && t > MaxNanos-d:
		return MaxNanos
	case d < 0 && t < -d:
		return 0
	}
	return clampNow(t + d)
}

// Exhaust records at now everything the bucket could grant, as if it had
// all been granted then: the bucket grants nothing more before a full
// bucket emptied at now would, and debt it held beyond that stays. It is
// the rule for a bucket whose grants since its last known state are
// unknown, all of them made at or before now: under GCRA it then admits at
// most Burst + ⌊w·Limit/Period⌋ permits in any interval of length w that
// spans now, those unknown grants included, and under the sliding log at
// most Limit in any window of length Period. The cost is that it may deny,
// for up to one Period, permits that were never used.
func (b *Bucket) Exhaust(now int64) {
	now = clampNow(now)
	if b.gcra {
		if empty := b.rate.tatAfter(now, b.rate.tolerance); empty.Compare(b.tat) > 0 {
			b.tat = empty
		}
		return
	}
	b.log.Charge(b.window, now, b.window.limit)
}

// Empty reports whether the bucket holds no trace of a grant at now: it is
// a full bucket, indistinguishable from an unused one.
func (b *Bucket) Empty(now int64) bool {
	if b.gcra {
		return b.tat.FullAt(clampNow(now))
	}
	b.log.expire(b.window, clampNow(now))
	return b.log.size == 0
}

// Clone returns a copy of l that shares no memory with it.
func (l Log) Clone() Log {
	if l.ring != nil {
		l.ring = append([]logEntry(nil), l.ring...)
	}
	return l
}

// State returns the limiter's state, under its lock.
func (l *Limiter) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.State()
}

// SetState sets the limiter's state (see Bucket.SetState) under its lock.
func (l *Limiter) SetState(s State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.SetState(s)
}

// Exhaust exhausts the limiter at now (see Bucket.Exhaust) under its lock.
func (l *Limiter) Exhaust(now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Exhaust(now)
}
