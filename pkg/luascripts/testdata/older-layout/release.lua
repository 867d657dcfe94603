-- release.lua: an instance ends its lease gracefully. Books its final
-- report's cumulative totals (exactly once: a report that did not arrive
-- before is included in them), then puts every token the lease still shows
-- unspent back in the bucket, whatever the reclaim policy (the instance
-- said it is done), and deletes the lease. A conflicting report (see
-- report_kind) forfeits the lease instead; a stale one changes nothing.
-- A release can only undo: one for a key with no bucket (never used, or
-- gone) writes nothing.
--
-- KEYS[1..6]  bucket hash, lease hash, expiry zset, born sentinel, candidate
--             set, generation (see lib.lua)
-- ARGV[1..7]  common (see lib.lua); the last nine: the rise and the
--             floor's rate and burst, the share's fill time, share awaited, generation seen, deadline, candidate
--             member and mark interval (see lib.lua)
-- ARGV[8..14] as sync.lua (instance id, incarnation, lease number, seq,
--             used, denied, returned)
-- ARGV[15]    built, as sync.lua's ARGV[18]
-- Reply: { tokens put back, now_us, conflict(0|1), generation, reborn(0|1) }
reap(REAPMAX)
local id, inc, le, seq = ARGV[8], ARGV[9], tonumber(ARGV[10]), tonumber(ARGV[11])
local tu, td, tr = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local L = own_lease(id)
local back, conflict = 0, 0
if L then
  local kind = report_kind(L, inc, le, seq, tu, td, tr)
  if kind == 'conflict' then
    forfeit(id, L)
    conflict = 1
  elseif kind == 'supersede' then
    forfeit(id, L)
  elseif kind ~= 'stale' then
    if kind == 'new' then
      back = apply_usage(L, tu - L.au, td - L.ad, tr - L.ar, tonumber(ARGV[15]))
    end
    back = back + drop_lease(id, L, true)
  end
end
if L or not B.missing or LEASES then
  cand_check()
  save_bucket()
end
return gen_reply({ back, NOW, conflict })
