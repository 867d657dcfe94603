-- reap.lua: returns expired leases' unspent tokens (granted - reported used
-- - returned) to the bucket under reclaim 'reported', forfeits them under
-- 'none'. Bounded: at most ARGV[6] leases per call; the other scripts reap
-- the same way on every call, so this one only serves idle keys.
--
-- KEYS[1..6]  bucket hash, lease hash, expiry zset, born sentinel, candidate
--             set, generation (see lib.lua)
-- ARGV[1..7]  common (see lib.lua); the last nine: the rise and the
--             floor's rate and burst, the share's fill time, share awaited, generation seen, deadline, candidate
--             member and mark interval (see lib.lua)
-- Reply: { leases reaped, tokens given back, leases left, now_us, generation,
--          reborn(0|1) }
local n, back = reap(REAPMAX)
-- Reaping can only undo: a key with no bucket stays without one.
if not B.missing or LEASES then save_bucket() end
return gen_reply({ n, back, redis.call('HLEN', KEYS[2]), NOW })
