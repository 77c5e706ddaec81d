-- Available: what the tenant whose state is KEYS[1] could take at the
-- server's time (or at ARGV[13] microseconds, in tests), without taking
-- anything: what an acquisition of one permit would be told. A tenant with
-- a full bucket is one the shard's index (KEYS[2], and for a sliding log
-- the expiry index KEYS[3]) does not hold; when the shard holds ARGV[14]
-- tenants and the one it would evict is limited, it has nothing left until
-- room can be made (see gcra_room and log_room). It writes nothing, so it
-- runs as a read-only script.
--
-- Reply: {remaining, limit, reset_us, reset_ns, registry_full}.

local d = tenant_def()
local now = clock(ARGV[13])
local max = tonumber(ARGV[14])
local base = string.sub(KEYS[1], 1, #KEYS[1] - 16)
if d[1] == 'gcra' then
  local g = gcra_def(d)
  local ba, bb = gcra_backlog(KEYS[1], now)
  if ba == 0 and bb == 0 then
    local wait = gcra_room(g, KEYS[2], base, now, max, false)
    if wait then
      return {0, g.limit, wait[1], wait[2], 1}
    end
  end
  local ra, rn = gcra_duration(g, ba, bb)
  return {gcra_remaining(g, ba, bb), g.limit, ra, rn, 0}
end
local w = log_def(d)
local l = log_read(KEYS[1], w, now)
if not l.member or l.total == l.base then
  local wait = log_room(w, KEYS[2], KEYS[3], base, now, max, false)
  if wait then
    return {0, w.limit, wait[1], wait[2], 1}
  end
  return {w.limit, w.limit, 0, 0, 0}
end
local ra, rn = log_until(w, l.at, now)
return {w.limit - (l.total - l.base), w.limit, ra, rn, 0}
