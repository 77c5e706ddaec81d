-- Create: creates the limiter defined in KEYS[1], whose state is KEYS[2],
-- unless a definition is there already, whatever its policy: a limiter
-- replaced since is never reverted. ARGV holds the definition as field,
-- value pairs, as for put.lua. A created limiter starts full: a state left
-- without its definition is dropped with it.
--
-- Reply: 1 when the limiter was created, 0 when it existed.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
