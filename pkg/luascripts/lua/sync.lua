-- sync.lua: one key of an instance's periodic Sync. Applies the usage report
-- idempotently by seq, takes back the tokens the instance returns, debits a
-- new batch and extends the lease by a full TTL.
--
-- KEYS[1..3]  bucket hash, lease hash, expiry zset (see lib.lua)
-- ARGV[1..7]  common (see lib.lua)
-- ARGV[8]     instance id
-- ARGV[9]     seq
-- ARGV[10]    used since the last report (tokens)
-- ARGV[11]    denied since the last report (tokens)
-- ARGV[12]    returned: unused tokens the instance gives back
-- ARGV[13]    want (tokens)
-- ARGV[14]    min (tokens)
-- Reply: as acquire.lua
return lease_op(ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]),
  tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14]))
