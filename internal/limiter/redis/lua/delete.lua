-- Delete: removes the limiter defined in KEYS[1], its state KEYS[2] and,
-- for a keyed limiter, its keys' index and expiry index KEYS[3] and
-- KEYS[4] (their states expire on their own).
--
-- Reply: 1 when the limiter existed, 0 otherwise.

local existed = redis.call('EXISTS', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('UNLINK', KEYS[3], KEYS[4])
return existed
