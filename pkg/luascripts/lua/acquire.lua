-- acquire.lua: an instance's first lease on a key, or a top-up when its
-- local tokens ran out. Refills the bucket by elapsed time x current rate,
-- reaps a bounded number of expired leases, records the report (used and
-- denied since the last one, idempotent by seq), and debits min(want,
-- available) when at least min tokens are available.
--
-- KEYS[1..3]  bucket hash, lease hash, expiry zset (see lib.lua)
-- ARGV[1..7]  common (see lib.lua)
-- ARGV[8]     instance id
-- ARGV[9]     seq (per instance and key, strictly increasing)
-- ARGV[10]    used since the last report (tokens)
-- ARGV[11]    denied since the last report (tokens)
-- ARGV[12]    want (tokens)
-- ARGV[13]    min: smallest batch worth taking (tokens)
-- Reply: { granted, ttl_ms, remaining, retry_ms, rate, cap, live, reset_ms,
--          now_us, duplicate }   rate and cap are '%.17g' strings (exact)
return lease_op(ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), 0,
  tonumber(ARGV[12]), tonumber(ARGV[13]))
