-- clock.lua: the only clock the scripts read.
-- Redis TIME (server wall clock, microseconds). Every instance and replica
-- of the regional service shares this clock, so client clock skew never
-- enters the bucket maths.
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- ARGC is how many arguments the caller passed (the test twin appends its
-- virtual clock after them): the candidate arguments (lib.lua) are the
-- last two.
local ARGC = #ARGV
