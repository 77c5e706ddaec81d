-- Decide a group: runs decide (decide.lua) on several decisions in turn,
-- each on its own keys and arguments, so that each is decided exactly as
-- it would be alone, in the order given. ARGV[1] is the number of
-- decisions; then, for each, the number of its keys k and of its arguments
-- a, followed by its a arguments. KEYS holds their keys, each decision's k
-- after the previous one's. All of them are in one slot.
--
-- Reply: one reply per decision, in order, each decide's.

local out = {}
local k, a = 0, 2
for i = 1, tonumber(ARGV[1]) do
  local nk, na = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local ks, as = {}, {}
  for x = 1, nk do
    ks[x] = KEYS[k + x]
  end
  for x = 1, na do
    as[x] = ARGV[a + 1 + x]
  end
  k, a = k + nk, a + 2 + na
  out[i] = decide(ks, as)
end
return out
