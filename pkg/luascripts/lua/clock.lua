-- clock.lua: the only clock the scripts read.
-- KEYS and ARGV are those of the key a call works on: the script's own,
-- or one key's share of a batch's (lib.lua's begin sets them per key).
local KEYS, ARGV = KEYS, ARGV
-- Redis TIME (server wall clock, microseconds). Every instance and replica
-- of the regional service shares this clock, so client clock skew never
-- enters the bucket maths.
-- A batch (batch.lua) holds the clock at one reading for all its keys:
-- its calls run in one atomic script, so no other call falls between
-- them, and every other client sees them happen at one instant.
local HELD
local function clock()
  if HELD then return HELD end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- hold_clock holds the clock at its reading now, for the rest of the
-- script.
local function hold_clock() HELD = clock() end
-- argc is how many arguments the caller passed for the key (the test twin
-- appends its virtual clock after them): the rise, the floor's rate and
-- burst, the share's fill time, the share awaited, the generation seen,
-- the deadline and the candidate arguments (lib.lua) are the last nine.
local function argc() return #ARGV end
local ARGC = argc()
