-- state.lua: the region leader's read of one key for its report to the
-- global tier: demand counters and what the region holds, brought up to now
-- (refill and reaping applied) so holdings are never under-reported.
--
-- KEYS[1..6]  bucket hash, lease hash, expiry zset, born sentinel, candidate
--             set, generation (see lib.lua)
-- ARGV[1..7]  common (see lib.lua); the last nine: the rise and the
--             floor's rate and burst, the share's fill time, share awaited, generation seen, deadline, candidate
--             member and mark interval (see lib.lua)
-- Reply: { admitted, denied, rate, cap, grant_expiry_us, tokens, outstanding,
--          now_us, lease_demand_mtps, strict_demand, reclaimed, released }
--          released: the tokens leases returned above the cap of the grant
--          in force since the last read (field rl, '%.6f'), which this read
--          takes (zeroes): each is reported once, by the leader that read
--          it; taken after the grant ended, they are gone (0). rate and
--          cap as '%.17g' (exact), tokens as '%.6f'; admitted, denied and
--          strict_demand cumulative tokens; lease_demand_mtps the sum of the
--          live leases' demand rates (milli-tokens/s); reclaimed the tokens
--          this read returned from expired leases; then generation and
--          reborn(0|1) (lib.lua, Rollback)
--
-- A read that reaped nothing (wrote no lease hash or expiry set) and need
-- not date the data set (STAMP) changed nothing but the refill: it writes
-- no bucket. An existing bucket only has its TTLs renewed (renew_ttls),
-- as a writing read renews them, so a key the leader keeps reading lives
-- exactly as long as before; a missing one stays missing. The stored
-- state is then exactly what it was before the read, so every later call
-- does what it would have done had the leader not read the key at this
-- instant (a history the leader's timing already allows: refill is only
-- ever brought up to the moment of a call), and the reply is the same as
-- a writing read's.
reap(REAPMAX)
local released, took = 0, false
if B.rl > 0 then
  if grant_valid(NOW) then released = B.rl end
  B.rl = 0
  took = true
end
-- A held key (lib.lua, "Awaited share") stays missing: the born sentinel
-- is dated by the next call that creates a bucket, or the regional guard.
if (STAMP and not HOLD) or LEASES or took then
  save_bucket()
elseif not B.missing then
  renew_ttls(TTL)
end
local ge = B.ge
if ge <= NOW then ge = 0 end
return gen_reply({ B.adm, B.den, f17(rate_now()), f17(cap_now()), ge, f6(B.tk), B.out, NOW, B.dr, B.sd, RECLAIMED, f6(released) })
