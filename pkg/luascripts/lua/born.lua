-- born.lua: stamps a data set's born sentinel (see lib.lua, KEYS[4]) when
-- it is missing, on the Redis clock of the node that holds it. The
-- regional service stamps every sentinel when it starts and whenever it
-- finds one missing, so a data set is dated from when its loss was first
-- noticed, not from the first bucket some later call creates in it; the
-- scripts stamp a missing one themselves too, in the same atomic call that
-- creates a bucket.
--
-- KEYS[1]  born sentinel
-- ARGV[1]  '1' = trust the data set to have started full (write 0: a new
--          deployment whose Redis never held leases); '0' = write NOW
-- Reply: { born_us (the sentinel's value after the call), written(0|1) }
local v = redis.call('GET', KEYS[1])
if v and tonumber(v) then return { tonumber(v), 0 } end
local born = 0
if ARGV[1] ~= '1' then born = clock() end
redis.call('SET', KEYS[1], string.format('%.0f', born))
return { born, 1 }
