-- batch.lua: runs one script's body for many keys in one call (the region
-- leader's state reads and grant installs: the script's fixed cost, lib's
-- definitions and the call itself, is paid once per batch instead of once
-- per key). Appended after clock.lua, lib.lua and the body wrapped as the
-- function one(). Every key's call is exactly the script's call for that
-- key alone, in order, at the batch's one reading of the clock: begin
-- resets the call's state, so nothing of one key's call reaches the next.
-- (The batch runs atomically: to every other call its keys' calls happen
-- at one instant, so reading TIME once for them is reading it for each.)
-- All keys of a batch live in one hash slot and one data set (the caller
-- groups them by born sentinel), so it runs on Redis Cluster, and it reads
-- the data set's born sentinel and generation once and writes each once,
-- at its end (lib.lua, SENT).
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
  begin({ unpack(all_keys, (i - 1) * 6 + 1, i * 6) }, { unpack(all_argv, 2 + (i - 1) * n, 1 + i * n) })
  return one()
end
-- One clock reading and one read of the data set's sentinels for the
-- whole batch (clock.lua, hold_clock; lib.lua, SENT).
hold_clock()
SENT, SENTDIRTY = {}, {}
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
flush_sentinels()
return out
