-- Reserve: makes sure the name ARGV[1] is in the name index KEYS[1], which
-- may hold at most ARGV[2] names. A name already there needs no room, so
-- replacing a limiter is never refused. Being one script, the count and the
-- addition are atomic: replicas creating limiters at once cannot together
-- pass the bound.
--
-- Reply: 1 when the name is in the index, 0 when it was not and the index
-- is full.

if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 1
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], 0, ARGV[1])
return 1
