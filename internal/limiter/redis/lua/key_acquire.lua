-- Acquire: takes ARGV[5] permits from the key ARGV[2] of a table (see
-- table.lua for the arguments), all or nothing, at the server's time, and
-- keeps its shard's index and, for a sliding log, expiry index up to date
-- in the same step. The decision is the limiter Store's, line for line.
--
-- A key the index does not hold is granted only if its shard has room for
-- it (see gcra_room and log_room); otherwise it is denied with full set,
-- Remaining 0, and RetryAfter and ResetAfter both the time until room can
-- be made.
--
-- Reply: {allowed, remaining, limit, retry_us, retry_ns, reset_us, reset_ns,
-- exceeds_capacity, full}, durations as microseconds plus nanoseconds; or
-- table_open's reply for a keyed limiter it cannot use.

local function keys_full(limit, wait)
  return {0, 0, limit, wait[1], wait[2], wait[1], wait[2], 0, 1}
end

local function key_gcra_acquire(g, idx, base, key, now, n, max)
  gcra_trim(idx, now)
  local st = base .. key
  local ba, bb, old = key_gcra_read(st, idx, key, now)
  if n > g.burst then
    local ra, rn = gcra_duration(g, ba, bb)
    return {0, gcra_remaining(g, ba, bb), g.limit, 0, 0, ra, rn, 1, 0}
  end
  local aa, ab, wa, wn = gcra_fit(g, ba, bb, n)
  if wa then
    local ra, rn = gcra_duration(g, ba, bb)
    return {0, gcra_remaining(g, ba, bb), g.limit, wa, wn, ra, rn, 0, 0}
  end
  if not old then
    local wait = gcra_room(g, idx, base, now, max, true)
    if wait then
      return keys_full(g.limit, wait)
    end
  end
  -- The bucket is full again at the new TAT: the key expires then.
  local ra, rn = gcra_duration(g, aa, ab)
  key_gcra_write(st, idx, key, now, aa, ab, ra, rn, old)
  return {1, gcra_remaining(g, aa, ab), g.limit, 0, 0, ra, rn, 0, 0}
end

local function key_log_acquire(w, idx, exp, base, key, now, n, max)
  log_trim(idx, exp, now)
  local st = base .. key
  local c = key_log_read(w, st, idx, exp, key, now)
  local allowed, exceeds, wa, wn = 0, 0, 0, 0
  if n > w.limit then
    exceeds = 1
  elseif c.used + n > w.limit then
    local e = redis.call('ZRANGEBYSCORE', st, fmt(c.base + c.used + n - w.limit), '+inf', 'LIMIT', 0, 1)
    wa, wn = log_until(w, tonumber(e[1]), now)
  else
    if not c.old then
      local wait = log_room(w, idx, exp, base, now, max, true)
      if wait then
        return keys_full(w.limit, wait)
      end
    end
    allowed = 1
    key_log_write(w, st, idx, exp, key, now, n, c)
  end
  local ra, rn = 0, 0
  if c.member then
    ra, rn = log_until(w, c.last_at, now)
  end
  return {allowed, w.limit - c.used, w.limit, wa, wn, ra, rn, exceeds, 0}
end

local d, base, max = table_open()
if not d then
  return base
end
local n, now = tonumber(ARGV[5]), clock(ARGV[3])
if d[1] == 'gcra' then
  return key_gcra_acquire(gcra_def(d), KEYS[1], base, ARGV[2], now, n, max)
end
return key_log_acquire(log_def(d), KEYS[1], KEYS[2], base, ARGV[2], now, n, max)
