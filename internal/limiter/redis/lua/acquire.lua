-- Acquire: takes, in order, ARGV[2], ARGV[3], … permits from the limiter
-- defined in KEYS[1] whose state is KEYS[2], each all or nothing and
-- decided as if alone, one after the other, at the server's time (or at
-- ARGV[1] microseconds, in tests; empty otherwise).
--
-- Reply: {0} when the limiter is not defined, {-2} when it is keyed
-- (its keys have their own scripts), otherwise 1 followed by
-- eight fields per acquisition: allowed, remaining, limit, retry_us,
-- retry_ns, reset_us, reset_ns, exceeds_capacity, durations as
-- microseconds plus nanoseconds.

-- gcra_decide decides taking n permits when the TAT lies (ba, bb) after
-- now, with rem permits left then, and appends the decision's fields to r.
-- It returns the TAT's distance from now and the permits left afterwards,
-- and whether anything was taken. A grant adds exactly n periods to the
-- backlog, so it leaves exactly rem - n permits: no division needed.
local function gcra_decide(g, r, ba, bb, rem, n)
  local k = #r
  if n > g.burst then
    local ra, rn = gcra_duration(g, ba, bb)
    r[k + 1], r[k + 2], r[k + 3], r[k + 4] = 0, rem, g.limit, 0
    r[k + 5], r[k + 6], r[k + 7], r[k + 8] = 0, ra, rn, 1
    return ba, bb, rem, false
  end
  local aa, ab, wa, wn = gcra_fit(g, ba, bb, n)
  if wa then
    local ra, rn = gcra_duration(g, ba, bb)
    r[k + 1], r[k + 2], r[k + 3], r[k + 4] = 0, rem, g.limit, wa
    r[k + 5], r[k + 6], r[k + 7], r[k + 8] = wn, ra, rn, 0
    return ba, bb, rem, false
  end
  local ra, rn = gcra_duration(g, aa, ab)
  r[k + 1], r[k + 2], r[k + 3], r[k + 4] = 1, rem - n, g.limit, 0
  r[k + 5], r[k + 6], r[k + 7], r[k + 8] = 0, ra, rn, 0
  return aa, ab, rem - n, true
end

local function gcra_acquire(g, key, now)
  local ba, bb = gcra_backlog(key, now)
  local rem = gcra_remaining(g, ba, bb)
  local r, taken = {1}, false
  for i = 2, #ARGV do
    local took
    ba, bb, rem, took = gcra_decide(g, r, ba, bb, rem, tonumber(ARGV[i]))
    taken = taken or took
  end
  if taken then
    -- The bucket is full again at the new TAT: the key expires then.
    local ra, rn = gcra_duration(g, ba, bb)
    redis.call('SET', key, gcra_state(now + ba, bb), 'PXAT', fmt(expiry_ms(now + ra, rn)))
  end
  return r
end

-- log_decide decides taking n permits from the sliding log at key and
-- appends the decision's fields to r.
local function log_decide(w, key, now, n, r)
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
  local k = #r
  r[k + 1], r[k + 2], r[k + 3], r[k + 4] = allowed, log_remaining(w, used), w.limit, wa
  r[k + 5], r[k + 6], r[k + 7], r[k + 8] = wn, ra, rn, exceeds
end

local function log_acquire(w, key, now)
  local r = {1}
  for i = 2, #ARGV do
    log_decide(w, key, now, tonumber(ARGV[i]), r)
  end
  return r
end

local d = redis.call('HMGET', KEYS[1], 'algorithm', 'limit', 'burst', 'm', 'pa', 'pb', 'ta', 'tb', 'pw', 'pr', 'pu', 'maxe', 'maxkeys')
if not d[1] then
  return {0}
end
if d[13] then
  return {-2}
end
local now = clock(ARGV[1])
if d[1] == 'gcra' then
  return gcra_acquire(gcra_def(d), KEYS[2], now)
end
return log_acquire(log_def(d), KEYS[2], now)
