-- batch.lua: runs one script's body for many keys in one call (the region
-- leader's state reads and grant installs: the script's fixed cost, lib's
-- definitions and the call itself, is paid once per batch instead of once
-- per key). Appended after clock.lua, lib.lua and the body wrapped as the
-- function one(). Every key's call is exactly the script's call for that
-- key alone, in order: begin resets the call's state, so nothing of one
-- key's call reaches the next. All keys of a batch live in one hash slot
-- (the caller groups them by born sentinel), so it runs on Redis Cluster.
--
-- KEYS     six per key, in order, each key's as its script takes them
-- ARGV[1]  n: how many arguments each key takes
-- ARGV[2..] n per key, in order, each key's as its script takes them
-- Reply: one entry per key: the script's reply for it, or an error reply
--        for a key whose call failed (what it wrote before failing stays,
--        as it would after the script alone failed; a key's call past its
--        deadline answers 'TOOLATE <now> <deadline>' having written
--        nothing, see lib.lua)
local n = tonumber(ARGV[1])
local all_keys, all_argv = KEYS, ARGV
local function run(i)
  local k, a = {}, {}
  for j = 1, 6 do k[j] = all_keys[(i - 1) * 6 + j] end
  for j = 1, n do a[j] = all_argv[1 + (i - 1) * n + j] end
  begin(k, a)
  return one()
end
local out = {}
for i = 1, #all_keys / 6 do
  local ok, r = pcall(run, i)
  if ok then
    out[i] = r
  elseif type(r) == 'table' and r.err then
    out[i] = r
  else
    out[i] = { err = tostring(r) }
  end
end
return out
