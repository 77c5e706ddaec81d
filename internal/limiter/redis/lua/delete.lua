-- Delete: removes the limiter defined in KEYS[1] and its state KEYS[2].
--
-- Reply: 1 when the limiter existed, 0 otherwise.

local existed = redis.call('EXISTS', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
return existed
