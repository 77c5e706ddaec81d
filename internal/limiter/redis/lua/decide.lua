-- Decide: decides several limiters together, all or nothing, at the
-- server's time (or at ARGV[1] microseconds, in tests; empty otherwise).
-- Limiter j (from 1) is defined in KEYS[2j-1], its state is KEYS[2j], and
-- ARGV[2+j] permits are asked of it. When every limiter has room for what
-- is asked of it and ARGV[2] is 'take', all of them are recorded; otherwise
-- nothing is (grants that have left a sliding log's window are forgotten,
-- which changes no answer).
--
-- Reply: {0, j} when limiter j is not defined, otherwise 1 followed by
-- eight fields per limiter: fits, remaining, limit, retry_us, retry_ns,
-- reset_us, reset_ns, exceeds_capacity, durations as microseconds plus
-- nanoseconds. remaining and reset are after the grant when one was made,
-- as the limiter stands otherwise.

local FIELDS = {'algorithm', 'limit', 'burst', 'm', 'pa', 'pb', 'ta', 'tb', 'pw', 'pr', 'pu', 'maxe'}

local count = #KEYS / 2
local defs = {}
for j = 1, count do
  local d = redis.call('HMGET', KEYS[2 * j - 1], unpack(FIELDS))
  if not d[1] then
    return {0, j}
  end
  defs[j] = d
end
local now = clock(ARGV[1])
local take = ARGV[2] == 'take'

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
    c.rem = w.limit - c.used
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

-- Then, when all of them fit, every grant is recorded.
local granted = all and take
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
return r
