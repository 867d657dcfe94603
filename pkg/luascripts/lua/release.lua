-- release.lua: an instance stops gracefully. Applies its final report (if
-- not a retry), then puts every token the lease still shows unspent back in
-- the bucket, whatever the reclaim policy (the instance said it is done),
-- and deletes the lease.
--
-- KEYS[1..3]  bucket hash, lease hash, expiry zset (see lib.lua)
-- ARGV[1..7]  common (see lib.lua)
-- ARGV[8]     instance id
-- ARGV[9]     seq
-- ARGV[10]    used since the last report (tokens)
-- ARGV[11]    denied since the last report (tokens)
-- ARGV[12]    returned (tokens)
-- Reply: { tokens put back, now_us }
reap(REAPMAX)
local id, seq = ARGV[8], tonumber(ARGV[9])
local L = own_lease(id)
local back = 0
if L then
  if seq > L.seq then
    back = apply_usage(L, tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]))
  end
  back = back + drop_lease(id, L, true)
else
  B.adm = B.adm + tonumber(ARGV[10])
  B.den = B.den + tonumber(ARGV[11])
end
save_bucket()
return { back, NOW }
