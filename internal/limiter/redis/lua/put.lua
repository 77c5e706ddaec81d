-- Put: creates or replaces the limiter defined in KEYS[1] whose state is
-- KEYS[2]. ARGV holds the definition as field, value pairs, the first four
-- being limit, period, algorithm and burst: the policy. An identical policy
-- keeps the definition and the state; a different one replaces the
-- definition and deletes the state, so the limiter starts full.
--
-- Reply: 1 when the limiter was created, 0 when it existed.

local cur = redis.call('HMGET', KEYS[1], ARGV[1], ARGV[3], ARGV[5], ARGV[7])
if cur[1] == ARGV[2] and cur[2] == ARGV[4] and cur[3] == ARGV[6] and cur[4] == ARGV[8] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], unpack(ARGV))
if cur[1] then
  return 0
end
return 1
