-- clamp.lua: ARGV[1] limited to [ARGV[2], ARGV[3]]. Operators in
-- comments are not mutated: a < b, x + 1, if y then.
--[[ nor in long comments: a >= b and c
]]
local v, lo, hi = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local note, neg = 'nor in strings: a == b or 1 - 2', -v
if v < lo then
  return lo
end
return math.min(v, hi)
