-- set_rate.lua: installs a grant from the global tier: the rate and burst cap
-- this region may use for the key until the grant expires (Redis time).
-- Time up to now is first credited under the old settings. A grant expiring
-- earlier than the one installed is stale (a delayed write) and is ignored.
-- After expiry the scripts fall back to the static share by themselves.
--
-- KEYS[1..3]  bucket hash, lease hash, expiry zset (see lib.lua)
-- ARGV[1..6]  common (see lib.lua)
-- ARGV[7]     granted rate (tokens/s, >= 0)
-- ARGV[8]     granted burst cap (tokens, >= 0)
-- ARGV[9]     grant expiry (µs, Redis clock)
-- Reply: { applied(0|1), tokens, outstanding, now_us }  tokens as '%.6f'
reap(REAPMAX)
local exp = tonumber(ARGV[9])
local applied = 0
if exp >= B.ge then
  B.gr = tonumber(ARGV[7])
  B.gb = tonumber(ARGV[8])
  B.ge = exp
  clamp()
  applied = 1
end
save_bucket()
return { applied, f6(B.tk), B.out, NOW }
