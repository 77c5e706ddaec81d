-- Tables of keys: what key_acquire.lua, key_available.lua and
-- key_lowest.lua share with decide.lua. It follows the limiter library
-- (lib.lua), whose arithmetic it uses unchanged, and precedes each
-- script's own code.
--
-- A table holds one bucket per key under one policy: the per-IP tenants
-- (16 shards, the policy given by the service) and each keyed limiter (one
-- shard in its own slot, the policy read from its definition). A shard is
-- an index, an expiry index (sliding log only) and one state key per key,
-- all in one Cluster slot; a key's state is the shard's base followed by
-- the key, which is any byte string without control characters (a tenant's
-- is its 64-bit key as 16 hex digits, which Lua never turns into a number:
-- a double holds 53 bits).
--
-- The table scripts take:
--   KEYS[1]  the index          KEYS[2]  the expiry index
--   KEYS[3]  a keyed limiter's definition (see table_open); none for tenants
--   ARGV[1]  the shard's base   ARGV[2]  the key ('' for Lowest)
--   ARGV[3]  the instant in µs, or '' for the server's time
--   ARGV[4]  the most keys the shard holds ('' for a keyed limiter)
--   ARGV[5]  permits (acquire) or k (Lowest)
--   ARGV[6]  Lowest's budget    ARGV[7]  the generation Lowest expects
--   ARGV[8] to ARGV[19]  the policy, as gcra_def and log_def read it,
--   when there is no definition
--
-- A shard's index is a sorted set ordered so that ascending order (score,
-- then member bytes) is Lowest's order:
--   GCRA         score -tat_us, member pad12(R_MAX - tat_r) .. key: the
--                latest TAT first, then the smallest key. The member holds
--                the whole TAT with the score, so the order is exact.
--   sliding log  score -bound, member pad16(AT_MAX - at) .. key, where at
--                is the key's newest grant (µs) and bound at least the
--                permits its log holds: what it held just after that grant,
--                lowered by Lowest to what it held when Lowest read it (a
--                log only loses permits until its next grant). A second
--                set, the expiry index, holds the same members scored by
--                at + pu, the instant the log is empty, to trim them.

local R_MAX = 999999999999 -- GCRA remainders are below 1000 * MaxLimit = 10^12
local AT_MAX = 9007199254740992 -- 2^53 µs, in the year 2255
local TRIM = 16 -- expired index members an operation removes at most

-- DEF_FIELDS are the fields of a definition hash the scripts read, in the
-- order of gcra_def and log_def, then a keyed limiter's bound of keys and
-- generation.
local DEF_FIELDS = {'algorithm', 'limit', 'burst', 'm', 'pa', 'pb', 'ta', 'tb', 'pw', 'pr', 'pu', 'maxe', 'maxkeys', 'gen'}

-- key_base is where the states of a keyed limiter's keys start: its
-- definition's key, less 'def', then 's', its generation and ':'. A
-- definition replaced by another policy gets a new generation, so its
-- keys start afresh; the states of the old one expire on their own.
local function key_base(def_key, gen)
  return string.sub(def_key, 1, #def_key - 3) .. 's' .. gen .. ':'
end

-- table_open reads a table script's arguments: the policy d, the state
-- base, the most keys the shard holds and the generation ('' for tenants).
-- It returns nil and a reply when a keyed limiter's definition is missing
-- ({-1}), not keyed ({-2}) or not of the generation expected ({-3}).
local function table_open()
  if KEYS[3] then
    local d = redis.call('HMGET', KEYS[3], unpack(DEF_FIELDS))
    if not d[1] then
      return nil, {-1}
    end
    if not d[13] then
      return nil, {-2}
    end
    if ARGV[7] ~= '' and d[14] ~= ARGV[7] then
      return nil, {-3}
    end
    return d, key_base(KEYS[3], d[14]), tonumber(d[13]), d[14]
  end
  local d = {}
  for i = 1, 12 do
    d[i] = ARGV[7 + i]
  end
  return d, ARGV[1], tonumber(ARGV[4]), ''
end

local GCRA_MEMBER_FMT = '%012' .. INT
local LOG_MEMBER_FMT = '%016' .. INT

local function gcra_member(tat_r, key)
  return string.format(GCRA_MEMBER_FMT, R_MAX - tat_r) .. key
end

local function log_member(at, key)
  return string.format(LOG_MEMBER_FMT, AT_MAX - at) .. key
end

-- key_less compares keys byte by byte: Lua compares strings by the
-- server's locale.
local function key_less(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- zrem removes members from key, in chunks that unpack can pass.
local function zrem(key, members)
  for i = 1, #members, 256 do
    redis.call('ZREM', key, unpack(members, i, math.min(i + 255, #members)))
  end
end

-- extend makes key live at least until the instant ms (PEXPIREAT) and never
-- shortens its life: an index expires when its last key is full again.
-- PEXPIRETIME is -1 for a key without expiry, such as one just created.
local function extend(key, ms)
  if redis.call('PEXPIRETIME', key) < ms then
    redis.call('PEXPIREAT', key, fmt(ms))
  end
end

-- gcra_trim removes up to limit (TRIM when nil) members whose TAT is
-- before now: their buckets are full. Each acquisition adds at most one
-- member and trims up to TRIM, so expired members cannot pile up in a
-- shard that is in use.
local function gcra_trim(idx, now, limit)
  local old = redis.call('ZRANGE', idx, '(' .. fmt(-now), '+inf', 'BYSCORE', 'LIMIT', 0, limit or TRIM)
  if #old > 0 then
    zrem(idx, old)
  end
end

-- log_trim removes up to limit (TRIM when nil) members whose log is empty
-- at now.
local function log_trim(idx, exp, now, limit)
  local old = redis.call('ZRANGE', exp, '-inf', fmt(now), 'BYSCORE', 'LIMIT', 0, limit or TRIM)
  if #old > 0 then
    zrem(idx, old)
    zrem(exp, old)
  end
end

-- Room. A shard holds at most `max` keys, its index's members. A key the
-- index does not hold takes a member only if there is room, made as
-- memory.Keys describes: the key evicted first (the last index member
-- under GCRA: the earliest TAT, then the largest key; the first of the
-- expiry index under the sliding log: the log that empties first, then the
-- largest key) is evicted if it has a permit left. Each returns nil when
-- there is room (having evicted that key if `evict`), or, when that key is
-- limited, how long until it regains one permit: {µs, ns}. With `evict`
-- false they write nothing, for key_available.lua.

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

-- key_gcra_read reads the bucket of key, whose state is st, at now: its
-- backlog (ba, bb) and its index member, or nil when the index does not
-- hold it. A full bucket is a key forgotten: its member is removed, and it
-- needs room like a newcomer.
local function key_gcra_read(st, idx, key, now)
  local v = redis.call('GET', st)
  if not v then
    return 0, 0, nil
  end
  local sp = string.find(v, ' ', 1, true)
  local tat_us, tat_r = tonumber(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1))
  local old = gcra_member(tat_r, key)
  if tat_us > now or tat_us == now and tat_r > 0 then
    return tat_us - now, tat_r, old
  end
  redis.call('ZREM', idx, old)
  return 0, 0, nil
end

-- key_gcra_write records that the TAT of key lies (aa, ab) after now, the
-- bucket full again (ra, rn) after now, and moves its index member from
-- old (nil for a newcomer).
local function key_gcra_write(st, idx, key, now, aa, ab, ra, rn, old)
  local e = expiry_ms(now + ra, rn)
  redis.call('SET', st, gcra_state(now + aa, ab), 'PXAT', fmt(e))
  if old then
    redis.call('ZREM', idx, old)
  end
  redis.call('ZADD', idx, fmt(-(now + aa)), gcra_member(ab, key))
  extend(idx, e)
end

-- key_log_read reads the sliding log of key, whose state is st, at now, as
-- log_read and log_forget do, into a table: member, base, size, last_total
-- and last_at as log_take takes them, used, and old, the key's index
-- member or nil when the index does not hold it (an emptied log leaves the
-- index).
local function key_log_read(w, st, idx, exp, key, now)
  local l = log_read(st, w, now)
  local c = {last_at = l.at}
  if l.member then
    c.old = log_member(l.at, key)
  end
  local emptied
  c.member, c.base, c.size, c.last_total, emptied = log_forget(st, l)
  if emptied then
    redis.call('ZREM', idx, c.old)
    redis.call('ZREM', exp, c.old)
    c.old = nil
  end
  c.used = c.last_total - c.base
  return c
end

-- key_log_write records a grant of n permits at now in the log c of key
-- (see key_log_read), and its bound in the index: the log holds c.used
-- permits afterwards and only loses them until its next grant.
local function key_log_write(w, st, idx, exp, key, now, n, c)
  local _
  _, c.member, c.last_at = log_take(st, w, n, now, c.base, c.member, c.last_at, c.last_total, c.size)
  c.used = c.used + n
  local e = expiry_ms(c.last_at + w.pw, w.pr)
  redis.call('PEXPIREAT', st, fmt(e))
  local m = log_member(c.last_at, key)
  if c.old and c.old ~= m then
    redis.call('ZREM', idx, c.old)
    redis.call('ZREM', exp, c.old)
  end
  redis.call('ZADD', idx, fmt(-c.used), m)
  redis.call('ZADD', exp, fmt(c.last_at + w.pu), m)
  extend(idx, e)
  extend(exp, e)
end
