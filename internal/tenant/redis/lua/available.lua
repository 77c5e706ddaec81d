-- Available: what the tenant whose state is KEYS[1] could take at the
-- server's time (or at ARGV[13] microseconds, in tests), without taking
-- anything. It writes nothing, so it runs as a read-only script.
--
-- Reply: {remaining, limit, reset_us, reset_ns}.

local d = tenant_def()
local now = clock(ARGV[13])
if d[1] == 'gcra' then
  local g = gcra_def(d)
  local ba, bb = gcra_backlog(KEYS[1], now)
  local ra, rn = gcra_duration(g, ba, bb)
  return {gcra_remaining(g, ba, bb), g.limit, ra, rn}
end
local w = log_def(d)
local l = log_read(KEYS[1], w, now)
if not l.member then
  return {w.limit, w.limit, 0, 0}
end
local ra, rn = log_until(w, l.at, now)
return {w.limit - (l.total - l.base), w.limit, ra, rn}
