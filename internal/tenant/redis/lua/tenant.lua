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
