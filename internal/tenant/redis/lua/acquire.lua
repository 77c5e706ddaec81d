-- Acquire: takes ARGV[13] permits from the tenant ARGV[14] (hex) whose
-- state is KEYS[1], all or nothing, at the server's time (or at ARGV[15]
-- microseconds, in tests), and keeps its shard's index (KEYS[2]) and, for a
-- sliding log, expiry index (KEYS[3]) up to date in the same step. The
-- decision is the limiter Store's, line for line.
--
-- A tenant the index does not hold is granted only if its shard has room
-- for it (ARGV[16] tenants at most, see gcra_room and log_room); otherwise
-- it is denied with registry_full set, Remaining 0, and RetryAfter and
-- ResetAfter both the time until room can be made.
--
-- Reply: {allowed, remaining, limit, retry_us, retry_ns, reset_us, reset_ns,
-- exceeds_capacity, registry_full}, durations as microseconds plus
-- nanoseconds.

local function registry_full(limit, wait)
  return {0, 0, limit, wait[1], wait[2], wait[1], wait[2], 0, 1}
end

local function tenant_gcra_acquire(g, key, idx, base, hex, now, n, max)
  gcra_trim(idx, now)
  local ba, bb, old = 0, 0, nil
  local st = redis.call('GET', key)
  if st then
    local sp = string.find(st, ' ', 1, true)
    local tat_us, tat_r = tonumber(string.sub(st, 1, sp - 1)), tonumber(string.sub(st, sp + 1))
    old = gcra_member(tat_r, hex)
    if tat_us > now or tat_us == now and tat_r > 0 then
      ba, bb = tat_us - now, tat_r
    end
  end
  if n > g.burst then
    local ra, rn = gcra_duration(g, ba, bb)
    return {0, gcra_remaining(g, ba, bb), g.limit, 0, 0, ra, rn, 1, 0}
  end
  local aa, ab, wa, wn = gcra_fit(g, ba, bb, n)
  if wa then
    local ra, rn = gcra_duration(g, ba, bb)
    return {0, gcra_remaining(g, ba, bb), g.limit, wa, wn, ra, rn, 0, 0}
  end
  if old and ba == 0 and bb == 0 then
    -- A full bucket is a tenant forgotten: it needs room like a newcomer.
    redis.call('ZREM', idx, old)
    old = nil
  end
  if not old then
    local wait = gcra_room(g, idx, base, now, max, true)
    if wait then
      return registry_full(g.limit, wait)
    end
  end
  local ra, rn = gcra_duration(g, aa, ab)
  -- The bucket is full again at the new TAT: the key expires then.
  local e = expiry_ms(now + ra, rn)
  redis.call('SET', key, fmt(now + aa) .. ' ' .. fmt(ab), 'PXAT', fmt(e))
  if old then
    redis.call('ZREM', idx, old)
  end
  redis.call('ZADD', idx, fmt(-(now + aa)), gcra_member(ab, hex))
  extend(idx, e)
  return {1, gcra_remaining(g, aa, ab), g.limit, 0, 0, ra, rn, 0, 0}
end

local function tenant_log_acquire(w, key, idx, exp, base_key, hex, now, n, max)
  log_trim(idx, exp, now)
  local l = log_read(key, w, now)
  local last_at = l.at
  -- The tenant's index member, named after its newest grant.
  local old
  if l.member then
    old = log_member(last_at, hex)
  end
  local member, base, size, last_total, emptied = log_forget(key, l)
  if emptied then
    -- Every grant has left the window: out of the index too.
    redis.call('ZREM', idx, old)
    redis.call('ZREM', exp, old)
    old = nil
  end
  local used = last_total - base
  local allowed, exceeds, wa, wn = 0, 0, 0, 0
  if n > w.limit then
    exceeds = 1
  elseif used + n > w.limit then
    local e = redis.call('ZRANGEBYSCORE', key, fmt(base + used + n - w.limit), '+inf', 'LIMIT', 0, 1)
    wa, wn = log_until(w, tonumber(e[1]), now)
  else
    if not old then
      local wait = log_room(w, idx, exp, base_key, now, max, true)
      if wait then
        return registry_full(w.limit, wait)
      end
    end
    allowed = 1
    base, member, last_at = log_take(key, w, n, now, base, member, last_at, last_total, size)
    used = used + n
    local e = expiry_ms(last_at + w.pw, w.pr)
    redis.call('PEXPIREAT', key, fmt(e))
    -- The log holds `used` permits now and only loses them until its next
    -- grant: that is its bound in the index.
    local m = log_member(last_at, hex)
    if old and old ~= m then
      redis.call('ZREM', idx, old)
      redis.call('ZREM', exp, old)
    end
    redis.call('ZADD', idx, fmt(-used), m)
    redis.call('ZADD', exp, fmt(last_at + w.pu), m)
    extend(idx, e)
    extend(exp, e)
  end
  local ra, rn = 0, 0
  if member then
    ra, rn = log_until(w, last_at, now)
  end
  return {allowed, w.limit - used, w.limit, wa, wn, ra, rn, exceeds, 0}
end

local d = tenant_def()
local n = tonumber(ARGV[13])
local now = clock(ARGV[15])
local max = tonumber(ARGV[16])
-- The state key of a tenant is its shard's base followed by its hex.
local base = string.sub(KEYS[1], 1, #KEYS[1] - 16)
if d[1] == 'gcra' then
  return tenant_gcra_acquire(gcra_def(d), KEYS[1], KEYS[2], base, ARGV[14], now, n, max)
end
return tenant_log_acquire(log_def(d), KEYS[1], KEYS[2], KEYS[3], base, ARGV[14], now, n, max)
