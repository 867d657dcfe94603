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
-- ARGV[12]    deposit: tokens other regions released to add to the bucket
--             (>= 0, '0' = none); added only by the first install of the
--             answer (issued above the installed grant's) while the grant
--             is in force (expiry after the bucket's latest time), up to
--             the cap
-- Reply: { applied(0|1), tokens, outstanding, now_us, reclaimed, released,
--        deposited, generation, reborn(0|1) }  tokens, released and
--        deposited as '%.6f';
--        reclaimed: tokens this call returned from expired leases;
--        released: tokens the new cap took out of the bucket;
--        deposited: the deposit this call added (whole micro-tokens, before
--        the clamp to the cap), 0 when it added none
--
-- Burst transfer (docs/architecture.md, "Burst transfer"). A grant that
-- lowers the cap below what the bucket holds clips the bucket; the tokens
-- clipped are released: the region reports them once, and the global tier
-- may deposit them in a region that spends its bucket empty. A deposit
-- comes with a cap raised by as much, so it fits whatever the bucket
-- holds; it is added once per answer, so a retried or repeated install
-- adds nothing (its issued equals the installed grant's).
local exp, issued = tonumber(ARGV[10]), tonumber(ARGV[11])
local rate, burst = tonumber(ARGV[8]), tonumber(ARGV[9])
local deposit = tonumber(ARGV[12])
local applied = 0
if issued >= B.gs then applied = 1 end
local fresh = issued > B.gs
local released = 0
local deposited = 0
-- The TTL under the grant in force afterwards, before the first write.
local ttl = TTL
if applied == 1 then ttl = bucket_ttl(burst, exp) end
reap(REAPMAX)
if applied == 1 then
  B.gr = rate
  B.gb = burst
  B.ge = exp
  B.gs = issued
  -- Tokens released under the grant before are dropped with it: under
  -- this one the room they left may refill.
  if fresh then B.rl = 0 end
  local before = B.tk
  clamp()
  released = before - B.tk
  if fresh and deposit > 0 and grant_valid(B.ts) then
    -- Whole micro-tokens, rounded down: a deposit never adds a fraction.
    -- An answer that arrives after its grant ended adds none: the global
    -- tier reserved the deposit's room only under that grant, and the
    -- static cap now in force may have refilled into it. Ended by the
    -- latest time the bucket has seen (B.ts, refill's), not only by NOW:
    -- after the clock went back (a failover to a replica whose clock is
    -- behind), a grant that ended before a call the bucket already saw
    -- is over, whatever NOW says.
    deposited = math.floor(deposit * 1000000) / 1000000
    B.tk = B.tk + deposited
    clamp()
    B.tk = snap(B.tk)
  end
  cand_granted(exp)
end
save_bucket(ttl)
return gen_reply({ applied, f6(B.tk), B.out, NOW, RECLAIMED, f6(released), f6(deposited) })
