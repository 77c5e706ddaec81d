-- Acquire: takes ARGV[1] permits from the limiter defined in KEYS[1] whose
-- state is KEYS[2], all or nothing, at the server's time (or at ARGV[2]
-- microseconds, in tests).
--
-- Reply: {0} when the limiter is not defined, otherwise
-- {1, allowed, remaining, limit, retry_us, retry_ns, reset_us, reset_ns,
-- exceeds_capacity}, durations as microseconds plus nanoseconds.

local function gcra_acquire(g, key, now, n)
  local ba, bb = gcra_backlog(key, now)
  if n > g.burst then
    local ra, rn = gcra_duration(g, ba, bb)
    return {1, 0, gcra_remaining(g, ba, bb), g.limit, 0, 0, ra, rn, 1}
  end
  local ca, cb = gcra_cost(g, n)
  local aa, ab = ba + ca, bb + cb
  if ab >= g.m then
    aa, ab = aa + 1, ab - g.m
  end
  if cmp2(aa, ab, g.ta, g.tb) > 0 then
    local xa, xb = aa - g.ta, ab - g.tb
    if xb < 0 then
      xa, xb = xa - 1, xb + g.m
    end
    local wa, wn = gcra_duration(g, xa, xb)
    local ra, rn = gcra_duration(g, ba, bb)
    return {1, 0, gcra_remaining(g, ba, bb), g.limit, wa, wn, ra, rn, 0}
  end
  local ra, rn = gcra_duration(g, aa, ab)
  -- The bucket is full again at the new TAT: the key expires then.
  redis.call('SET', key, fmt(now + aa) .. ' ' .. fmt(ab), 'PXAT', fmt(expiry_ms(now + ra, rn)))
  return {1, 1, gcra_remaining(g, aa, ab), g.limit, 0, 0, ra, rn, 0}
end

local function log_acquire(w, key, now, n)
  local l = log_read(key, w, now)
  local last_at = l.at
  local member, base, size, last_total = log_forget(key, l)
  local used = last_total - base
  local allowed, exceeds, wa, wn = 0, 0, 0, 0
  if n > w.limit then
    exceeds = 1
  elseif used + n > w.limit then
    -- The oldest entry whose running total covers the excess: when it
    -- leaves the window, n permits fit.
    local e = redis.call('ZRANGEBYSCORE', key, fmt(base + used + n - w.limit), '+inf', 'LIMIT', 0, 1)
    wa, wn = log_until(w, tonumber(e[1]), now)
  else
    allowed = 1
    base, member, last_at = log_take(key, w, n, now, base, member, last_at, last_total, size)
    used = used + n
    -- The log is empty again when its newest grant leaves the window.
    redis.call('PEXPIREAT', key, fmt(expiry_ms(last_at + w.pw, w.pr)))
  end
  local ra, rn = 0, 0
  if member then
    ra, rn = log_until(w, last_at, now)
  end
  return {1, allowed, w.limit - used, w.limit, wa, wn, ra, rn, exceeds}
end

local d = redis.call('HMGET', KEYS[1], 'algorithm', 'limit', 'burst', 'm', 'pa', 'pb', 'ta', 'tb', 'pw', 'pr', 'pu', 'maxe')
if not d[1] then
  return {0}
end
local n = tonumber(ARGV[1])
local now = clock(ARGV[2])
if d[1] == 'gcra' then
  return gcra_acquire(gcra_def(d), KEYS[2], now, n)
end
return log_acquire(log_def(d), KEYS[2], now, n)
