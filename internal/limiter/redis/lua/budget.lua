-- Budget: the keyed limiters of the store hold at most ARGV[3] keys
-- together, the sum of their bounds of keys, which KEYS[1] records: a hash
-- of limiter name to max_keys. ARGV[1] names a limiter and ARGV[2] is the
-- bound it is to hold, 0 for a plain limiter or none. With ARGV[4] 'grow'
-- the record only rises (before the definition is written: a Put that
-- fails afterwards leaves the budget counting too much, never too little);
-- with 'set' it becomes ARGV[2] (after the definition is written or
-- deleted). A rise past the budget is refused and records nothing, but
-- with 'force' (a limiter of the config file created again, which was
-- counted when it was first put).
--
-- Reply: {1} when recorded, {0, total} when refused, total being what the
-- bounds would add up to.

local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local new = tonumber(ARGV[2])
if new > old and ARGV[4] ~= 'force' then
  local total = new - old
  for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
    total = total + tonumber(v)
  end
  if total > tonumber(ARGV[3]) then
    return {0, total}
  end
elseif new <= old and ARGV[4] == 'grow' then
  return {1}
end
if new == 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return {1}
