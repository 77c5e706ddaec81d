-- Lowest: the ARGV[5] keys of one shard of a table (see table.lua for the
-- arguments) with the fewest permits left at the server's time, in
-- Lowest's order. ARGV[6] is the sliding log's budget: how many index
-- members beyond 2k one run may visit. Index members whose state does not
-- match (a state lost to eviction, or replaced after its key expired) are
-- dropped on the way.
--
-- Reply: {done, now, then per key:
--   GCRA         key, tat_us, tat_r
--   sliding log  key, used, reset_us, reset_ns}
-- or table_open's reply for a keyed limiter it cannot use.
-- done is 0, with no key, when a sliding log's walk ran out of budget
-- before it could answer: it saved what it learned, and the caller runs the
-- script again.

-- GCRA: the index order is exact, so the first k members that hold a
-- bucket not full at now are the answer: O(log n + k).
local function key_gcra_lowest(idx, base, k, now)
  gcra_trim(idx, now)
  local out, stale = {1, now}, {}
  local found, off, done = 0, 0, false
  while found < k and not done do
    local want = k - found
    local page = redis.call('ZRANGE', idx, '-inf', fmt(-now), 'BYSCORE', 'LIMIT', off, want, 'WITHSCORES')
    off = off + #page / 2
    done = #page / 2 < want -- the last page
    for i = 1, #page, 2 do
      local m = page[i]
      local tat_us, tat_r = -tonumber(page[i + 1]), R_MAX - tonumber(string.sub(m, 1, 12))
      if tat_us == now and tat_r == 0 then
        -- Full at now, and so is every member after it.
        done = true
        break
      end
      local key = string.sub(m, 13)
      local st = redis.call('GET', base .. key)
      if st == gcra_state(tat_us, tat_r) then
        out[#out + 1] = key
        out[#out + 1] = tat_us
        out[#out + 1] = tat_r
        found = found + 1
      else
        stale[#stale + 1] = m
      end
    end
  end
  zrem(idx, stale)
  return out
end

-- ranks_before reports whether candidate a ranks before b in Lowest's
-- order: more permits used, then a later newest grant, then a smaller key.
local function ranks_before(a, b)
  if a.used ~= b.used then
    return a.used > b.used
  end
  if a.at ~= b.at then
    return a.at > b.at
  end
  return key_less(a.key, b.key)
end

-- Sliding log: what a log holds at now depends on when each grant leaves
-- the window, so no score orders keys at every instant. The index
-- orders them by a bound instead: a key's peak (what it held just after
-- its newest grant) is at least what it holds now. The walk reads members
-- in index order, evaluates each log exactly at now, and stops at the first
-- member whose bound ranks after the k-th best exact answer so far: every
-- member after it ranks after it too, and a key never ranks before its
-- bound. Each log read lowers its key's bound to the exact count, still
-- a bound until the key's next grant, so a later query reads it again
-- only if its count has fallen since or it ranks among the k lowest. A walk
-- reads O(k + c) logs, c the keys read whose count has fallen since
-- their bound was set: at worst, on the first query after many keys'
-- grants began leaving the window, every key of the shard. A run that
-- visits 2k + budget members without an answer saves the bounds it lowered
-- and the stale members it found, and answers "not done". A walk stops
-- once it has read k keys whose bounds are exact and settled the k-th
-- best, which it does every k candidates: so it reads at most 2k exact
-- bounds, each run that answers "not done" lowers or removes at least
-- max(1, budget) members, and the runs end.
local function key_log_lowest(w, idx, exp, base, k, budget, now)
  log_trim(idx, exp, now)
  local cands, stale, lowered, kth = {}, {}, {}, nil
  local function settle()
    table.sort(cands, ranks_before)
    for i = #cands, k + 1, -1 do
      cands[i] = nil
    end
    if #cands == k then
      kth = cands[k]
    end
  end
  local off, batch, done, complete, visited = 0, k + 1, false, true, 0
  while not done do
    local page = redis.call('ZRANGE', idx, off, off + batch - 1, 'WITHSCORES')
    if #page == 0 then
      break
    end
    off = off + #page / 2
    for i = 1, #page, 2 do
      local m = page[i]
      local c = {used = -tonumber(page[i + 1]), at = AT_MAX - tonumber(string.sub(m, 1, 16)), key = string.sub(m, 17)}
      if kth and ranks_before(kth, c) then
        done = true
        break
      end
      visited = visited + 1
      if visited > 2 * k + budget then
        done, complete = true, false
        break
      end
      if log_expired(w, c.at, now) then
        stale[#stale + 1] = m
      else
        local l = log_read(base .. c.key, w, now)
        if l.at ~= c.at then
          stale[#stale + 1] = m
        else
          local used = l.total - l.base
          if used < c.used then
            lowered[#lowered + 1] = fmt(-used)
            lowered[#lowered + 1] = m
          end
          c.used = used
          -- Past the k-th best so far, it cannot be among the k best.
          if not kth or ranks_before(c, kth) then
            cands[#cands + 1] = c
            if #cands == 2 * k or (not kth and #cands == k) then
              settle()
            end
          end
        end
      end
    end
    batch = math.max(k, 128)
  end
  zrem(idx, stale)
  zrem(exp, stale)
  for i = 1, #lowered, 512 do
    redis.call('ZADD', idx, 'XX', unpack(lowered, i, math.min(i + 511, #lowered)))
  end
  if not complete then
    return {0, now}
  end
  settle()
  local out = {1, now}
  for _, c in ipairs(cands) do
    local ra, rn = log_until(w, c.at, now)
    out[#out + 1] = c.key
    out[#out + 1] = c.used
    out[#out + 1] = ra
    out[#out + 1] = rn
  end
  return out
end

local d, base = table_open()
if not d then
  return base
end
local k, now = tonumber(ARGV[5]), clock(ARGV[3])
if d[1] == 'gcra' then
  return key_gcra_lowest(KEYS[1], base, k, now)
end
return key_log_lowest(log_def(d), KEYS[1], KEYS[2], base, k, tonumber(ARGV[6]), now)
