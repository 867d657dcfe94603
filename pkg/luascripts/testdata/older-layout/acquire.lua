-- acquire.lua: an instance's first lease on a key, or a top-up when its
-- local tokens ran out. Refills the bucket by elapsed time x current rate,
-- reaps a bounded number of expired leases, books the report's cumulative
-- totals (exactly once, see lib.lua), and debits min(want, available) when
-- at least min tokens are available.
--
-- KEYS[1..6]  bucket hash, lease hash, expiry zset, born sentinel, candidate
--             set, generation (see lib.lua)
-- ARGV[1..7]  common (see lib.lua); the last nine: the rise and the
--             floor's rate and burst, the share's fill time, share awaited, generation seen, deadline, candidate
--             member and mark interval (see lib.lua)
-- ARGV[8..18] as sync.lua
-- Reply: as lease_op (lib.lua)
return lease_op(ARGV[8], ARGV[9], tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]),
  tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16]), ARGV[17] == '1', tonumber(ARGV[18]))
