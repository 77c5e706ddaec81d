-- Available: what the key ARGV[2] of a table (see table.lua for the
-- arguments) could take at the server's time, without taking anything:
-- what an acquisition of one permit would be told. A key with a full
-- bucket is one the shard's index does not hold; when the shard holds its
-- bound and the key it would evict is limited, it has nothing left until
-- room can be made (see gcra_room and log_room). It writes nothing, so it
-- runs as a read-only script.
--
-- Reply: {remaining, limit, reset_us, reset_ns, full}; or table_open's
-- reply for a keyed limiter it cannot use.

local d, base, max = table_open()
if not d then
  return base
end
local idx, exp, st = KEYS[1], KEYS[2], base .. ARGV[2]
local now = clock(ARGV[3])
if d[1] == 'gcra' then
  local g = gcra_def(d)
  local ba, bb = gcra_backlog(st, now)
  if ba == 0 and bb == 0 then
    local wait = gcra_room(g, idx, base, now, max, false)
    if wait then
      return {0, g.limit, wait[1], wait[2], 1}
    end
  end
  local ra, rn = gcra_duration(g, ba, bb)
  return {gcra_remaining(g, ba, bb), g.limit, ra, rn, 0}
end
local w = log_def(d)
local l = log_read(st, w, now)
if not l.member or l.total == l.base then
  local wait = log_room(w, idx, exp, base, now, max, false)
  if wait then
    return {0, w.limit, wait[1], wait[2], 1}
  end
  return {w.limit, w.limit, 0, 0, 0}
end
local ra, rn = log_until(w, l.at, now)
return {w.limit - (l.total - l.base), w.limit, ra, rn, 0}
