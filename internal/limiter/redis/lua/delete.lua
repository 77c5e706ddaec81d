-- Delete: removes the limiter defined in KEYS[1], its state KEYS[2] and,
-- for a keyed limiter, its keys' index and expiry index KEYS[3] and
-- KEYS[4] (their states expire on their own). With ARGV[1] 'idle' it does
-- so only while the limiter holds no counts, at the server's time: a plain
-- limiter has no state, a keyed one no key whose bucket is not full (a
-- GCRA key's index score is minus its TAT in microseconds; a sliding log
-- key's expiry is when its newest grant leaves the window). An index entry
-- of a key that is full but not yet trimmed counts as a count.
--
-- Reply: 1 when the limiter existed (and was deleted), 0 otherwise, -1
-- when it holds counts and was left in place.

local existed = redis.call('EXISTS', KEYS[1])
if ARGV[1] == 'idle' and existed == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local held = redis.call('EXISTS', KEYS[2]) == 1
  if not held and redis.call('HGET', KEYS[1], 'maxkeys') then
    if redis.call('HGET', KEYS[1], 'algorithm') == 'gcra' then
      held = redis.call('ZCOUNT', KEYS[3], '-inf', string.format('%d', -now)) > 0
    else
      held = redis.call('ZCOUNT', KEYS[4], '(' .. string.format('%d', now), '+inf') > 0
    end
  end
  if held then
    return -1
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('UNLINK', KEYS[3], KEYS[4])
return existed
