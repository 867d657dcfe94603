-- reap.lua: returns expired leases' unspent tokens (granted - reported used
-- - returned) to the bucket under reclaim 'reported', forfeits them under
-- 'none'. Bounded: at most ARGV[6] leases per call; the other scripts reap
-- the same way on every call, so this one only serves idle keys.
--
-- KEYS[1..3]  bucket hash, lease hash, expiry zset (see lib.lua)
-- ARGV[1..7]  common (see lib.lua)
-- Reply: { leases reaped, tokens given back, leases left, now_us }
local n, back = reap(REAPMAX)
save_bucket()
return { n, back, redis.call('HLEN', KEYS[2]), NOW }
