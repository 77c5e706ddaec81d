-- Claim: records in the directory KEYS[1] (a hash of limiter name to
-- group, "" for none) that the limiter ARGV[1] is in group ARGV[2], unless
-- the directory already places it elsewhere. ARGV[3] is "1" when the
-- limiter exists in no group from before the directory (its definition sits
-- where ungrouped ones do) and has no entry yet: it is then placed there.
--
-- Reply: {1} when the limiter is (now) in ARGV[2]; {0, group} with the
-- group it is in otherwise.

local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then
  if ARGV[3] == '1' then
    cur = ''
  else
    cur = ARGV[2]
  end
  redis.call('HSET', KEYS[1], ARGV[1], cur)
end
if cur == ARGV[2] then
  return {1}
end
return {0, cur}
