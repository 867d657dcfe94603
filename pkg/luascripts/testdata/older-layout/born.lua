-- born.lua: stamps a data set's born sentinel (see lib.lua, KEYS[4]) when
-- it is missing, on the Redis clock of the node that holds it, and
-- re-births a data set found gone back in time (lib.lua, Rollback). The
-- regional service stamps every sentinel when it starts and whenever it
-- finds one missing, so a data set is dated from when its loss was first
-- noticed, not from the first bucket some later call creates in it; the
-- scripts stamp a missing one themselves too, in the same atomic call that
-- creates a bucket, and re-birth a data set themselves in the call that
-- finds it gone back.
--
-- KEYS[1]  born sentinel
-- KEYS[2]  its generation (lib.lua, KEYS[6])
-- ARGV[1]  '1' = trust the data set to have started full (write 0: a new
--          deployment whose Redis never held leases); '0' = write NOW
-- ARGV[2]  the highest generation of the data set the caller has seen
--          ('0' = none)
-- Reply: { born_us (the sentinel's value after the call), written(0|1),
--          generation (after the call), reborn(0|1) }
local born, gen = tonumber(redis.call('GET', KEYS[1])), tonumber(redis.call('GET', KEYS[2]))
local seen = tonumber(ARGV[2]) or 0
local back = (not gen and seen > 0) or (gen and gen < seen)
if born and not back then return { born, 0, gen or 0, 0 } end
local reborn = 0
if born then
  -- Gone back in time: born again now, whatever the trust of a first look.
  reborn = 1
  born = clock()
else
  born = 0
  if ARGV[1] ~= '1' then born = clock() end
end
gen = gen or 0
if seen > gen then gen = seen end
-- The jump past what was seen (lib.lua, GENJUMP).
gen = gen + 4294967296
redis.call('SET', KEYS[1], string.format('%.0f', born))
redis.call('SET', KEYS[2], string.format('%.0f', gen))
return { born, 1, gen, reborn }
