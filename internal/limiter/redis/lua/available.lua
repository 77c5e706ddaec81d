-- Available: what the limiter defined in KEYS[1] whose state is KEYS[2]
-- could grant at the server's time (or at ARGV[1] microseconds, in tests),
-- without taking anything. It writes nothing, so it runs as a read-only
-- script: grants that have left a sliding log's window are skipped here and
-- removed by the next acquisition (or by the key's expiry).
--
-- Reply: {0} when the limiter is not defined, {-2} when it is keyed
-- (its keys have their own scripts), otherwise
-- {1, remaining, limit, reset_us, reset_ns}.

local function gcra_available(g, key, now)
  local ba, bb = gcra_backlog(key, now)
  local ra, rn = gcra_duration(g, ba, bb)
  return {1, gcra_remaining(g, ba, bb), g.limit, ra, rn}
end

local function log_available(w, key, now)
  local l = log_read(key, w, now)
  if not l.member then
    return {1, w.limit, w.limit, 0, 0}
  end
  local ra, rn = log_until(w, l.at, now)
  return {1, log_remaining(w, l.total - l.base), w.limit, ra, rn}
end

local d = redis.call('HMGET', KEYS[1], 'algorithm', 'limit', 'burst', 'm', 'pa', 'pb', 'ta', 'tb', 'pw', 'pr', 'pu', 'maxe', 'maxkeys')
if not d[1] then
  return {0}
end
if d[13] then
  return {-2}
end
local now = clock(ARGV[1])
if d[1] == 'gcra' then
  return gcra_available(gcra_def(d), KEYS[2], now)
end
return log_available(log_def(d), KEYS[2], now)
