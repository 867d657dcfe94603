-- check.lua: the strict path. One atomic, cost-weighted decision against the
-- regional bucket (the seed's semantics): refill, then admit when the bucket
-- holds at least cost tokens. Denials change no tokens. Every decision
-- adds cost to the strict-demand counter sd, the region leader's reading
-- of demand that no lease carries.
--
-- KEYS[1..6]  bucket hash, lease hash, expiry zset, born sentinel, candidate
--             set, generation (see lib.lua)
-- ARGV[1..7]  common (see lib.lua); the last nine: the rise and the
--             floor's rate and burst, the share's fill time, share awaited, generation seen, deadline, candidate
--             member and mark interval (see lib.lua)
-- ARGV[8]     cost (tokens, >= 1)
-- Reply: { allowed(0|1), remaining, retry_ms, reset_ms, rate, cap, now_us,
--          reclaimed, generation, reborn(0|1) }
--        rate and cap are '%.17g' strings (exact); retry_ms is -1 when the current
--        rate is zero
-- With nothing outstanding, expired leases hold nothing to reclaim: the
-- strict path skips reaping and stays on the bucket alone.
if B.out > 0 then reap(REAPMAX) end
local cost = tonumber(ARGV[8])
local allowed, retry = 0, 0
B.sd = B.sd + cost
if B.tk >= cost then
  B.tk = B.tk - cost
  B.adm = B.adm + cost
  allowed = 1
else
  B.den = B.den + cost
  retry = retry_ms(cost)
end
cand_check()
-- A held key (see lib.lua, "Awaited share") keeps its demand alone: its
-- bucket stays missing, to be born at its cap once its share arrives.
if HOLD then save_held() else save_bucket() end
return gen_reply({ allowed, math.floor(B.tk), retry, reset_ms(), f17(rate_now()), f17(cap_now()), NOW, RECLAIMED })
