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
-- is granted also records the reservation: "name=permits ..." of each
-- limiter; its reply ends with the reservation's ID, ARGV[6+2n] to
-- ARGV[9+2n], four 32-bit numbers, which a replay gives back. 'settle' charges or refunds each limiter the difference between
-- ARGV[2+j], what was spent, and what the reservation holds of it, then
-- deletes the reservation: {-2} when there is none, {-3, j} when it holds
-- nothing of limiter j, and nothing changes then.
--
-- Reply: {0, j} when limiter j is not defined, otherwise 1 followed by
-- eight fields per limiter: fits, remaining, limit, retry_us, retry_ns,
-- reset_us, reset_ns, exceeds_capacity, durations as microseconds plus
-- nanoseconds. remaining and reset are after the grant when one was made,
-- as the limiter stands otherwise.

-- A charge never puts a bucket more than MaxPeriod (366 days) of refill in
-- debt, nor a sliding log more than MaxLogDebt permits past its limit, as
-- the Go code caps them.
local MAX_DEBT_US = 31622400000000
local MAX_LOG_DEBT = 1000000000

-- gcra_adjust charges or refunds n permits of the bucket at key (or, with
-- mode 'none', reads it), and returns its remaining permits and reset time
-- afterwards.
local function gcra_adjust(g, key, now, n, mode)
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
    if not (g.pa > 0 and n > floor(ba / g.pa) + 1) then
      local ca, cb = gcra_cost(g, n)
      if cmp2(ba, bb, ca, cb) > 0 then
        aa, ab = ba - ca, bb - cb
        if ab < 0 then
          aa, ab = aa - 1, ab + g.m
        end
      end
    end
  end
  local ra, rn = gcra_duration(g, aa, ab)
  if aa == 0 and ab == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, fmt(now + aa) .. ' ' .. fmt(ab), 'PXAT', fmt(expiry_ms(now + ra, rn)))
  end
  return gcra_remaining(g, aa, ab), ra, rn
end

-- log_adjust charges or refunds n permits of the sliding log at key (or,
-- with mode 'none', reads it), and returns its remaining permits and reset
-- time afterwards. A refund gives
-- back the newest grants first: every entry above the running total
-- last_total - n goes, and the oldest of them stays with what it keeps.
local function log_adjust(w, key, now, n, mode)
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

-- adjust charges, refunds or reads limiter j as modes[j] says, by ns[j]
-- permits, every one of them unconditionally.
local function adjust(defs, now, modes, ns)
  local r = {1}
  for j = 1, #defs do
    local key, d = KEYS[2 * j], defs[j]
    local rem, ra, rn, limit
    if d[1] == 'gcra' then
      local g = gcra_def(d)
      rem, ra, rn = gcra_adjust(g, key, now, ns[j], modes[j])
      limit = g.limit
    else
      local w = log_def(d)
      rem, ra, rn = log_adjust(w, key, now, ns[j], modes[j])
      limit = w.limit
    end
    local k = #r
    r[k + 1], r[k + 2], r[k + 3], r[k + 4] = 1, rem, limit, 0
    r[k + 5], r[k + 6], r[k + 7], r[k + 8] = 0, ra, rn, 0
  end
  return r
end

local FIELDS = {'algorithm', 'limit', 'burst', 'm', 'pa', 'pb', 'ta', 'tb', 'pw', 'pr', 'pu', 'maxe'}

local count = (#KEYS - 2) / 2
local once, rsv = KEYS[2 * count + 1], KEYS[2 * count + 2]
local fingerprint, rsv_ttl = ARGV[3 + count], ARGV[5 + count]
if fingerprint ~= '' then
  local rec = redis.call('GET', once)
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

-- remember records reply r under the idempotency key, if there is one.
local function remember(r)
  if fingerprint ~= '' then
    local fs = {}
    for i = 1, #r do
      fs[i] = fmt(r[i])
    end
    redis.call('SET', once, fingerprint .. '\n' .. table.concat(fs, ' '), 'PX', ARGV[4 + count])
  end
  return r
end

local mode = ARGV[2]
local held = {}
if mode == 'settle' then
  local rec = redis.call('GET', rsv)
  if not rec then
    return {-2}
  end
  for name, n in string.gmatch(rec, '([^ =]+)=(%d+)') do
    held[name] = tonumber(n)
  end
  for j = 1, count do
    if not held[ARGV[5 + count + j]] then
      return {-3, j}
    end
  end
end

local defs = {}
for j = 1, count do
  local d = redis.call('HMGET', KEYS[2 * j - 1], unpack(FIELDS))
  if not d[1] then
    return {0, j}
  end
  defs[j] = d
end
local now = clock(ARGV[1])
if mode == 'charge' or mode == 'refund' or mode == 'settle' then
  local modes, ns = {}, {}
  for j = 1, count do
    local n = tonumber(ARGV[2 + j])
    if mode == 'settle' then
      n = n - held[ARGV[5 + count + j]]
      if n > 0 then
        modes[j], ns[j] = 'charge', n
      elseif n < 0 then
        modes[j], ns[j] = 'refund', -n
      else
        modes[j], ns[j] = 'none', 0
      end
    else
      modes[j], ns[j] = mode, n
    end
  end
  if mode == 'settle' then
    redis.call('DEL', rsv)
  end
  return remember(adjust(defs, now, modes, ns))
end
local take = mode == 'take'

-- First every limiter is read and judged; c holds what a grant needs.
local cs, all = {}, true
for j = 1, count do
  local key, n, d = KEYS[2 * j], tonumber(ARGV[2 + j]), defs[j]
  local c = {n = n, retry_us = 0, retry_ns = 0, exceeds = 0, fits = 0}
  if d[1] == 'gcra' then
    local g = gcra_def(d)
    c.g = g
    c.ba, c.bb = gcra_backlog(key, now)
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
    local w = log_def(d)
    c.w = w
    local l = log_read(key, w, now)
    c.last_at = l.at
    c.member, c.base, c.size, c.last_total = log_forget(key, l)
    c.used = c.last_total - c.base
    c.rem = log_remaining(w, c.used)
    c.limit = w.limit
    if n > w.limit then
      c.exceeds = 1
    elseif c.used + n > w.limit then
      local e = redis.call('ZRANGEBYSCORE', key, fmt(c.base + c.used + n - w.limit), '+inf', 'LIMIT', 0, 1)
      c.retry_us, c.retry_ns = log_until(w, tonumber(e[1]), now)
    else
      c.fits = 1
    end
  end
  all = all and c.fits == 1
  cs[j] = c
end

-- Then, when all of them fit, every grant is recorded, with the
-- reservation when there is one.
local granted = all and take
if granted and rsv_ttl ~= '' then
  local rec = {}
  for j = 1, count do
    rec[j] = ARGV[5 + count + j] .. '=' .. ARGV[2 + j]
  end
  redis.call('SET', rsv, table.concat(rec, ' '), 'PX', rsv_ttl)
end
local r = {1}
for j = 1, count do
  local key, c = KEYS[2 * j], cs[j]
  local rem, ra, rn = c.rem, 0, 0
  if c.g then
    if granted then
      ra, rn = gcra_duration(c.g, c.aa, c.ab)
      redis.call('SET', key, fmt(now + c.aa) .. ' ' .. fmt(c.ab), 'PXAT', fmt(expiry_ms(now + ra, rn)))
      rem = rem - c.n
    else
      ra, rn = gcra_duration(c.g, c.ba, c.bb)
    end
  else
    local member, last_at = c.member, c.last_at
    if granted then
      local _
      _, member, last_at = log_take(key, c.w, c.n, now, c.base, member, last_at, c.last_total, c.size)
      redis.call('PEXPIREAT', key, fmt(expiry_ms(last_at + c.w.pw, c.w.pr)))
      rem = rem - c.n
    end
    if member then
      ra, rn = log_until(c.w, last_at, now)
    end
  end
  local k = #r
  r[k + 1], r[k + 2], r[k + 3], r[k + 4] = c.fits, rem, c.limit, c.retry_us
  r[k + 5], r[k + 6], r[k + 7], r[k + 8] = c.retry_ns, ra, rn, c.exceeds
end
if granted and rsv_ttl ~= '' then
  -- The reservation's ID, as four 32-bit numbers, so that a replay of
  -- this answer names the same reservation.
  for i = 1, 4 do
    r[#r + 1] = tonumber(ARGV[5 + 2 * count + i])
  end
end
return remember(r)
