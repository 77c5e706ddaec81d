-- Put: creates or replaces the limiter defined in KEYS[1] whose state is
-- KEYS[2], and, for a keyed limiter, whose keys' index and expiry index are
-- KEYS[3] and KEYS[4]. ARGV[1] is a keyed limiter's bound of keys, '' for
-- a plain limiter; ARGV[2] on holds the definition as field, value pairs,
-- the first four being limit, period, algorithm and burst: the policy. An
-- identical policy and bound keep the definition and the state; others
-- replace the definition and delete the state, so the limiter starts full
-- (a keyed limiter's new definition holds a new generation, under which
-- its keys start afresh: their old states expire on their own).
--
-- Reply: 1 when the limiter was created, 0 when it existed.

local cur = redis.call('HMGET', KEYS[1], ARGV[2], ARGV[4], ARGV[6], ARGV[8], 'maxkeys')
if cur[1] == ARGV[3] and cur[2] == ARGV[5] and cur[3] == ARGV[7] and cur[4] == ARGV[9] and (cur[5] or '') == ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('UNLINK', KEYS[3], KEYS[4])
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
if cur[1] then
  return 0
end
return 1
