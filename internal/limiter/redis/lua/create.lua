-- Create: creates the limiter defined in KEYS[1], whose state is KEYS[2]
-- and, for a keyed limiter, whose keys' index and expiry index are KEYS[3]
-- and KEYS[4], unless a definition is there already, whatever its policy:
-- a limiter replaced since is never reverted. ARGV holds the definition as
-- field, value pairs, as for put.lua (a keyed limiter's with its bound of
-- keys and a new generation). A created limiter starts full: a state or an
-- index of keys left without its definition is dropped with it (the keys'
-- own states are of another generation, and expire on their own).
--
-- Reply: 1 when the limiter was created, 0 when it existed.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('UNLINK', KEYS[3], KEYS[4])
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
