-- Decide: decides several limiters together, all or nothing, at the
-- server's time (or at ARGV[1] microseconds, in tests; empty otherwise).
-- For n limiters, limiter j (from 1) is defined in KEYS[2j-1], its state
-- is KEYS[2j], and ARGV[2+j] permits are asked of it. When every limiter
-- has room for what is asked of it and ARGV[2] is 'take', all of them are
-- recorded; otherwise nothing is (grants that have left a sliding log's
-- window are forgotten, which changes no answer). ARGV[2] 'peek' records
-- nothing; 'charge' records every limiter's permits whether they fit or
-- not (a limiter in debt grants nothing until time repays it), and
-- 'refund' gives them back, never beyond full: both always apply, and
-- report fits = 1.
--
-- KEYS[2n+1] is the idempotency key's record and KEYS[2n+2] a
-- reservation, both in the limiters' slot. ARGV[3+n] is the decision's
-- fingerprint, empty without an idempotency key, and ARGV[4+n] the
-- record's time to live in milliseconds. A record under another
-- fingerprint answers {-1} and decides nothing; one under the same
-- fingerprint answers the reply it holds, with 2 in place of its leading
-- 1, and decides nothing; otherwise the reply is recorded.
--
-- ARGV[5+n] is a reservation's time to live in milliseconds, or empty,
-- and ARGV[5+n+j] the name of limiter j. A 'take' with a time to live that
-- is granted also records the reservation: of each part its name, key,
-- permits, the generation of its definition (its 'gen' field) and what
-- the bucket holds of it, two numbers: under GCRA the TAT the grant left
-- (µs and units), by which its permits have drained; under the sliding
-- log the instant of the grant (µs) and 0. Fields are separated by the
-- control characters US (31) within a part and RS (30) between parts,
-- which neither names nor keys hold; the reply ends with the
-- reservation's ID, ARGV[6+3n] to ARGV[9+3n], four 32-bit numbers, which
-- a replay gives back. 'settle' charges or refunds each part the
-- difference between ARGV[2+j], what was spent, and what the reservation
-- holds of it (a refund gives back no more than the bucket still holds:
-- see gcra_adjust and log_refund), but only reports a part whose limiter
-- has been redefined since (another generation), then deletes the
-- reservation: {-2} when there
-- is none, {-3, j} when it holds nothing of part j, and nothing changes
-- then; when a charge finds no room for its key, nothing is settled and
-- the reservation stays.
--
-- Keys. ARGV[5+2n+j] is the key of part j of a keyed limiter, '' for a
-- plain limiter; a keyed part's state and its table's indexes are named
-- after its definition (see table.lua), and it is decided with the same
-- code as a plain limiter. A key its table does not remember needs room
-- when the decision records permits for it, made as memory.Keys makes it
-- in a joint decision: a Take decides first whether it is allowed, and no
-- key is evicted for one that is denied; a key whose table cannot make
-- room now is reported keys_full, and nothing is recorded then; a take
-- or peek of more than its capacity is reported exceeds_capacity instead.
--
-- Reply: {0, j} when limiter j is not defined, {-4, j} when part j names a
-- key of a plain limiter or none of a keyed one, otherwise 1 followed by
-- nine fields per part: fits, remaining, limit, retry_us, retry_ns,
-- reset_us, reset_ns, exceeds_capacity, keys_full, durations as
-- microseconds plus nanoseconds. remaining and reset are after the grant
-- when one was made, as the limiter stands otherwise.
--
-- A 'take' or 'peek' without a reservation then adds two fields per part,
-- next_us and next_ns: how long until one permit more than remaining
-- fits, if nobody takes any meanwhile, or -1 and 0 when that is not
-- given (a key without room, a bucket that is full, a sliding log with
-- permits left). They are not recorded under the idempotency key, so a
-- replay lacks them: they say what the state is now, for the denial cache
-- of the Store (see denials.go), and an answer from a record is not now.
--
-- A batch makes m decisions of one slot in one run: ARGV[1] is 'batch',
-- ARGV[2] the instant as above (empty for the server's time), ARGV[3] m,
-- then, for each decision, how many keys and arguments it has, which
-- follow in KEYS and in ARGV, decision after decision, as above (the
-- instant of each is ignored). They are made in order, each as if alone,
-- all at one instant, and the reply is the list of their replies: an
-- error reply for a decision that raised one.

-- A charge never puts a bucket more than MaxPeriod (366 days) of refill in
-- debt, nor a sliding log more than MaxLogDebt permits past its limit, as
-- the Go code caps them.
local MAX_DEBT_US = 31622400000000
local MAX_LOG_DEBT = 1000000000

-- gcra_adjust charges or refunds n permits of the bucket at key (or, with
-- mode 'none', reads it), and returns its remaining permits and reset time
-- afterwards. A refund with a hold {tat_us, tat_r}, the TAT a
-- reservation's grant left, gives back no more than what of it has not
-- drained by now (nothing once that TAT has passed).
local function gcra_adjust(g, key, now, n, mode, hold)
  local ba, bb = gcra_backlog(key, now)
  local aa, ab
  if mode == 'none' then
    local ra, rn = gcra_duration(g, ba, bb)
    return gcra_remaining(g, ba, bb), ra, rn
  elseif mode == 'charge' then
    -- Past the cap the rest is forgiven: bound n first, so that n * pa
    -- stays below 2^53.
    if g.pa > 0 and n > floor(MAX_DEBT_US / g.pa) + 1 then
      n = floor(MAX_DEBT_US / g.pa) + 1
    end
    local ca, cb = gcra_cost(g, n)
    aa, ab = ba + ca, bb + cb
    if ab >= g.m then
      aa, ab = aa + 1, ab - g.m
    end
    if aa > MAX_DEBT_US or aa == MAX_DEBT_US and ab > 0 then
      aa, ab = MAX_DEBT_US, 0
    end
  else
    aa, ab = 0, 0
    -- n permits cost more than the backlog: computed, they could pass 2^53.
    local big = g.pa > 0 and n > floor(ba / g.pa) + 1
    local ca, cb = 0, 0
    if not big then
      ca, cb = gcra_cost(g, n)
    end
    if hold then
      -- What the hold has left after now, as a backlog.
      local ha, hb = hold[1] - now, hold[2]
      if ha < 0 or ha == 0 and hb == 0 then
        ha, hb = 0, 0
      end
      if big or cmp2(ha, hb, ca, cb) < 0 then
        ca, cb, big = ha, hb, false
      end
    end
    if not big and cmp2(ba, bb, ca, cb) > 0 then
      aa, ab = ba - ca, bb - cb
      if ab < 0 then
        aa, ab = aa - 1, ab + g.m
      end
    end
  end
  local ra, rn = gcra_duration(g, aa, ab)
  if aa == 0 and ab == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, gcra_state(now + aa, ab), 'PXAT', fmt(expiry_ms(now + ra, rn)))
  end
  return gcra_remaining(g, aa, ab), ra, rn
end

-- log_refund gives back up to n permits of the sliding log at key that
-- were granted at or after the instant at (µs): from the oldest entry
-- stamped at or after it, which holds that grant (or, merged, the entry
-- it was merged into), and nothing once at has left the window, when the
-- later entries are other grants. It costs one write per entry after
-- that one, whose running totals drop; an entry left empty is removed.
local function log_refund(w, key, now, n, at)
  if log_expired(w, at, now) then
    return
  end
  local es = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  -- es[1], es[2]: the base; then each entry's instant and running total.
  local prev = tonumber(es[2] or 0)
  for i = 3, #es, 2 do
    local total = tonumber(es[i + 1])
    if tonumber(es[i]) >= at and not log_expired(w, tonumber(es[i]), now) then
      local k = total - prev
      if k > n then
        k = n
      end
      if k <= 0 then
        return
      end
      if k == total - prev then
        redis.call('ZREM', key, es[i])
      else
        redis.call('ZINCRBY', key, fmt(-k), es[i])
      end
      for m = i + 2, #es, 2 do
        redis.call('ZINCRBY', key, fmt(-k), es[m])
      end
      if #es == 4 and k == total - prev then
        redis.call('DEL', key) -- nothing left but the base
      end
      return
    end
    prev = total
  end
end

-- log_adjust charges or refunds n permits of the sliding log at key (or,
-- with mode 'none', reads it), and returns its remaining permits and reset
-- time afterwards. A refund gives
-- back the newest grants first: every entry above the running total
-- last_total - n goes, and the oldest of them stays with what it keeps.
local function log_adjust(w, key, now, n, mode, hold)
  if hold then
    log_refund(w, key, now, n, hold[1])
    mode = 'none'
  end
  local l = log_read(key, w, now)
  local last_at = l.at
  local member, base, size, last_total = log_forget(key, l)
  local used = last_total - base
  if mode == 'charge' then
    if n > w.limit + MAX_LOG_DEBT - used then
      n = w.limit + MAX_LOG_DEBT - used
    end
    if n > 0 then
      base, member, last_at = log_take(key, w, n, now, base, member, last_at, last_total, size)
      redis.call('PEXPIREAT', key, fmt(expiry_ms(last_at + w.pw, w.pr)))
      used = used + n
    end
  elseif mode == 'refund' and member then
    local target = last_total - n
    if target <= base then
      redis.call('DEL', key)
      member, used = nil, 0
    else
      local over = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(target), '+inf', 'LIMIT', 0, 1)
      local keep = redis.call('ZCOUNT', key, fmt(target), fmt(target)) == 0
      redis.call('ZREMRANGEBYSCORE', key, '(' .. fmt(target), '+inf')
      if keep then
        redis.call('ZADD', key, fmt(target), over[1])
      end
      local last = redis.call('ZRANGE', key, -1, -1)
      member, last_at, used = last[1], tonumber(last[1]), target - base
    end
  end
  local ra, rn = 0, 0
  if member then
    ra, rn = log_until(w, last_at, now)
  end
  return log_remaining(w, used), ra, rn
end

-- A decision's functions below take its context x as an argument rather
-- than close over it, so that a run of up to maxGroup decisions does not
-- make ten closures for each of them. x holds
--   KEYS, ARGV  the decision's own, as the header says
--   count       its parts
--   ps          the parts: each one's definition d, policy (g for GCRA, w
--               for the sliding log), state key st, permits n, key, and,
--               for a key of a keyed limiter, its table (idx, exp, max,
--               base) and its index member old (see locate)
--   now         the run's instant
--   mode        ARGV[2]
--   modes, ns   for a charge, refund or settlement: each part's own mode
--               ('charge', 'refund' or 'none') and permits
--   holds       for a settlement: what the reservation holds of each part
--               it refunds, {a, b} (see the header), or false for nothing
--   after       the fields that follow a reply without being recorded
--               with it: next_us and next_ns of each part (see reply)
-- A table made with all its fields is made at once; one given them one by
-- one grows several times. So the parts and checks below are made whole,
-- with false for what they do not hold yet.

-- remember records reply r under the idempotency key, if there is one,
-- and returns it followed by x.after.
local function remember(x, r)
  local count, ARGV = x.count, x.ARGV
  local fingerprint = ARGV[3 + count]
  if fingerprint ~= '' then
    local fs = {}
    for i = 1, #r do
      fs[i] = fmt(r[i])
    end
    redis.call('SET', x.KEYS[2 * count + 1], fingerprint .. '\n' .. table.concat(fs, ' '), 'PX', ARGV[4 + count])
  end
  local after = x.after
  for i = 1, #after do
    r[#r + 1] = after[i]
  end
  return r
end

-- locate reads each key: p.old is its index member, false when its table
-- does not hold it (a full bucket is forgotten here), and its state, for
-- judge, is p.ba and p.bb (GCRA) or p.log (sliding log).
local function locate(x)
  local now = x.now
  for j = 1, x.count do
    local p = x.ps[j]
    if p.idx then
      if p.g then
        local old
        p.ba, p.bb, old = key_gcra_read(p.st, p.idx, p.key, now)
        p.old = old or false
      else
        p.log = key_log_read(p.w, p.st, p.idx, p.exp, p.key, now)
        p.old = p.log.old or false
      end
    end
  end
end

-- records reports whether part j records permits.
local function records(x, j)
  return x.mode == 'take' or x.modes[j] == 'charge'
end

-- homeless returns the parts among those that record permits whose key
-- needs room and would not get it from the room left in its table:
-- newcomers take that room in part order.
local function homeless(x)
  local free, out
  for j = 1, x.count do
    local p = x.ps[j]
    if p.idx and not p.old and records(x, j) then
      free = free or {}
      if free[p.idx] == nil then
        free[p.idx] = p.max - redis.call('ZCARD', p.idx)
      end
      if free[p.idx] > 0 then
        free[p.idx] = free[p.idx] - 1
      else
        out = out or {}
        out[#out + 1] = j
      end
    end
  end
  return out
end

-- victim_wait returns nil when the key p's table would evict first has a
-- permit left, otherwise how long until it has one, {µs, ns}: {0, 0} when
-- the table holds no key to evict.
local function victim_wait(p, now)
  if redis.call('ZCARD', p.idx) == 0 then
    return {0, 0}
  end
  if p.g then
    return gcra_room(p.g, p.idx, p.base, now, 0, false)
  end
  return log_room(p.w, p.idx, p.exp, p.base, now, 0, false)
end

-- full marks check c of a key that cannot be given room before wait.
local function full(c, wait)
  c.fits, c.rem, c.retry_us, c.retry_ns, c.exceeds, c.keys_full = 0, 0, wait[1], wait[2], 0, 1
  c.reset = wait
end

-- judge reads and judges every part at now (a key as locate read it); a
-- part's check c holds what a grant needs.
local function judge(x)
  local cs, all, now = {}, true, x.now
  for j = 1, x.count do
    local p = x.ps[j]
    local n = p.n
    local c = {
      n = n, fits = 0, rem = 0, limit = 0, retry_us = 0, retry_ns = 0, exceeds = 0, keys_full = 0,
      reset = false, ba = 0, bb = 0, aa = 0, ab = 0,
      last_at = false, member = false, base = 0, size = false, last_total = 0, used = 0, old = false,
    }
    if p.g then
      local g = p.g
      if p.idx then
        c.ba, c.bb = p.ba, p.bb
      else
        c.ba, c.bb = gcra_backlog(p.st, now)
      end
      c.rem = gcra_remaining(g, c.ba, c.bb)
      c.limit = g.limit
      if n > g.burst then
        c.exceeds = 1
      else
        local aa, ab, wa, wn = gcra_fit(g, c.ba, c.bb, n)
        if wa then
          c.retry_us, c.retry_ns = wa, wn
        else
          c.fits, c.aa, c.ab = 1, aa, ab
        end
      end
    else
      local w = p.w
      if p.idx then
        local k = p.log
        c.last_at, c.member, c.base, c.size, c.last_total = k.last_at, k.member, k.base, k.size, k.last_total
      else
        local l = log_read(p.st, w, now)
        c.last_at = l.at
        c.member, c.base, c.size, c.last_total = log_forget(p.st, l)
      end
      c.used = c.last_total - c.base
      c.old = p.old
      c.rem = log_remaining(w, c.used)
      c.limit = w.limit
      if n > w.limit then
        c.exceeds = 1
      elseif c.used + n > w.limit then
        local e = redis.call('ZRANGEBYSCORE', p.st, fmt(c.base + c.used + n - w.limit), '+inf', 'LIMIT', 0, 1)
        c.retry_us, c.retry_ns = log_until(w, tonumber(e[1]), now)
      else
        c.fits = 1
      end
    end
    all = all and c.fits == 1
    cs[j] = c
  end
  return cs, all
end

-- reply writes the parts' checks, after recording every grant when
-- granted (with the reservation when there is one).
local function reply(x, cs, granted)
  local count, ARGV, now, mode = x.count, x.ARGV, x.now, x.mode
  local rsv_ttl = ARGV[5 + count]
  if granted and rsv_ttl ~= '' then
    local rec = {}
    for j = 1, count do
      local p, c = x.ps[j], cs[j]
      local ha, hb = now, 0
      if p.g then
        ha, hb = now + c.aa, c.ab
      end
      rec[j] = table.concat({ARGV[5 + count + j], ARGV[5 + 2 * count + j], ARGV[2 + j], p.d[14] or '', fmt(ha), fmt(hb)}, '\31')
    end
    redis.call('SET', x.KEYS[2 * count + 2], table.concat(rec, '\30'), 'PX', rsv_ttl)
  end
  local r, after = {1}, x.after
  for j = 1, count do
    local p, c = x.ps[j], cs[j]
    local rem, ra, rn = c.rem, 0, 0
    if c.reset then
      ra, rn = c.reset[1], c.reset[2]
    elseif p.g then
      if granted then
        ra, rn = gcra_duration(p.g, c.aa, c.ab)
        if p.idx then
          key_gcra_write(p.st, p.idx, p.key, now, c.aa, c.ab, ra, rn, p.old)
        else
          redis.call('SET', p.st, gcra_state(now + c.aa, c.ab), 'PXAT', fmt(expiry_ms(now + ra, rn)))
        end
        rem = rem - c.n
      else
        ra, rn = gcra_duration(p.g, c.ba, c.bb)
      end
    else
      if granted then
        if p.idx then
          key_log_write(p.w, p.st, p.idx, p.exp, p.key, now, c.n, c)
        else
          local _
          _, c.member, c.last_at = log_take(p.st, p.w, c.n, now, c.base, c.member, c.last_at, c.last_total, c.size)
          redis.call('PEXPIREAT', p.st, fmt(expiry_ms(c.last_at + p.w.pw, p.w.pr)))
        end
        rem = rem - c.n
      end
      if c.member then
        ra, rn = log_until(p.w, c.last_at, now)
      end
    end
    local k = #r
    r[k + 1], r[k + 2], r[k + 3], r[k + 4], r[k + 5] = c.fits, rem, c.limit, c.retry_us, c.retry_ns
    r[k + 6], r[k + 7], r[k + 8], r[k + 9] = ra, rn, c.exceeds, c.keys_full
    if (mode == 'take' or mode == 'peek') and rsv_ttl == '' then
      local na, nn = -1, 0
      if c.keys_full == 1 then
        -- The key's own state is not what denies it.
      elseif p.g then
        if rem < p.g.burst then
          local xa, xb = c.ba, c.bb
          if granted then
            xa, xb = c.aa, c.ab
          end
          local _, _, wa, wn = gcra_fit(p.g, xa, xb, rem + 1)
          if wa then
            na, nn = wa, wn
          end
        end
      elseif rem == 0 then
        -- No permit fits before the oldest grant in the window leaves
        -- it (rank 0 is the base), perhaps not even then.
        local e = redis.call('ZRANGE', p.st, 1, 1)
        if e[1] then
          na, nn = log_until(p.w, tonumber(e[1]), now)
        end
      end
      after[#after + 1], after[#after + 2] = na, nn
    end
  end
  if granted and rsv_ttl ~= '' then
    -- The reservation's ID, as four 32-bit numbers, so that a replay of
    -- this answer names the same reservation.
    for i = 1, 4 do
      r[#r + 1] = tonumber(ARGV[5 + 3 * count + i])
    end
  end
  return r
end

-- index_after records where key part p stands in its table's index after
-- a charge or refund: its new member, or none when its bucket is full.
local function index_after(p, now)
  if p.g then
    if p.old then
      redis.call('ZREM', p.idx, p.old)
    end
    local v = redis.call('GET', p.st)
    if v then
      local sp = string.find(v, ' ', 1, true)
      redis.call('ZADD', p.idx, fmt(-tonumber(string.sub(v, 1, sp - 1))), gcra_member(tonumber(string.sub(v, sp + 1)), p.key))
      extend(p.idx, redis.call('PEXPIRETIME', p.st))
    end
    return
  end
  if p.old then
    redis.call('ZREM', p.idx, p.old)
    redis.call('ZREM', p.exp, p.old)
  end
  local l = log_read(p.st, p.w, now)
  if l.member and l.total > l.base then
    local m = log_member(l.at, p.key)
    redis.call('ZADD', p.idx, fmt(-(l.total - l.base)), m)
    redis.call('ZADD', p.exp, fmt(l.at + p.w.pu), m)
    local e = redis.call('PEXPIRETIME', p.st)
    extend(p.idx, e)
    extend(p.exp, e)
  end
end

-- adjust charges, refunds or reads each part as x.modes[j] says, by
-- x.ns[j] permits, every one of them unconditionally.
local function adjust(x)
  local r, now, modes, ns = {1}, x.now, x.modes, x.ns
  for j = 1, x.count do
    local p = x.ps[j]
    local rem, ra, rn, limit
    local h = x.holds and modes[j] == 'refund' and (x.holds[j] or {0, 0})
    if p.g then
      rem, ra, rn = gcra_adjust(p.g, p.st, now, ns[j], modes[j], h)
      limit = p.g.limit
    else
      rem, ra, rn = log_adjust(p.w, p.st, now, ns[j], modes[j], h)
      limit = p.w.limit
    end
    if p.idx and modes[j] ~= 'none' then
      index_after(p, now)
    end
    local k = #r
    r[k + 1], r[k + 2], r[k + 3], r[k + 4], r[k + 5] = 1, rem, limit, 0, 0
    r[k + 6], r[k + 7], r[k + 8], r[k + 9] = ra, rn, 0, 0
  end
  return r
end

-- decide makes one decision: KEYS and ARGV are its own, as the header
-- says, and run what the decisions of one run of the script share: the
-- instant now (taken once, so that every decision of a run is made at
-- the same time, as the keys' expiry is), the definitions read (run.defs,
-- by key, each with its policy once read), the tables trimmed
-- (run.trimmed) and how many members a trim removes at most (run.trim).
local function decide(KEYS, ARGV, run)
  local count = (#KEYS - 2) / 2
  local fingerprint = ARGV[3 + count]
  if fingerprint ~= '' then
    local rec = redis.call('GET', KEYS[2 * count + 1])
    if rec then
      local nl = string.find(rec, '\n', 1, true)
      if string.sub(rec, 1, nl - 1) ~= fingerprint then
        return {-1}
      end
      local r = {}
      for f in string.gmatch(string.sub(rec, nl + 1), '%S+') do
        r[#r + 1] = tonumber(f)
      end
      r[1] = 2
      return r
    end
  end

  local mode = ARGV[2]
  local held, gens, holds
  if mode == 'settle' then
    local rec = redis.call('GET', KEYS[2 * count + 2])
    if not rec then
      return {-2}
    end
    held, gens, holds = {}, {}, {}
    if string.find(rec, '\31', 1, true) then
      for part in string.gmatch(rec, '[^\30]+') do
        local f = {}
        for v in string.gmatch(part .. '\31', '([^\31]*)\31') do
          f[#f + 1] = v
        end
        local id = f[1] .. '\31' .. f[2]
        -- A part made before reservations held a generation and a hold
        -- has '' for the one, as a plain limiter defined then has none,
        -- and nothing held: nothing is given back.
        held[id], gens[id] = tonumber(f[3]), f[4] or ''
        if f[6] then
          holds[id] = {tonumber(f[5]), tonumber(f[6])}
        end
      end
    else
      -- A reservation made before reservations held keys.
      for name, n in string.gmatch(rec, '([^ =]+)=(%d+)') do
        held[name .. '\31'], gens[name .. '\31'] = tonumber(n), ''
      end
    end
    for j = 1, count do
      if not held[ARGV[5 + count + j] .. '\31' .. ARGV[5 + 2 * count + j]] then
        return {-3, j}
      end
    end
  end

  -- The parts: each one's definition, state key and, for a key of a keyed
  -- limiter, its table.
  local ps = {}
  for j = 1, count do
    local def = KEYS[2 * j - 1]
    local d = run.defs[def]
    if not d then
      d = redis.call('HMGET', def, unpack(DEF_FIELDS))
      run.defs[def] = d
    end
    if not d[1] then
      return {0, j}
    end
    local key = ARGV[5 + 2 * count + j]
    if (d[13] ~= false) ~= (key ~= '') then
      return {-4, j}
    end
    -- The policy is read once a run, with the definition.
    local g, w = false, false
    if d[1] == 'gcra' then
      d.g = d.g or gcra_def(d)
      g = d.g
    else
      d.w = d.w or log_def(d)
      w = d.w
    end
    local p = {
      d = d, g = g, w = w, key = key, st = KEYS[2 * j], n = tonumber(ARGV[2 + j]),
      base = false, idx = false, exp = false, max = false, old = false, ba = 0, bb = 0, log = false,
    }
    if key ~= '' then
      local t = string.sub(def, 1, #def - 3)
      p.base = key_base(def, d[14])
      p.st, p.idx, p.exp, p.max = p.base .. key, t .. 'idx', t .. 'exp', tonumber(d[13])
    end
    ps[j] = p
  end
  local now = run.now
  for j = 1, count do
    local p = ps[j]
    if p.idx and not run.trimmed[p.idx] then
      run.trimmed[p.idx] = true
      if p.g then
        gcra_trim(p.idx, now, run.trim)
      else
        log_trim(p.idx, p.exp, now, run.trim)
      end
    end
  end

  local x = {
    KEYS = KEYS, ARGV = ARGV, count = count, ps = ps, now = now, mode = mode,
    modes = false, ns = false, holds = false, after = {},
  }
  if mode == 'charge' or mode == 'refund' or mode == 'settle' then
    local modes, ns, hs = {}, {}, {}
    for j = 1, count do
      local n = ps[j].n
      local part = ARGV[5 + count + j] .. '\31' .. ARGV[5 + 2 * count + j]
      if mode == 'settle' and gens[part] ~= (ps[j].d[14] or '') then
        -- Redefined since the reservation: what was reserved went with
        -- the old definition, and the new one is only reported.
        modes[j], ns[j] = 'none', 0
      elseif mode == 'settle' then
        n = n - held[part]
        if n > 0 then
          modes[j], ns[j] = 'charge', n
        elseif n < 0 then
          modes[j], ns[j] = 'refund', -n
          hs[j] = holds[part] or false
        else
          modes[j], ns[j] = 'none', 0
        end
      else
        modes[j], ns[j] = mode, n
      end
    end
    x.modes, x.ns = modes, ns
    if mode == 'settle' then
      x.holds = hs
    end
  end

  -- Each round evicts at most one key: a key of this decision may be the
  -- one evicted, and needs room in turn.
  for _ = 0, 2 * count do
    locate(x)
    local cs, all = judge(x)
    if mode == 'peek' then
      -- What a Take would be told of each key that cannot get room.
      for j = 1, count do
        local p = ps[j]
        if p.idx and not p.old and cs[j].exceeds == 0 and redis.call('ZCARD', p.idx) >= p.max then
          local wait = victim_wait(p, now)
          if wait then
            full(cs[j], wait)
          end
        end
      end
      return remember(x, reply(x, cs, false))
    end
    local hs = homeless(x)
    if not hs then
      if mode == 'take' then
        return remember(x, reply(x, cs, all))
      end
      if mode == 'settle' then
        redis.call('DEL', KEYS[2 * count + 2])
      end
      return remember(x, adjust(x))
    end
    -- A key that cannot get room now denies the decision (or refuses the
    -- charge), and none is evicted for it: check them all first.
    -- A Take above a key's capacity is told so, as an acquisition is,
    -- rather than that its key has no room: room would not make it fit.
    local blocked = false
    for _, j in ipairs(hs) do
      if not (mode == 'take' and cs[j].exceeds == 1) then
        local wait = victim_wait(ps[j], now)
        if wait then
          full(cs[j], wait)
          blocked = true
        end
      end
    end
    if blocked or mode == 'take' and not all then
      if mode == 'settle' then
        -- A settlement reports the other parts as they stand, as adjust
        -- would with nothing to adjust.
        for j = 1, count do
          local c = cs[j]
          if c.keys_full == 0 then
            c.fits, c.retry_us, c.retry_ns, c.exceeds = 1, 0, 0, 0
          end
        end
      end
      return remember(x, reply(x, cs, false))
    end
    local p = ps[hs[1]]
    if p.g then
      gcra_room(p.g, p.idx, p.base, now, 0, true)
    else
      log_room(p.w, p.idx, p.exp, p.base, now, 0, true)
    end
  end
  return {-5}
end

if ARGV[1] == 'batch' then
  local m = tonumber(ARGV[3])
  local run = {now = clock(ARGV[2]), defs = {}, trimmed = {}, trim = TRIM * m}
  local out = {}
  local ki, ai = 1, 4 + 2 * m
  for i = 1, m do
    local nk, na = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
    -- A decision that raises an error (a key of the wrong type, say)
    -- fails alone, with that error as its reply, as it would have on its
    -- own; the others are still made.
    local ok, r = pcall(decide, {unpack(KEYS, ki, ki + nk - 1)}, {unpack(ARGV, ai, ai + na - 1)}, run)
    if not ok and type(r) ~= 'table' then
      r = redis.error_reply(tostring(r))
    end
    out[i] = r
    ki, ai = ki + nk, ai + na
  end
  return out
end
return decide(KEYS, ARGV, {now = clock(ARGV[1]), defs = {}, trimmed = {}, trim = TRIM})
