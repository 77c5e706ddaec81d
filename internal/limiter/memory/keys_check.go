package memory

import "fmt"

// The invariants Keys.Check verifies.

func (st *gcraTable) check() error {
	total := 0
	for si := range st.shards {
		s := &st.shards[si]
		s.mu.Lock()
		err := s.check(st, si)
		total += s.live
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if c := st.count.Load(); int64(total) != c {
		return fmt.Errorf("shards hold %d keys, count says %d", total, c)
	}
	return nil
}

func (s *gcraShard) check(st *gcraTable, si int) error {
	if s.nslots != len(s.blocks)*fanout || len(s.blocks) != blocksFor(len(s.blocks)*fanout) {
		return fmt.Errorf("shard %d: %d slots in %d blocks", si, s.nslots, len(s.blocks))
	}
	live, used, liveBytes := 0, 0, 0
	for i := range s.nslots {
		sl := s.slot(i)
		if sl.state == slotEmpty {
			continue
		}
		used++
		if sl.state != slotLive {
			continue
		}
		live++
		r := s.key(i)
		key := string(r.bytes())
		h := st.hash(key)
		if st.shard(h) != s {
			return fmt.Errorf("shard %d: key %q belongs to another shard", si, key)
		}
		if sl.n > inlineKey && sl.fp != fingerprint(h) {
			return fmt.Errorf("shard %d: key %q has fingerprint %#x, want %#x", si, key, sl.fp, fingerprint(h))
		}
		if j, found := s.find(key, h); !found || j != i {
			return fmt.Errorf("shard %d: key %q in slot %d, find gives %d, %v", si, key, i, j, found)
		}
		if sl.n > inlineKey {
			liveBytes += int(sl.n)
		}
	}
	if liveBytes+s.dead != len(s.arena) {
		return fmt.Errorf("shard %d: arena of %d bytes holds %d live and %d dead", si, len(s.arena), liveBytes, s.dead)
	}
	if live != s.live || used != s.used {
		return fmt.Errorf("shard %d: %d live and %d used slots, fields say %d and %d", si, live, used, s.live, s.used)
	}
	if used*maxLoadDen > s.nslots*maxLoadNum {
		return fmt.Errorf("shard %d: %d of %d slots used", si, used, s.nslots)
	}
	return s.checkIndex(si)
}

// checkIndex verifies that every bound of the shard's index is exact.
func (s *gcraShard) checkIndex(si int) error {
	for b := range s.blocks {
		if got, want := s.blocks[b].span, s.blockSpan(b); got != want {
			return fmt.Errorf("shard %d: block %d spans %+v, want %+v", si, b, got, want)
		}
	}
	n := len(s.blocks)
	for l := 1; l < s.depth(); l++ {
		n = (n + fanout - 1) / fanout
		lv := s.levels[l-1]
		if len(lv) != n && len(lv) != (n+fanout-1)/fanout*fanout {
			return fmt.Errorf("shard %d: level %d has %d nodes for %d", si, l, len(lv), n)
		}
		for j := range lv {
			want := emptySpan
			if j < n {
				want = s.childrenSpan(l, j)
			}
			if got := lv[j]; got != want {
				return fmt.Errorf("shard %d: level %d node %d is %+v, want %+v", si, l, j, got, want)
			}
		}
	}
	if n != 1 {
		return fmt.Errorf("shard %d: top level has %d nodes", si, n)
	}
	root := s.root()
	if lo, hi := s.rootLo.Load(), s.rootHi.Load(); lo != root.lo || hi != root.hi {
		return fmt.Errorf("shard %d: published root {%d %d}, want %+v", si, lo, hi, root)
	}
	return nil
}

func (st *logTable) check() error {
	total := 0
	for si := range st.shards {
		s := &st.shards[si]
		s.mu.Lock()
		var err error
		if n := s.byReset.Len(); n != len(s.keys) {
			err = fmt.Errorf("shard %d: %d keys, %d index items", si, len(s.keys), n)
		}
		for key, lt := range s.keys {
			if _, ok := s.byReset.Get(logItem{lt.reset, key}); !ok && err == nil {
				err = fmt.Errorf("shard %d: key %q not indexed at %d", si, key, lt.reset)
			}
		}
		total += len(s.keys)
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if c := st.count.Load(); int64(total) != c {
		return fmt.Errorf("shards hold %d keys, count says %d", total, c)
	}
	return nil
}
