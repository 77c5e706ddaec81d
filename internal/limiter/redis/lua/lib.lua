-- Shared by acquire.lua and available.lua, which are appended to this file
-- to make one script each (a Redis script cannot load another).
--
-- Lua numbers are IEEE doubles: integers are exact up to 2^53 only, so no
-- intermediate value below ever exceeds 2^53. Every quantity of the
-- algorithms is an integer; none is ever rounded.
--
-- Numbers are passed to redis.call as strings written by fmt: Redis would
-- write a Lua number with "%.14g" and lose digits. Lua's '%d' converts its
-- number to a C long, which is exact for every integer below 2^53 where
-- longs have 64 bits, and takes a fraction of the time of '%.0f'; where
-- they have fewer, INT falls back to '%.0f', which is exact too.

local fmod, floor = math.fmod, math.floor

local INT = string.format('%d', 2 ^ 53) == '9007199254740992' and 'd' or '.0f'
local INT_FMT = '%' .. INT

local function fmt(x)
  return string.format(INT_FMT, x)
end

-- divmod returns a div m and a mod m, for integers 0 <= a < 2^53, m >= 1.
-- fmod is exact, and so is the division of the exact multiple a - r by m.
local function divmod(a, m)
  local r = fmod(a, m)
  return (a - r) / m, r
end

-- muldivmod returns (n*y) div m and (n*y) mod m, exactly, for integers
-- 0 <= n < 2^36 and 0 <= y < m <= 2^40 (n is a permit count, at most
-- MaxLimit + 1 < 2^30). It is Horner's rule over the three 12-bit digits of
-- n: each step adds r*4096 < 2^52 and digit*y < 2^52, and keeps the
-- invariant (digits so far)*y = q*m + r. A product below 2^53 is exact in
-- a double, and rounding never takes one at or above 2^53 below it, so
-- such a product (most policies' costs) is divided at once.
local function muldivmod(n, y, m)
  local p = n * y
  if p < 9007199254740992 then
    return divmod(p, m)
  end
  local d0 = fmod(n, 4096)
  n = (n - d0) / 4096
  local d1 = fmod(n, 4096)
  local d2 = (n - d1) / 4096
  local q, r = divmod(d2 * y, m)
  local dq
  dq, r = divmod(r * 4096 + d1 * y, m)
  q = q * 4096 + dq
  dq, r = divmod(r * 4096 + d0 * y, m)
  return q * 4096 + dq, r
end

-- clock returns the current time in microseconds since the Unix epoch: the
-- server's own clock, or an explicit instant that only tests pass.
local function clock(explicit)
  if explicit and explicit ~= '' then
    return tonumber(explicit)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- expiry_ms converts the instant us microseconds plus ns nanoseconds
-- (0 <= ns <= 1000) after the epoch to milliseconds, rounding up, for
-- PEXPIREAT: a key never expires before the state it holds is obsolete.
-- Expiring at an instant rather than after a span keeps the expiry right
-- when the instant comes from a test rather than from TIME.
local function expiry_ms(us, ns)
  if ns > 0 then
    us = us + 1
  end
  local ms, r = divmod(us, 1000)
  if r > 0 then
    ms = ms + 1
  end
  return ms
end

---------------------------------------------------------------------------
-- GCRA. Quantities are counted in units of 1/limit of a nanosecond, as in
-- the Go implementation, and held as two limbs (a, b) meaning a*M + b with
-- M = 1000*limit units (one microsecond) and 0 <= b < M: a is whole
-- microseconds, b the exact remainder. The definition carries the limbs of
-- the emission interval (pa, pb: period nanoseconds = period units per
-- permit) and of the tolerance (ta, tb: burst * period units), computed
-- with 128-bit arithmetic when the limiter is stored.
--
-- The state is the theoretical arrival time "tat_us tat_r": the instant
-- tat_us microseconds plus tat_r units (0 <= tat_r < M) after the epoch.
---------------------------------------------------------------------------

-- gcra_state writes the state "tat_us tat_r".
local STATE_FMT = INT_FMT .. ' ' .. INT_FMT
local function gcra_state(tat_us, tat_r)
  return string.format(STATE_FMT, tat_us, tat_r)
end

local function gcra_def(d)
  return {
    limit = tonumber(d[2]), burst = tonumber(d[3]), m = tonumber(d[4]),
    pa = tonumber(d[5]), pb = tonumber(d[6]), ta = tonumber(d[7]), tb = tonumber(d[8]),
  }
end

local function cmp2(a1, b1, a2, b2)
  if a1 ~= a2 then
    return a1 < a2 and -1 or 1
  end
  if b1 ~= b2 then
    return b1 < b2 and -1 or 1
  end
  return 0
end

-- gcra_cost is n emission intervals, n*period units.
local function gcra_cost(g, n)
  if n == 1 then
    return g.pa, g.pb
  end
  local q, r = muldivmod(n, g.pb, g.m)
  return n * g.pa + q, r
end

-- gcra_backlog is how far the TAT lies after now, or 0 when the bucket is
-- full (the TAT is not after now).
local function gcra_backlog(key, now)
  local st = redis.call('GET', key)
  if not st then
    return 0, 0
  end
  local sp = string.find(st, ' ', 1, true)
  local tat_us, tat_r = tonumber(string.sub(st, 1, sp - 1)), tonumber(string.sub(st, sp + 1))
  if tat_us < now or tat_us == now and tat_r == 0 then
    return 0, 0
  end
  return tat_us - now, tat_r
end

-- gcra_remaining is floor((tolerance - backlog) / period), or 0 when the
-- backlog reaches the tolerance; it is at most burst, as tolerance = burst
-- periods. A floating-point estimate of the quotient has a relative error of
-- a few 2^-53, under 10^-6 for quotients up to MaxLimit, so it is off by at
-- most one; exact comparisons correct it. The loops never pass burst, so
-- even a corrupt definition cannot keep the server busy.
local function gcra_remaining(g, xa, xb)
  if cmp2(xa, xb, g.ta, g.tb) >= 0 then
    return 0
  end
  local da, db = g.ta - xa, g.tb - xb
  if db < 0 then
    da, db = da - 1, db + g.m
  end
  local q = floor((da * g.m + db) / (g.pa * g.m + g.pb))
  if q > g.burst then
    q = g.burst
  end
  while q > 0 do
    local ca, cb = gcra_cost(g, q)
    if cmp2(ca, cb, da, db) <= 0 then
      break
    end
    q = q - 1
  end
  while q < g.burst do
    local ca, cb = gcra_cost(g, q + 1)
    if cmp2(ca, cb, da, db) > 0 then
      break
    end
    q = q + 1
  end
  return q
end

-- gcra_duration converts a span in units to whole microseconds plus
-- nanoseconds (0..1000), rounding the nanoseconds up like the Go code: a
-- caller told to wait never retries too early.
local function gcra_duration(g, a, b)
  local ns, r = divmod(b, g.limit)
  if r > 0 then
    ns = ns + 1
  end
  return a, ns
end

-- gcra_fit decides whether n permits (1 to burst) fit when the TAT lies
-- (ba, bb) after now. It returns the TAT a grant leaves (aa, ab) and, when
-- that passes the tolerance so that nothing can be taken, the wait until
-- the permits would fit, as microseconds plus nanoseconds.
local function gcra_fit(g, ba, bb, n)
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
    return aa, ab, wa, wn
  end
  return aa, ab
end

---------------------------------------------------------------------------
-- Sliding log. The state is a sorted set: one member per grant instant (its
-- microseconds since the epoch, as a decimal string) scored with the running
-- total of permits granted up to and including it, plus the member "b"
-- scored with the total before the oldest entry. So an entry holds its
-- score minus the previous score, the log holds the newest score minus b,
-- and the oldest grant that must leave the window before n more permits fit
-- is found with one ZRANGEBYSCORE. Removing the oldest entry without moving
-- b merges its permits into the next one, as the Go log merges its two
-- oldest entries when full. The definition carries the period as pw whole
-- microseconds plus pr nanoseconds, pu = ceil(period) in microseconds, and
-- maxe, the most entries a log holds.
---------------------------------------------------------------------------

local BASE = 'b'
local REBASE = 1099511627776 -- 2^40: totals stay far below 2^53
local BATCH = 32

local function log_def(d)
  return {
    limit = tonumber(d[2]), pw = tonumber(d[9]), pr = tonumber(d[10]),
    pu = tonumber(d[11]), maxe = tonumber(d[12]),
  }
end

-- log_remaining is what a log holding used permits could grant: none
-- while a charge has put it in debt.
local function log_remaining(w, used)
  if used >= w.limit then
    return 0
  end
  return w.limit - used
end

-- log_expired reports whether a grant at `at` has left the window
-- (now - period, now].
local function log_expired(w, at, now)
  return now > at and now - at >= w.pu
end

-- log_until is the time from now until the grant at `at` leaves the window,
-- as microseconds plus nanoseconds.
local function log_until(w, at, now)
  if log_expired(w, at, now) then
    return 0, 0
  end
  return at - now + w.pw, w.pr
end

-- log_take records a grant of n permits at now (µs) in the sliding log at
-- key, whose caller checked that they fit. base, member, last_at,
-- last_total and size describe the log as read (member nil when it is
-- empty; size nil when not counted yet); the new base, member and last_at
-- are returned.
local function log_take(key, w, n, now, base, member, last_at, last_total, size)
  if not member then
    redis.call('ZADD', key, 0, BASE, fmt(n), fmt(now))
    return 0, fmt(now), now
  end
  if now <= last_at then
    -- Time never runs backwards inside a log: a grant stamped at or
    -- before the newest entry joins it.
    redis.call('ZINCRBY', key, fmt(n), member)
  else
    if not size then
      size = redis.call('ZCARD', key) - 1
    end
    if size >= w.maxe then
      -- Full: merge the two oldest entries into the later one.
      redis.call('ZREMRANGEBYRANK', key, 1, 1)
    end
    redis.call('ZADD', key, fmt(last_total + n), fmt(now))
    member, last_at = fmt(now), now
  end
  if base >= REBASE then
    local all = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    for i = 1, #all, 2 do
      redis.call('ZADD', key, fmt(tonumber(all[i + 1]) - base), all[i])
    end
  end
  return base, member, last_at
end

-- log_read reads a log as of now: its base, its newest entry, and how many
-- of its oldest entries have left the window. One ZRANGE reads the base and
-- the first BATCH entries, which for most logs is all of them; longer logs
-- take one more call for the newest entry and one per further BATCH of
-- expired entries. It writes nothing. The fields of the result:
--   base     running total after the expired entries (the stored base when
--            none has expired; 0 when there is no log)
--   skipped  number of expired entries, the oldest
--   size     number of entries, expired ones included, when known (nil for
--            a log longer than BATCH)
--   member, at, total  the newest entry's member, instant and running total,
--            or nil when the log is empty
local function log_read(key, w, now)
  local head = redis.call('ZRANGE', key, 0, BATCH, 'WITHSCORES')
  if not head[1] then
    return {base = 0, skipped = 0, size = 0}
  end
  local l = {base = tonumber(head[2]), skipped = 0}
  local whole = #head < 2 * (BATCH + 1)
  if whole then
    l.size = #head / 2 - 1
    if l.size > 0 then
      l.member = head[#head - 1]
      l.total = tonumber(head[#head])
    end
  else
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    l.member, l.total = last[1], tonumber(last[2])
  end
  if l.member then
    l.at = tonumber(l.member)
  end
  local batch, i = head, 3 -- past the base
  while true do
    local n = #batch
    while i < n do
      if not log_expired(w, tonumber(batch[i]), now) then
        return l
      end
      l.skipped = l.skipped + 1
      l.base = tonumber(batch[i + 1])
      i = i + 2
    end
    if whole or n < 2 * BATCH then
      return l
    end
    -- A whole batch has expired: read on from the first entry left.
    batch, i = redis.call('ZRANGE', key, 1 + l.skipped, l.skipped + BATCH, 'WITHSCORES'), 1
  end
end

-- log_forget drops from the log l (as log_read read it at key) the grants
-- that have left the window. It returns the log's member, base, size and
-- last running total afterwards, and whether the log was emptied (its key
-- deleted).
local function log_forget(key, l)
  local member, base, size, last_total = l.member, l.base, l.size, l.total
  local emptied = false
  if l.skipped > 0 then
    if base == last_total then
      -- Every grant has left the window: start afresh.
      redis.call('DEL', key)
      member, base, size, emptied = nil, 0, 0, true
    else
      redis.call('ZREMRANGEBYRANK', key, 1, l.skipped)
      redis.call('ZADD', key, fmt(base), BASE)
      if size then
        size = size - l.skipped
      end
    end
  end
  if not member then
    last_total = base
  end
  return member, base, size, last_total, emptied
end
