-- Unclaim: removes the directory KEYS[1]'s entry for the limiter ARGV[1]
-- if it places it in group ARGV[2]: a Put that placed it elsewhere since
-- keeps its entry.
--
-- Reply: 1 when the entry was removed, 0 otherwise.

if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
