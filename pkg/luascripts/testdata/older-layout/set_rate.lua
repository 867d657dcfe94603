-- set_rate.lua: installs a grant from the global tier: the rate and burst cap
-- this region may use for the key until the grant expires (Redis time).
-- Time up to now is first credited under the old settings. Grants are
-- ordered by when the region sent the report they answer: one issued for
-- an earlier report than the installed grant's is stale (a delayed write)
-- and is ignored, even when it expires later. After expiry the scripts fall
-- back to the static share by themselves.
--
-- KEYS[1..6]  bucket hash, lease hash, expiry zset, born sentinel, candidate
--             set, generation (see lib.lua)
-- ARGV[1..7]  common (see lib.lua); the last nine: the rise and the
--             floor's rate and burst, the share's fill time, share awaited, generation seen, deadline, candidate
--             member and mark interval (see lib.lua)
-- ARGV[8]     granted rate (tokens/s, >= 0)
-- ARGV[9]     granted burst cap (tokens, >= 0)
-- ARGV[10]    grant expiry (µs, Redis clock)
-- ARGV[11]    issued: when the report this grant answers was sent (µs)
-- Reply: { applied(0|1), tokens, outstanding, now_us, reclaimed, generation,
--        reborn(0|1) }  tokens as '%.6f'; reclaimed: tokens this call
--        returned from expired leases
local exp, issued = tonumber(ARGV[10]), tonumber(ARGV[11])
local rate, burst = tonumber(ARGV[8]), tonumber(ARGV[9])
local applied = 0
if issued >= B.gs then applied = 1 end
-- The TTL under the grant in force afterwards, before the first write.
local ttl = TTL
if applied == 1 then ttl = bucket_ttl(burst, exp) end
reap(REAPMAX)
if applied == 1 then
  B.gr = rate
  B.gb = burst
  B.ge = exp
  B.gs = issued
  clamp()
  cand_granted(exp)
end
save_bucket(ttl)
return gen_reply({ applied, f6(B.tk), B.out, NOW, RECLAIMED })
