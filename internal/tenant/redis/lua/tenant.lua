-- Per-IP tenants: what acquire.lua, available.lua and lowest.lua share. It
-- follows the limiter library (lib.lua of the limiter Store), whose
-- arithmetic it uses unchanged, and precedes each script's own code.
--
-- Every script gets the policy as ARGV[1] to ARGV[12], the array the
-- library's gcra_def and log_def read. A tenant is named by the 16 hex
-- digits of its 64-bit key ("hex"), which Lua never turns into a number: a
-- double holds 53 bits.
--
-- A shard's index is a sorted set ordered so that ascending order (score,
-- then member bytes) is Lowest's order:
--   GCRA         score -tat_us, member pad12(R_MAX - tat_r) .. hex: the
--                latest TAT first, then the smallest key. The member holds
--                the whole TAT with the score, so the order is exact.
--   sliding log  score -bound, member pad16(AT_MAX - at) .. hex, where at
--                is the tenant's newest grant (µs) and bound at least the
--                permits its log holds: what it held just after that grant,
--                lowered by Lowest to what it held when Lowest read it (a
--                log only loses permits until its next grant). A second
--                set, the expiry index, holds the same members scored by
--                at + pu, the instant the log is empty, to trim them.

local R_MAX = 999999999999 -- GCRA remainders are below 1000 * MaxLimit = 10^12
local AT_MAX = 9007199254740992 -- 2^53 µs, in the year 2255
local TRIM = 16 -- expired index members an operation removes at most

local function tenant_def()
  local d = {}
  for i = 1, 12 do
    d[i] = ARGV[i]
  end
  return d
end

local function gcra_member(tat_r, hex)
  return string.format('%012.0f', R_MAX - tat_r) .. hex
end

local function log_member(at, hex)
  return string.format('%016.0f', AT_MAX - at) .. hex
end

-- zrem removes members from key, in chunks that unpack can pass.
local function zrem(key, members)
  for i = 1, #members, 256 do
    redis.call('ZREM', key, unpack(members, i, math.min(i + 255, #members)))
  end
end

-- extend makes key live at least until the instant ms (PEXPIREAT) and never
-- shortens its life: an index expires when its last tenant is full again.
-- PEXPIRETIME is -1 for a key without expiry, such as one just created.
local function extend(key, ms)
  if redis.call('PEXPIRETIME', key) < ms then
    redis.call('PEXPIREAT', key, fmt(ms))
  end
end

-- gcra_trim removes up to TRIM members whose TAT is before now: their
-- buckets are full. Each acquisition adds at most one member and trims up
-- to TRIM, so expired members cannot pile up in a shard that is in use.
local function gcra_trim(idx, now)
  local old = redis.call('ZRANGE', idx, '(' .. fmt(-now), '+inf', 'BYSCORE', 'LIMIT', 0, TRIM)
  if #old > 0 then
    zrem(idx, old)
  end
end

-- log_trim removes up to TRIM members whose log is empty at now.
local function log_trim(idx, exp, now)
  local old = redis.call('ZRANGE', exp, '-inf', fmt(now), 'BYSCORE', 'LIMIT', 0, TRIM)
  if #old > 0 then
    zrem(idx, old)
    zrem(exp, old)
  end
end

-- Room. A shard holds at most `max` tenants, its index's members (the Go
-- side passes the bound of tenant.Config divided among the shards). A
-- tenant the index does not hold takes a member only if there is room, made
-- as tenant.Config.MaxTenants describes: the tenant evicted first (the last
-- index member under GCRA: the earliest TAT, then the largest key; the
-- first of the expiry index under the sliding log: the log that empties
-- first, then the largest key) is evicted if it has a permit left. Each
-- returns nil when there is room (having evicted that tenant if `evict`),
-- or, when that tenant is limited, how long until it regains one permit:
-- {µs, ns}. With `evict` false they write nothing, for available.lua.

local function gcra_room(g, idx, base, now, max, evict)
  if redis.call('ZCARD', idx) < max then
    return nil
  end
  local v = redis.call('ZRANGE', idx, -1, -1, 'WITHSCORES')
  local m = v[1]
  local tat_us, tat_r = -tonumber(v[2]), R_MAX - tonumber(string.sub(m, 1, 12))
  local ba, bb = 0, 0
  if tat_us > now or tat_us == now and tat_r > 0 then
    ba, bb = tat_us - now, tat_r
  end
  if gcra_remaining(g, ba, bb) >= 1 then
    if evict then
      redis.call('ZREM', idx, m)
      redis.call('DEL', base .. string.sub(m, 13))
    end
    return nil
  end
  -- The wait for one permit, as an acquisition of one would be told.
  local ca, cb = gcra_cost(g, 1)
  local aa, ab = ba + ca, bb + cb
  if ab >= g.m then
    aa, ab = aa + 1, ab - g.m
  end
  local xa, xb = aa - g.ta, ab - g.tb
  if xb < 0 then
    xa, xb = xa - 1, xb + g.m
  end
  return {gcra_duration(g, xa, xb)}
end

local function log_room(w, idx, exp, base, now, max, evict)
  if redis.call('ZCARD', idx) < max then
    return nil
  end
  local first = redis.call('ZRANGE', exp, 0, 0, 'WITHSCORES')
  local m = redis.call('ZRANGE', exp, first[2], first[2], 'BYSCORE', 'REV', 'LIMIT', 0, 1)[1]
  local key = base .. string.sub(m, 17)
  local l = log_read(key, w, now)
  local used = 0
  if l.member then
    used = l.total - l.base
  end
  if used < w.limit then
    if evict then
      redis.call('DEL', key)
      redis.call('ZREM', idx, m)
      redis.call('ZREM', exp, m)
    end
    return nil
  end
  local e = redis.call('ZRANGEBYSCORE', key, fmt(l.base + used + 1 - w.limit), '+inf', 'LIMIT', 0, 1)
  return {log_until(w, tonumber(e[1]), now)}
end
