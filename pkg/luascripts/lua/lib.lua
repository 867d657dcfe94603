-- lib.lua: shared state model of one quota key's regional bucket. Prepended
-- (after clock.lua) to every script but born's; a script's body runs after
-- begin(KEYS, ARGV), a batch's once per key (see batch.lua).
--
-- KEYS[1]  bucket hash   fields: t   tokens in the bucket (whole micro-
--                                     tokens, %.6f; 'tk' in the buckets of
--                                     older scripts, see "Layouts")
--                                 rm  refill earned but not yet in t
--                                     (micro-tokens, [0, 1), %.17g;
--                                     missing = 0)
--                                 ts  time of the last refill (µs)
--                                 gr  granted rate (tokens/s, %.17g: exact,
--                                     so the region reports back exactly
--                                     what it was granted)
--                                 gb  granted burst cap (tokens, %.17g)
--                                 ge  grant expiry (µs, Redis clock); 0 = none
--                                 gs  when the grant's report was sent (µs);
--                                     orders grants, newest wins
--                                 out unspent tokens out in live leases
--                                 adm tokens admitted (cumulative counter)
--                                 den tokens denied (cumulative counter)
--                                 dr  Σ of the live leases' dr (milli-
--                                     tokens/s, integer: exact sums)
--                                 sd  tokens decided by the strict path,
--                                     and asked by lease requests held
--                                     (see "Awaited share"; cumulative
--                                     counter)
--                                 rl  tokens released under the grant in
--                                     force: returned by leases above its
--                                     cap (put_back), for the region
--                                     leader's next state read to take
--                                     and report (the burst transfer,
--                                     docs/architecture.md; %.6f; missing
--                                     = 0)
--                                 n   lease records in the hash (missing
--                                     = 0)
--                                 xe  at most the earliest expiry of a
--                                     record, in whole ms after ts
--                                     (missing = not known): a key with
--                                     few leases reads its records to
--                                     reap only once NOW reaches it (see
--                                     expired_few); relative, so a small
--                                     integer in the listpack
--                                 #id the lease record of instance id
--                                     (below)
--                        A field from t to rm that is 0 and was never
--                        written is left out: it reads as 0 (see
--                        save_bucket). A hash without ts is no bucket: it
--                        is a held key's demand alone (sd, den and the
--                        candidate fields; see "Awaited share").
--          lease record  the value of field '#' .. id, instance id's lease:
--                                 "g u r seq exp lg lt pd dr au ad ar le
--                                 inc": granted, used, returned (cumulative
--                                 tokens booked), last applied seq, expiry
--                                 (µs), last grant, start of the open
--                                 demand window (µs, on the clock of the
--                                 lease's reports: see apply_usage),
--                                 demand reported in
--                                 it (tokens), demand rate of the last
--                                 closed one (milli-tokens/s), the used,
--                                 denied and returned totals of the last
--                                 applied report, the instance's lease
--                                 number and the incarnation that wrote it
--                                 (a decimal string). seq and the totals
--                                 are the fingerprint of the last applied
--                                 report. A record of the first nine or six
--                                 fields alone (older scripts) has no
--                                 fingerprint: any report on it is a
--                                 conflict (see report_kind)
--                        Written compact (binary varints, see
--                        lease_record), so the hash stays a listpack.
-- KEYS[2]  lease hash    the lease records of older scripts (field =
--                        instance id); read and moved into KEYS[1] by the
--                        first call that loads the key (see "Layouts")
-- KEYS[3]  expiry zset   member = instance id, score = lease expiry (µs);
--                        only while the key has more than FEWLEASES
--                        leases (see reap); it expires with the bucket
-- KEYS[4]  born sentinel string: the Redis time (µs) the data set holding
--                        these keys was born ('0': trusted to have
--                        started full); no TTL. One per Redis, or on a
--                        cluster one per hash slot, in this key's slot.
--                        Missing = the data set is new: the first script
--                        that creates a bucket in it writes NOW.
-- KEYS[5]  candidate set  zset: member = 'tenant|class' (the next-to-last
--                        ARGV), score = Redis time (µs) until which the
--                        key needs the global tier; no TTL (the region
--                        leader trims it). One per Redis, or on a cluster
--                        one per hash slot, named with the slot's born
--                        sentinel's hash tag. See "Candidates" below.
-- KEYS[6]  generation    string: the data set's write generation, the born
--                        sentinel's name + ':gen' (same slot); no TTL. See
--                        "Rollback" below.
-- The first three share one hash tag and the fourth, fifth and sixth hash
-- to their slot, so every script works on Redis Cluster.
--
-- Common ARGV (every script but set_rate):
--   ARGV[1] static rate s_r      tokens/s, used when no grant is valid
--   ARGV[2] static burst cap     tokens
--   ARGV[3] lease TTL            ms
--   ARGV[4] reclaim              '1' = reported, '0' = none
--   ARGV[5] restart wait         ms: a bucket missing from a data set born
--                                at B starts empty and earns nothing before
--                                B + wait (leases issued before B may still
--                                be spent until then); '0' = no restart
--                                guard: a missing bucket is full and
--                                KEYS[4] is not read
--   ARGV[6] reap budget          expired leases reaped per call (bounded work)
--   ARGV[7] demand window        ms: the shortest window a lease's demand
--                                rate is measured over
-- Script-specific ARGV start at 8. The last nine ARGV (ARGC - 8 .. ARGC:
-- see clock.lua) are, for every script but born, the rise (µs, Redis
-- time; '0' = none) and the key's floor rate (tokens/s) and burst
-- (tokens) before it (see "Coming back from a floor"), the share's fill time
-- (ms: how long the key's static share, without a floor, takes to refill
-- its burst; '0' = not known: see bucket_ttl), the share awaited ('1':
-- see "Awaited share"; '0' otherwise), the highest generation of the data
-- set the caller has seen (see "Rollback"; '0' = none), the deadline, the
-- candidate member and the mark interval (ms; '0' = never mark). Every
-- reply ends with the data set's generation after the call and reborn
-- (0|1: this call found the data set gone back in time and re-birthed
-- it).
--
-- Rollback. A data set restored from an older snapshot (RDB or AOF), or a
-- replica promoted while it lagged, keeps its born sentinel: its buckets
-- hold tokens since handed out, its lease records forget leases issued
-- since. So the data set also carries a write generation (KEYS[6]): every
-- call that saves a bucket raises it by one and returns it, and the caller
-- passes back the highest it has seen of that data set. With the restart
-- guard on (ARGV[5] > 0), a call that finds the generation below the one
-- passed (or missing while one was passed) knows writes that were seen
-- are gone: it re-births the data set, born := NOW and generation :=
-- passed + GENJUMP, exactly as if Redis had restarted empty. Whenever a
-- call writes the born sentinel (a re-birth, or a missing one stamped) the
-- generation jumps by GENJUMP past the one passed, so the writes other
-- callers saw of the lost history (at most GENJUMP beyond this caller's
-- view) do not re-birth it again. A bucket older than its data set's
-- birth is not trusted: one whose ts is before born + wait (every bucket
-- written since the birth has ts at or after born + wait: created inside
-- the wait, ts stays there; after it, ts is the refill's NOW) is deleted
-- with its lease records and expiry set and treated as missing: it starts
-- empty and earns nothing until born + wait, and its stale leases are not
-- reclaimed (their tokens were issued from the old state). Since wait >=
-- lease TTL and >= grant validity + one epoch, every lease and grant
-- issued before the re-birth has ended by then.
--
-- Layouts. A key's lease records live in its bucket hash, one field each
-- ('#' then the instance id), with their count in n: one Redis key per
-- quota key instead of two, about a third of a key's memory (see
-- docs/architecture.md, "Memory per key"); and the bucket leaves out the
-- fields that are 0 and were never written. Older scripts kept the
-- records in KEYS[2], the tokens in 'tk' and every field. A call that loads a bucket holding 'tk'
-- moves the records into the bucket and renames 'tk' to 't' before
-- anything else, so the key is in this layout whatever the call does
-- next (its TTL stays the bucket's, which outlives the old lease hash).
-- Older scripts read the tokens from 'tk' and fail on a bucket of this
-- layout (a nil in refill's arithmetic: an error before any write), so
-- during a rolling upgrade an old replica's call on a key a new one wrote
-- changes nothing, and the instance retries through another replica
-- (upgrade_test.go runs the older scripts, testdata/older-layout, beside
-- these).
--
-- Deadline. The caller chose the static share (or the floor) it passes,
-- and set_rate's grant, from its clock, for a script that runs within its
-- bound on Redis (the static lease's margin covers that bound, and no
-- more). A script that runs later (it waited in a paused or overloaded
-- Redis, its caller long gone) would act on a choice that may no longer
-- hold: a region that lapsed to its floor meanwhile would refill and
-- grant at its old share. The deadline (µs, Redis time; '0' = none) is
-- the end of that bound; a call whose NOW is past it changes nothing and
-- answers the error 'TOOLATE <now> <deadline>' (in a batch, as that key's
-- entry), which the caller treats as a Redis that did not answer in time.
--
-- Awaited share. A missing bucket is created holding what it would hold
-- had it been idle since its data set's birth: full at its cap, unless
-- the birth is recent (see load_bucket). One created while its cap is 0
-- is created empty and from then on only refills; so a key first used
-- while the region's static burst for it is 0, and given a share a round
-- later, would start that share empty and reach it only at its rate (a
-- class of 100 an hour: most of the hour), where a key first used a round
-- later starts full. A cap of 0 has two kinds of cause, and the caller,
-- which knows which, says so:
--   - a floor: the region is drained, or off its static lease, at a
--     partition_share that leaves it nothing. The global tier may have
--     given the region's share to the others, so the region must climb
--     back from nothing, through fenced grants or its refill: a missing
--     bucket is created empty, as always ('0');
--   - a share awaited: every config the region runs that knows the key
--     gives it a share, and the 0 comes only from one that does not know
--     the key's class (or the region) at all, until the global tier
--     confirms the newer config ('1', only while on the static lease).
-- While a share is awaited, a call that would create the bucket at a cap
-- of 0 with no lease record of the key holds the key instead: it opens no
-- lease and writes no bucket, so the key stays missing and is born at its
-- cap once the share arrives, as a key first used then would be; it
-- answers as the empty bucket would (nothing granted, 'never'). The
-- key's demand still shows: a held lease request adds its min (at least
-- 1) and a held check its cost to sd (a check's cost to den too), which a
-- hash without ts keeps (save_held), marked as any strict demand is
-- (cand_check), read by state and carried into the bucket once it is
-- born. A grant for a held key (set_rate) creates the bucket empty, as
-- every grant does: a grant never starts full.
--
-- Coming back from a floor. The static rate and cap are those of the
-- call, and refill credits a bucket's idle time at the call's rate. A
-- region that ran on its floor (drained, or off its static lease) was
-- counted there by the global tier, which gave the rest of its share to
-- other regions; when its share comes back (the lease conferred again, or
-- a drain lifted), a bucket idle across the floor, credited that time at
-- the restored rate, and a missing bucket, born full, would hand out at
-- once the burst the others may just have spent in its place: above
-- b + r x t. So the caller passes the rise RISE (the Redis time from which
-- the share stands above its floor) and the key's floor FR, FB, and refill
-- credits time before RISE at most at FR, capped at FB (as a call then
-- would have: the floor piece), and the static share only since. A missing
-- bucket, dated from its data set's birth as always, is thereby born as
-- one idle since long before: at most FB at RISE, refilled at SR since.
-- The unspent tokens of a lease that ended at or before RISE go back as a
-- call on the floor would have put them back, up to FB (put_back).
-- Crediting the floor for time the region in fact held its share (before
-- its lease ended) only under-credits. RISE is on the clock of the Redis
-- node that stored it; on a cluster a node whose clock runs behind
-- credits the floor a little longer (safe), one ahead credits the share
-- up to the skew earlier.
--
-- Invariants kept by every script:
--   tk <= max(0, cap(now) - out)   (a region never holds more than its cap,
--                                   counting unspent leases: DESIGN inv. 3;
--                                   at the storage's resolution, see room)
--   tokens appear only by refill at rate(t) over elapsed Redis time (never
--   more than its exact integral, see accrue), or by reclaiming a lease's
--   unspent tokens; never by recreating a key early.
--   No write can fail: every value a write needs is bounded (see MAXMS),
--   and the TTL is computed before the script's first write.
--   dr = Σ dr of the records in the lease hash (while the bucket and the
--   lease hash live and die together; a bucket recreated under live leases
--   under-counts until they end, never below 0).
--
-- Demand reading. The region leader reports each key's demand as dr/1000
-- plus the strict path's sd per second. Each lease measures its instance's
-- demand (used + denied) over windows of its own reports, on the clock the
-- totals were read on: the instance's, as each report says when it was
-- built (Redis time at arrival for a report that does not say), closing a
-- window at the first report at least ARGV[7] after it opened, or at the
-- first at least a fifth of that after it opened whose demand is a plain
-- change from the lease's last rate (demand_moved): a shift or a key
-- turning hot is read within a tenth of a refresh, not half of one, while
-- a steady demand's noise keeps its windows long. Measured at
-- arrival, a report's time in transit would move its demand between
-- windows: a report built just after the previous one but delayed reads
-- as a window of almost no demand, the next as one of several times the
-- demand, and a region leader reading between them reports a collapse.
-- A count of what reports brought in over the leader's epoch would be as
-- lumpy as the reports are (an instance's refresh landing just before or
-- just after the leader reads moves a whole refresh of its demand between
-- epochs); a sum of per-instance rates is not. A lease's rate leaves the
-- sum when the lease ends: at release, or when it is reaped after expiry.
-- A lease that supersedes a record of the same instance starts from that
-- record's rate (lease_carry), so the reading does not fall to nothing
-- while the new lease's first window is open.

-- The call's settings and state. begin (below) sets them from a key's
-- KEYS and ARGV at the start of each key's call: once per script, or once
-- per key of a batch (see batch.lua); nothing of one key's call is left
-- for the next.
local SR, SB, LTTL, RECLAIM, WAIT, REAPMAX, DWIN, NOW, DEADLINE
-- RISE, FR, FB: the rise (µs; 0 = none) and the key's floor before it,
-- taken at most SR and SB (see "Coming back from a floor").
local RISE, FR, FB
-- FILL: the share's fill time (ms; 0 = not known), see bucket_ttl.
local FILL
-- AWAIT: the caller's cap of 0 is a share awaited, not a floor; HOLD: this
-- call holds the key (see "Awaited share").
local AWAIT, HOLD
-- BORN is the data set's birth (µs) with the restart guard on (WAIT > 0);
-- GEN its generation as this call leaves it (so far); GENSEEN the highest
-- the caller has seen; REBORN is set when this call re-birthed it (see
-- Rollback above).
local BORN, GEN, GENSEEN, REBORN
-- GENJUMP is how far the generation jumps past the one passed when the
-- born sentinel is written (2^32; generations stay below 2^53).
local GENJUMP = 4294967296
-- SENT is nil in a script of one key. In a batch (batch.lua) it holds the
-- born sentinels and generations its calls have read or written, by key
-- name (false: missing), and SENTDIRTY those its calls wrote: the batch's
-- keys share one data set (batch.lua groups them so), so the batch reads
-- each once and writes each once, at its end (flush_sentinels), with the
-- value its last call left. The batch runs atomically, so no other call
-- can see or change them in between: every key's call reads and replies
-- exactly what it would alone, in the batch's order, and the data set
-- after the batch is the same.
local SENT, SENTDIRTY

local function f6(x) return string.format('%.6f', x) end
local function f17(x) return string.format('%.17g', x) end
local function i0(x) return string.format('%.0f', x) end

-- B is the key's bucket, read by load_bucket.
local B
-- RECLAIMED counts tokens this call returned to the bucket from expired
-- leases (for the regional service's reclaimed-tokens metric).
local RECLAIMED
-- STAMP is set when the born sentinel is missing: this call's NOW is the
-- data set's birth, written with the first bucket the call saves.
local STAMP
-- LEASES is set when this call wrote a lease record or the expiry set.
local LEASES
-- LN is the key's lease records (the bucket's n, kept as records come and
-- go); LN0 is LN as loaded. XE is the bucket's xe (nil: not known), XE0
-- as loaded.
local LN, LN0, XE, XE0
-- STORED[i] is the bucket's i-th field (BUCKET_FIELDS) as stored now
-- (false: not stored), STOREDXE its xe: loaded, then kept by save_bucket,
-- which writes only the fields whose text changes.
local STORED, STOREDXE = {}, false
local BUCKET_FIELDS = { 't', 'ts', 'gr', 'gb', 'ge', 'out', 'adm', 'den', 'gs', 'dr', 'sd', 'rm', 'rl' }
-- BUCKET_FORMATS formats each field as it is stored.
local BUCKET_FORMATS = { f6, i0, f17, f17, i0, i0, i0, i0, i0, i0, i0, f17, f6 }

local function grant_valid(t) return B.ge > t end
local function rate_now() if grant_valid(NOW) then return B.gr end return SR end
local function cap_now() if grant_valid(NOW) then return B.gb end return SB end

-- Refill is exact. tk holds whole micro-tokens (the storage's '%.6f'); rm
-- carries the fraction of a micro-token earned but not yet credited, so no
-- call pattern gains or loses refill to rounding: dt µs at r tokens/s earn
-- dt x r micro-tokens, and accrue credits the floor of the exact value of
-- that product plus rm (Dekker's error-free product and Knuth's error-free
-- sum find the floor even where the rounded product is a whole number just
-- above the exact one), carrying the rest, shaved by a relative 2^-50, as
-- the new rm. Whatever the clock does, credit never exceeds the integral of
-- the rate over the elapsed Redis time.
local TWO53 = 9007199254740992   -- 2^53
local SHAVE = 1 / 1125899906842624  -- 2^-50
local SPLIT = 134217729  -- 2^27 + 1
-- MAXMS bounds every TTL and wait in ms (2^43, 278 years: PEXPIRE accepts
-- it, and it fits Go's time.Duration); a wait beyond it is 'never'.
local MAXMS = 8796093022208

local function snap(x) return tonumber(f6(x)) end

-- two_prod returns p = a x b rounded and e with p + e = a x b exactly.
local function two_prod(a, b)
  local p = a * b
  local c = SPLIT * a
  local ah = c - (c - a)
  local al = a - ah
  c = SPLIT * b
  local bh = c - (c - b)
  local bl = b - bh
  return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl
end

-- two_sum returns s = a + b rounded and g with s + g = a + b exactly.
local function two_sum(a, b)
  local s = a + b
  local bb = s - a
  return s, (a - (s - bb)) + (b - bb)
end

-- accrue returns n, the whole micro-tokens in dt x r + rm (exact floor),
-- and the fraction to carry (never above the exact rest). A product of
-- 2^53 micro-tokens or more fills any cap the config accepts: it comes back
-- whole, with nothing to carry.
local function accrue(dt, r, rm)
  local p, e = two_prod(dt, r)
  if not (p < TWO53) then return p, 0 end
  local x, g = two_sum(p, rm)
  local d = g + e
  local n = math.floor(x)
  if n == x and d < 0 then n = n - 1 end
  local y = (x - n) + d
  y = y - y * SHAVE
  if y < 0 then y = 0 end
  return n, y
end

-- room is what the bucket may hold: cap - out at the storage's resolution
-- (so a cap a hair below a whole number, as static shares shrunk by 1e-12
-- are, does not cost a whole token: the bucket may hold up to half a
-- micro-token above cap - out, never more, and never more over time).
local function room_of(cap)
  local c = cap - B.out
  if c < 0 then c = 0 end
  return snap(c)
end
local function room() return room_of(cap_now()) end

-- clamp caps tk at room(); a bucket at its cap carries no fraction, also
-- when it reached the cap exactly: a fraction earned while full was never
-- earned, and carried it would be credited once the bucket is spent from
-- (up to a micro-token more than b + r x t each time the bucket fills).
local function clamp_to(c)
  if B.tk >= c then
    B.tk = c
    B.rm = 0
  end
end
local function clamp() clamp_to(room()) end

-- migrate moves a bucket of older scripts into this layout (see
-- "Layouts"): their lease records from KEYS[2] into the bucket, 'tk' to
-- 't' (tk is its stored value). Written at once, so the key is consistent
-- whatever the call does next.
local function migrate(tk)
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do
    redis.call('HSET', KEYS[1], '#' .. all[i], all[i + 1])
  end
  LN = #all / 2
  redis.call('DEL', KEYS[2])
  redis.call('HDEL', KEYS[1], 'tk')
  if LN > 0 then
    redis.call('HSET', KEYS[1], 't', tk, 'n', LN)
  else
    redis.call('HSET', KEYS[1], 't', tk)
  end
end

local function load_bucket()
  LN = 0
  local raw = redis.call('HMGET', KEYS[1], 't', 'ts', 'gr', 'gb', 'ge', 'out', 'adm', 'den', 'gs', 'dr', 'sd', 'rm', 'n', 'tk', 'xe', 'rl')
  if raw[2] and WAIT > 0 and tonumber(raw[2]) < BORN + WAIT * 1000 then
    -- Older than its data set's birth (see Rollback): written before a
    -- re-birth, its tokens and leases are those of a history that was
    -- lost. Gone, with its lease records and expiry set, it is a bucket
    -- missing from the newly born data set.
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
    raw = {}
  elseif raw[2] and raw[14] then
    migrate(raw[14])
    raw[1] = raw[14]
  end
  LN = tonumber(raw[13]) or LN
  LN0 = LN
  for i = 1, 12 do STORED[i] = raw[i] or false end
  STORED[13] = raw[16] or false
  STOREDXE = raw[15] or false
  XE = tonumber(raw[15])
  if XE and raw[2] then XE = tonumber(raw[2]) + XE * 1000 else XE = nil end
  XE0 = XE
  if not raw[2] then
    -- A missing bucket is trusted to be full only when its data set is old
    -- enough that every lease issued before the data set was born has
    -- ended: then it is as if the bucket had been empty since born + wait
    -- and had refilled at the static rate (refill credits it). A key that
    -- merely idled out is always full (its TTL is at least 2 x burst /
    -- rate; at a cap of 0, twice its share's fill time: see bucket_ttl).
    -- Created before born + wait (inside the restart wait), it
    -- starts empty and earns nothing until the wait ends: ts stays there,
    -- in the future, and refill credits nothing while NOW < ts.
    -- The birth is read by begin, in the same atomic call, from the data
    -- set the bucket will live in: a Redis (or a cluster node) that
    -- restarted empty has lost its sentinel with the buckets, so the first
    -- bucket created in it dates the data set from NOW, whatever the
    -- caller believed before the restart.
    -- A held key's demand (a hash without ts, see "Awaited share") goes
    -- on in the bucket.
    B.missing = true
    B.gr, B.gb, B.ge, B.out, B.adm, B.gs, B.dr = 0, 0, 0, 0, 0, 0, 0
    B.den, B.sd = tonumber(raw[8]) or 0, tonumber(raw[11]) or 0
    B.tk, B.rm, B.rl = 0, 0, 0
    B.ts = BORN + WAIT * 1000
    return
  end
  -- A field left out is 0 (see save_bucket).
  B.tk = tonumber(raw[1]) or 0
  B.ts = tonumber(raw[2])
  B.gr = tonumber(raw[3]) or 0
  B.gb = tonumber(raw[4]) or 0
  B.ge = tonumber(raw[5]) or 0
  B.out = tonumber(raw[6]) or 0
  B.adm = tonumber(raw[7]) or 0
  B.den = tonumber(raw[8]) or 0
  B.gs = tonumber(raw[9]) or 0
  B.dr = tonumber(raw[10]) or 0
  B.sd = tonumber(raw[11]) or 0
  B.rm = tonumber(raw[12]) or 0
  B.rl = tonumber(raw[16]) or 0
end

-- sentinel reads KEYS[i] (the born sentinel or the generation): from
-- Redis in a script of one key, through SENT in a batch. Two GETs, not
-- one MGET: the least-privilege ACL of docs/operations.md ("Redis
-- access") grants GET.
local function sentinel(i)
  if not SENT then return redis.call('GET', KEYS[i]) end
  local k = KEYS[i]
  local v = SENT[k]
  if v == nil then
    v = redis.call('GET', k)
    SENT[k] = v
  end
  return v
end

-- set_sentinel writes v to KEYS[i]: at once, or in a batch into SENT,
-- written at the batch's end.
local function set_sentinel(i, v)
  local k = KEYS[i]
  if not SENT then
    redis.call('SET', k, v)
    return
  end
  SENT[k] = v
  SENTDIRTY[k] = true
end

-- flush_sentinels ends a batch: writes each sentinel its calls wrote.
local function flush_sentinels()
  local ks = {}
  for k in pairs(SENTDIRTY) do ks[#ks + 1] = k end
  table.sort(ks)
  for _, k in ipairs(ks) do redis.call('SET', k, SENT[k]) end
end

-- load_born reads the data set's birth and generation (restart guard on)
-- and re-births a data set found gone back in time (see Rollback above).
-- A missing sentinel is dated NOW and written with the first bucket the
-- call saves (STAMP).
local function load_born()
  BORN, GEN, REBORN = 0, 0, false
  if WAIT <= 0 then return end
  BORN = tonumber(sentinel(4))
  GEN = tonumber(sentinel(6))
  if not BORN then
    BORN = NOW
    STAMP = true
  elseif (not GEN and GENSEEN > 0) or (GEN and GEN < GENSEEN) then
    BORN = NOW
    GEN = GENSEEN + GENJUMP
    REBORN = true
    set_sentinel(4, i0(BORN))
    set_sentinel(6, i0(GEN))
  end
  GEN = GEN or 0
end

-- credit adds dt µs of refill at rate r (see accrue).
local function credit(dt, r)
  local n, rm = accrue(dt, r, B.rm)
  B.tk = snap(B.tk + n / 1000000)
  B.rm = rm
end

-- refill credits elapsed time piecewise: at the granted rate while the grant
-- was valid, then at the floor until the rise (see "Coming back from a
-- floor"), then at the static rate; each piece capped by its own cap. A
-- clock that went backwards credits nothing and keeps ts (no double credit).
local function refill()
  local t = B.ts
  if NOW > t then
    if B.ge > t then
      local e = B.ge
      if e > NOW then e = NOW end
      credit(e - t, B.gr)
      clamp_to(room_of(B.gb))
      t = e
    end
    if RISE > t and NOW > t then
      local e = RISE
      if e > NOW then e = NOW end
      credit(e - t, FR)
      clamp_to(room_of(FB))
      t = e
    end
    if NOW > t then credit(NOW - t, SR) end
    B.ts = NOW
  end
  clamp()
  B.tk = snap(B.tk)
end

-- Lease records are written compact: '~', then the thirteen numbers g u r
-- seq exp lg lt pd dr au ad ar le and the incarnation's high and low ten
-- decimal digits, each an unsigned base-128 varint (low group first, high
-- bit = more follows). A typical record is about 45 bytes, so a lease hash
-- stays a listpack (values of at most 64 bytes) instead of a hash table.
-- A record whose numbers are not all whole, non-negative and below 2^53,
-- or whose incarnation is not a canonical decimal of at most 20 digits, is
-- written as text (the fourteen decimals, space-separated); records of
-- older scripts are text too. parse_lease reads every form.
local COMPACT = 126 -- '~'

local function compactable(x) return x >= 0 and x < TWO53 and x == math.floor(x) end

-- put_uv appends x's varint bytes to t.
local function put_uv(t, x)
  while x >= 128 do
    local q = math.floor(x / 128)
    t[#t + 1] = 128 + (x - q * 128)
    x = q
  end
  t[#t + 1] = x
end

-- lease_record renders L for the lease hash.
local function lease_record(L)
  local nums = { L.g, L.u, L.r, L.seq, L.exp, L.lg, L.lt, L.pd, L.dr, L.au, L.ad, L.ar, L.le }
  local inc = L.inc
  local ok = #inc <= 20 and (inc == '0' or string.match(inc, '^[1-9]%d*$') ~= nil)
  for i = 1, 13 do
    if not ok then break end
    ok = compactable(nums[i])
  end
  if not ok then
    return i0(L.g) .. ' ' .. i0(L.u) .. ' ' .. i0(L.r) .. ' ' .. i0(L.seq) .. ' ' .. i0(L.exp) .. ' ' .. i0(L.lg)
      .. ' ' .. i0(L.lt) .. ' ' .. i0(L.pd) .. ' ' .. i0(L.dr) .. ' ' .. i0(L.au) .. ' ' .. i0(L.ad) .. ' ' .. i0(L.ar) .. ' ' .. i0(L.le) .. ' ' .. inc
  end
  local t = { COMPACT }
  for i = 1, 13 do put_uv(t, nums[i]) end
  if #inc > 10 then
    put_uv(t, tonumber(string.sub(inc, 1, #inc - 10)))
    put_uv(t, tonumber(string.sub(inc, -10)))
  else
    put_uv(t, 0)
    put_uv(t, tonumber(inc))
  end
  return string.char(unpack(t))
end

-- varints reads the unsigned varints of a compact record (after its
-- marker, up to byte last), stopping after count numbers.
local function varints(rec, last, count)
  local v, x, m = {}, 0, 1
  local bytes = { string.byte(rec, 2, last) }
  for i = 1, #bytes do
    local b = bytes[i]
    if b >= 128 then
      x = x + (b - 128) * m
      m = m * 128
    else
      v[#v + 1] = x + b * m
      if #v == count then return v end
      x, m = 0, 1
    end
  end
  return v
end

-- parse_compact reads a compact record.
local function parse_compact(rec)
  local v = varints(rec, -1, 15)
  local inc = i0(v[15])
  if v[14] > 0 then inc = i0(v[14]) .. string.format('%010.0f', v[15]) end
  return { g = v[1], u = v[2], r = v[3], seq = v[4], exp = v[5], lg = v[6], lt = v[7], pd = v[8], dr = v[9],
    au = v[10], ad = v[11], ar = v[12], le = v[13], inc = inc }
end

-- lease_exp reads only a record's expiry (its fifth number).
local function lease_exp(rec)
  if string.byte(rec, 1) ~= COMPACT then return tonumber(string.match(rec, '^%S+ %S+ %S+ %S+ (%S+)')) end
  local v = varints(rec, 48, 5)
  if #v == 5 then return v[5] end
  return parse_compact(rec).exp
end

-- parse_lease reads a record; au, ad, ar and inc are nil in an older
-- record (no fingerprint).
local function parse_lease(rec)
  if string.byte(rec, 1) == COMPACT then return parse_compact(rec) end
  local g, u, r, seq, exp, lg, lt, pd, dr, au, ad, ar, le, inc = string.match(rec,
    '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  if not g then
    g, u, r, seq, exp, lg, lt, pd, dr = string.match(rec, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  end
  if not g then
    g, u, r, seq, exp, lg = string.match(rec, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
    lt, pd, dr = 0, 0, 0
  end
  return { g = tonumber(g), u = tonumber(u), r = tonumber(r), seq = tonumber(seq), exp = tonumber(exp), lg = tonumber(lg),
    lt = tonumber(lt), pd = tonumber(pd), dr = tonumber(dr), au = tonumber(au), ad = tonumber(ad), ar = tonumber(ar), le = tonumber(le), inc = inc }
end

-- The expiry set. A key with at most FEWLEASES leases keeps none: reaping
-- reads its few records (bounded work), and the set's key, which costs
-- more memory than the records it would index, does not exist. With more,
-- KEYS[3] holds every record's expiry, so reaping reads only expired ones.
-- The set is made from the records when a record is added beyond
-- FEWLEASES, and deleted when a drop leaves FEWLEASES or fewer. A set that
-- does not hold exactly the records while there are more (one that older
-- scripts, which kept a set however few the leases, wrote during a rolling
-- upgrade) is rebuilt from them before it is trusted: O(leases) once, then
-- O(1) again.
local FEWLEASES = 4

-- records calls f(id, record) for each lease record of the bucket.
local function records(f)
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local name = all[i]
    if string.byte(name, 1) == 35 then -- '#'
      f(string.sub(name, 2), all[i + 1])
    end
  end
end

-- reindex rebuilds the expiry set from the lease records.
local function reindex()
  LEASES = true
  redis.call('DEL', KEYS[3])
  records(function(id, rec)
    redis.call('ZADD', KEYS[3], lease_exp(rec), id)
  end)
end

-- index files the expiry of the record just saved for id.
local function index(id, exp)
  local n = LN
  if n <= FEWLEASES then
    redis.call('DEL', KEYS[3])
    return
  end
  redis.call('ZADD', KEYS[3], exp, id)
  if redis.call('ZCARD', KEYS[3]) ~= n then reindex() end
end

-- unindex takes id's record, just deleted, out of the expiry set.
local function unindex(id)
  if LN <= FEWLEASES then
    redis.call('DEL', KEYS[3])
  else
    redis.call('ZREM', KEYS[3], id)
  end
end

local function save_lease(id, L)
  LEASES = true
  LN = LN + redis.call('HSET', KEYS[1], '#' .. id, lease_record(L))
  if not XE or L.exp < XE then XE = L.exp end
  index(id, L.exp)
end

-- put_back returns n unspent tokens of a lease that ended at ended (µs:
-- its expiry, or now for a live one) to the bucket, up to room(). A lease
-- that ended at or before the rise ended while the region was on its floor
-- (see "Coming back from a floor"): a call then would have put its tokens
-- back into a bucket capped at the floor's burst, so they fill the bucket
-- at most to room_of(FB) (never taking away what it held). Reaped only by
-- the first call after the rise (the key idled across the floor), they
-- would otherwise come back at the static cap: tokens the global tier gave
-- the other regions meanwhile.
local function put_back(n, ended)
  local tk = B.tk + n
  if RISE > 0 and ended <= RISE then
    local c = room_of(FB)
    if tk > c then
      if B.tk > c then tk = B.tk else tk = c end
    end
  end
  B.tk = tk
  -- Tokens above a grant's cap are released: the region leader reports
  -- them and the global tier may hand them on (docs/architecture.md,
  -- "Burst transfer"). Above a static share they are simply gone.
  local before = B.tk
  clamp()
  if before > B.tk and grant_valid(NOW) then B.rl = snap(B.rl + (before - B.tk)) end
end

-- drop_lease removes a lease; its unspent tokens go back to the bucket when
-- give_back is true. Returns the tokens given back.
local function drop_lease(id, L, give_back)
  local unspent = L.g - L.u - L.r
  if unspent < 0 then unspent = 0 end
  B.out = B.out - unspent
  if B.out < 0 then B.out = 0 end
  B.dr = B.dr - L.dr
  if B.dr < 0 then B.dr = 0 end
  LN = LN - redis.call('HDEL', KEYS[1], '#' .. id)
  unindex(id)
  LEASES = true
  if give_back and unspent > 0 then
    put_back(unspent, math.min(L.exp, NOW))
    return unspent
  end
  return 0
end

-- id_less orders instance ids byte by byte, as a sorted set orders its
-- members (Lua's own string order follows the server's locale).
local function id_less(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- expired_few lists the ids of at most max expired leases of a key with
-- few (see FEWLEASES), read from the records, in the expiry set's order.
-- Reading the records means reading every field of the bucket hash, so
-- it is done only once NOW reaches XE, a lower bound of every record's
-- expiry (each record saved lowers it to its own), and it sets XE to the
-- earliest expiry of the records it leaves: of a live one, or of an
-- expired one past max. A call in a lease's life reads the records about
-- once a lease TTL instead of every time.
local function expired_few(max)
  if XE and NOW < XE then return {} end
  local due, low = {}, nil
  records(function(id, rec)
    local exp = lease_exp(rec)
    if exp <= NOW then
      due[#due + 1] = { id = id, exp = exp }
    elseif not low or exp < low then
      low = exp
    end
  end)
  table.sort(due, function(a, b)
    if a.exp ~= b.exp then return a.exp < b.exp end
    return id_less(a.id, b.id)
  end)
  local ids = {}
  for i = 1, math.min(max, #due) do ids[i] = due[i].id end
  if #due > max then low = due[max + 1].exp end
  XE = low
  return ids
end

-- reap drops at most max expired leases, oldest first (ties by id, as the
-- sorted set orders them). Returns leases reaped and tokens given back.
local function reap(max)
  -- No record, nothing to reap (and no need to read the bucket's fields).
  if max <= 0 or LN == 0 then return 0, 0 end
  local ids
  local n = LN
  if n <= FEWLEASES then
    ids = expired_few(max)
  else
    if redis.call('ZCARD', KEYS[3]) ~= n then reindex() end
    ids = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', NOW, 'LIMIT', 0, max)
  end
  local back = 0
  for _, id in ipairs(ids) do
    local rec = redis.call('HGET', KEYS[1], '#' .. id)
    if rec then
      local d = drop_lease(id, parse_lease(rec), RECLAIM)
      back = back + d
      RECLAIMED = RECLAIMED + d
    else
      redis.call('ZREM', KEYS[3], id)
      LEASES = true
    end
  end
  return #ids, back
end

-- own_lease loads an instance's lease, reaping it first when it expired.
local function own_lease(id)
  local rec = redis.call('HGET', KEYS[1], '#' .. id)
  if not rec then return nil end
  local L = parse_lease(rec)
  if L.exp <= NOW then
    RECLAIMED = RECLAIMED + drop_lease(id, L, RECLAIM)
    return nil
  end
  return L
end

-- demand_moved says whether got tokens of demand over an open window are a
-- change from expect, the tokens the lease's last rate would bring over
-- it: they differ by more than the smaller of the two (a factor of two)
-- and by more than three standard deviations of a Poisson count at the
-- larger. Such a window closes from a fifth of DWIN on (apply_usage).
local function demand_moved(got, expect)
  local hi, lo = got, expect
  if lo > hi then hi, lo = expect, got end
  local noise = 3 * math.sqrt(hi)
  if lo > noise then noise = lo end
  return hi - lo > noise
end

-- apply_usage books a report's used and returned tokens against the lease.
-- An instance cannot use or return more than the lease shows unspent (it
-- may report use from a lease already reaped): the excess only feeds the
-- demand counters and the lease's demand window. built is when the
-- instance built the report on its own clock (µs; 0 = not given: NOW
-- stands in). Returns the tokens actually put back.
local function apply_usage(L, used, denied, returned, built)
  local unspent = L.g - L.u - L.r
  local ue = used
  if ue > unspent then ue = unspent end
  if ue < 0 then ue = 0 end
  unspent = unspent - ue
  local re = returned
  if re > unspent then re = unspent end
  if re < 0 then re = 0 end
  L.u = L.u + ue
  L.r = L.r + re
  B.out = B.out - ue - re
  if B.out < 0 then B.out = 0 end
  B.adm = B.adm + used
  B.den = B.den + denied
  local at = NOW
  if built > 0 then at = built end
  if L.lt <= 0 or at < L.lt then
    -- No window open (a new lease, an older record) or a clock that went
    -- back: open one now; what this report brings covers an unknown time.
    L.lt, L.pd = at, 0
  else
    L.pd = L.pd + used + denied
    local span = at - L.lt
    if span >= DWIN or (span >= DWIN / 5 and demand_moved(L.pd, L.dr * span / 1000000000)) then
      local dr = math.floor(L.pd * 1000000000 / span + 0.5)
      B.dr = B.dr + dr - L.dr
      if B.dr < 0 then B.dr = 0 end
      L.dr, L.lt, L.pd = dr, at, 0
    end
  end
  if re > 0 then put_back(re, NOW) end
  return re
end

-- wait_ms is how long until the bucket holds need tokens at the current
-- rate (ceil, ms), or -1 for never: when need is above what the bucket can
-- ever hold at its current cap (room: cap - out), when the rate is
-- (practically) zero (below a billionth of a token per second), or when
-- the wait would not fit any clock (MAXMS). The wait is checked against
-- accrue, so the bucket does hold need by then, unless the rate or the
-- cap changes.
local function wait_ms(need)
  local short = need - B.tk
  if short <= 0 then return 0 end
  if need > room() then return -1 end
  local r = rate_now()
  if r < 1e-9 then return -1 end
  local w = math.ceil(short * 1000 / r)
  if not (w < MAXMS) then return -1 end
  if accrue(w * 1000, r, B.rm) < math.floor(short * 1000000 + 0.5) then w = w + 1 end
  -- Refill starts at ts: after a data loss, the end of the restart wait.
  if B.ts > NOW then w = w + math.ceil((B.ts - NOW) / 1000) end
  if not (w < MAXMS) then return -1 end
  return w
end

-- retry_ms is the wait a refused request is told (wait_ms(need)), cut at
-- the end of the grant in force: the rate after it is not known here (the
-- global tier's next grant, the static share or the floor), so a wait
-- worked out at the grant's rate says nothing past its end. The cut
-- matters when a grant left the region a sliver of the key's rate (its
-- share lent to regions whose demand the global tier heard first, or a
-- data set lost with the demand that earned the share): a request would
-- otherwise wait out the sliver's refill, tens of seconds to hours, while
-- the share comes back within a few of the global tier's answers. A
-- request refused at the cut is answered anew.
-- A grant below the static share is such a loan: the region's demand,
-- which this refusal raises, wins the share back at the global tier's
-- next answers (a rise is reported between epochs), well before a grant
-- of a full validity ends. So under it the wait is cut at one refresh
-- (twice DWIN), when the key's leases ask again anyway: an instance told
-- the grant's end refused requests for seconds with the share back in the
-- bucket. A region kept below its share (drained, or on its floor) is
-- asked once a refresh per refused key, as its leases ask.
local function retry_ms(need)
  local w = wait_ms(need)
  if w > 0 and grant_valid(NOW) then
    local left = math.ceil((B.ge - NOW) / 1000)
    if B.gr < SR then
      local back = math.ceil(2 * DWIN / 1000)
      if back < left then left = back end
    end
    if left < w then w = left end
  end
  return w
end

-- giveback_ms is when an instance refused need tokens may expect them
-- from its peers (ms), or -1 when not: tokens out in the other live
-- leases above what their holders keep at their next Sync come back at it.
-- An instance holds at most max(1, floor(cap / 2n)) of a key that n live
-- leases share (the lease client's batch cap; a lone instance may hold the
-- whole burst) and gives back a pool above it at its next Sync, at most one
-- refresh away: twice the demand window (DWIN is half the refresh). So
-- when the bucket and that excess cover need, the wait is about one
-- refresh, not the bucket's refill of need, which on a slow key (7 an
-- hour) is minutes the instance would wait while its peer gives back. It
-- is the region's best reading, not a promise the bucket keeps: tokens
-- reported out may have been spent since, and a retry then is answered
-- anew. live counts this instance's record; L is its lease.
local function giveback_ms(need, L, live)
  if live < 2 then return -1 end
  local keep = math.floor(cap_now() / (2 * live))
  if keep < 1 then keep = 1 end
  local own = L.g - L.u - L.r
  if own < 0 then own = 0 end
  local due = B.out - own - (live - 1) * keep
  if due <= 0 or math.floor(B.tk) + due < need then return -1 end
  return math.ceil(2 * DWIN / 1000)
end

-- reset_ms is how long until the bucket is full again (ceil, ms).
local function reset_ms()
  return wait_ms(room())
end

-- bucket_ttl is the TTL (ms, as an integer string) of a key under a grant
-- of cap gb valid until ge: idle keys disappear, but never before a
-- recreated bucket would be correct, and the lease keys never before the
-- bucket while leases hold unspent tokens (their reaping must reach it):
-- the grant's remaining validity plus two full refills at the static rate
-- (the rate after the grant ends), and at least 2 x lease TTL (every lease
-- dead). At most MAXMS (so PEXPIRE never refuses it; the config bounds
-- keep real keys far below), formatted as an integer: a large Lua number
-- would otherwise reach Redis in exponent form.
--
-- A static cap of 0 (a floor of 0: drained, or off the static lease at a
-- partition_share that leaves the key nothing; or a share awaited) holds
-- nothing once the grant ends, so a bucket recreated at it, empty, is what
-- the old one is; the refills of the cap are no bound then (at a static
-- rate of 0 they were a division by zero: MAXMS, so every key a drained
-- region served stayed for good). The bound is the share coming back: the
-- old bucket refills from its ts at the share's rate, a recreated one is
-- born full (as a key the region never saw is). They agree once the old
-- one is at least the share's fill time old: so at a cap of 0 the key
-- lives twice FILL (the share's burst over its rate, which the caller
-- knows and the floor hides) after the grant, at least 2 x lease TTL.
-- Without FILL (0: tests, tools) it lives 2 x lease TTL. A static rate of
-- 0 under a cap above 0 (no caller passes one) never refills it: a
-- recreated bucket, full, would hold more than the old one ever again,
-- so such a key keeps MAXMS.
local function bucket_ttl(gb, ge)
  local capmax = SB
  local gleft = 0
  if ge > NOW then
    if gb > capmax then capmax = gb end
    gleft = math.ceil((ge - NOW) / 1000)
  end
  local refills = 0
  if SR > 0 then
    refills = math.ceil(2000 * capmax / SR)
  elseif SB > 0 then
    refills = MAXMS
  end
  if SB <= 0 and refills < 2 * FILL then refills = 2 * FILL end
  local ttl = gleft + refills
  if ttl < 2 * LTTL then ttl = 2 * LTTL end
  ttl = ttl + 1000
  if not (ttl < MAXMS) then ttl = MAXMS end
  return i0(ttl)
end

-- renew_ttls sets the keys' TTLs to ttl: the bucket's (its lease records
-- with it) and the expiry set's, which thus lives exactly as long as the
-- records it indexes. Alone (ttl = TTL), it is the region leader's state
-- read of a key on which it changed nothing but the refill (see
-- state.lua): the stored bucket stays as it was, so the next call refills
-- from the stored ts, exactly as if the read had not happened.
local TTL
local function renew_ttls(ttl)
  redis.call('PEXPIRE', KEYS[1], ttl)
  if LN > FEWLEASES then
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
end

-- save_bucket writes the bucket and sets the keys' TTLs. ttl defaults to
-- TTL, computed before the script's first write (Redis does not roll a
-- script back: nothing a write needs may fail after another write).
local function save_bucket(ttl)
  ttl = ttl or TTL
  if STAMP then
    set_sentinel(4, i0(NOW))
    STAMP = false
    if GENSEEN > GEN then GEN = GENSEEN end
    GEN = GEN + GENJUMP
  end
  if WAIT > 0 then
    GEN = GEN + 1
    set_sentinel(6, i0(GEN))
  end
  -- n and xe only while there are records: a bucket without leases (the
  -- strict path, an idle key) keeps no field for them. xe is stored in
  -- whole ms after ts, rounded down (still a lower bound, and a small
  -- integer in the listpack), so it is written with every ts.
  if LN == 0 then XE = nil end
  -- A field that is 0 and was not stored is left out (it reads as 0): a
  -- bucket without grant, denials, strict decisions or a fraction keeps
  -- no field for them. One stored stays, so the hash never needs a
  -- delete. ts is always stored: a hash without it is no bucket. A field
  -- whose text is what is stored is not written again (an install leaves
  -- the demand counters as they were; each field written costs Redis a
  -- search and a rewrite of the hash's listpack).
  local nums = { B.tk, B.ts, B.gr, B.gb, B.ge, B.out, B.adm, B.den, B.gs, B.dr, B.sd, B.rm, B.rl }
  local args = {}
  for i = 1, 13 do
    local was = STORED[i]
    if i == 2 or nums[i] ~= 0 or was then
      local v = BUCKET_FORMATS[i](nums[i])
      if v ~= was then
        args[#args + 1] = BUCKET_FIELDS[i]
        args[#args + 1] = v
        STORED[i] = v
      end
    end
  end
  if XE then
    XE = B.ts + math.floor((XE - B.ts) / 1000) * 1000
    local v = i0((XE - B.ts) / 1000)
    if v ~= STOREDXE then
      args[#args + 1] = 'xe'
      args[#args + 1] = v
      STOREDXE = v
    end
  end
  if LN > 0 and LN ~= LN0 then
    args[#args + 1] = 'n'
    args[#args + 1] = LN
  end
  if #args > 0 then redis.call('HSET', KEYS[1], unpack(args)) end
  if LN == 0 and LN0 > 0 then redis.call('HDEL', KEYS[1], 'n') end
  if not XE and XE0 then
    redis.call('HDEL', KEYS[1], 'xe')
    STOREDXE = false
  end
  LN0 = LN
  XE0 = XE
  renew_ttls(ttl)
end

-- save_held writes a held call's demand (see "Awaited share"): the demand
-- fields alone, no ts, so every script still finds the bucket missing. No
-- token is stored, so neither the born sentinel nor the generation is
-- written. It lives as long as a bucket lives at the least (2 x lease TTL
-- + 1 s): long enough for the region leader's readings of it.
local function save_held()
  redis.call('HSET', KEYS[1], 'sd', i0(B.sd), 'den', i0(B.den))
  local ttl = 2 * LTTL + 1000
  if not (ttl < MAXMS) then ttl = MAXMS end
  redis.call('PEXPIRE', KEYS[1], i0(ttl))
end

-- Candidates. The region leader reports to the global tier only the keys
-- that need it, and never scans the key space to find them: the scripts
-- that apply demand or grants mark such a key into its slot's candidate
-- set (KEYS[5]) and the leader reads that set each epoch. A key needs the
-- global tier when its demand reading reaches half the region's static
-- share (the global tier can only be needed once some region's demand
-- exceeds its share; half leaves room for demand to double between two
-- readings before the allocator hears of it), or while it holds a grant
-- (the allocator needs the region's echo of it to move capacity), and for
-- the leader's horizon after the grant ends. The demand reading is the
-- live leases' dr plus the strict path's decisions per second over the
-- last mark window. The work is O(1): nothing for a key served by leases
-- alone below half its share; else one HMGET of two bucket fields per
-- call, and, at most once per mark interval (a fraction of an epoch), one
-- HSET of them and at most one ZADD. Fields of the bucket hash (only on
-- keys the strict path served or that were hot or granted):
--   cw  start of the current mark window (µs; missing = 0)
--   cs  sd at cw (missing = 0)
-- The score is when the key stops needing the global tier: now for a
-- demand mark, the grant's expiry for a granted key; ZADD GT never lowers
-- it, so a demand mark never shortens a grant's.
local CAND_MEMBER, MARKEVERY

-- cand_mark marks the key as a candidate until score (µs).
local function cand_mark(score)
  redis.call('ZADD', KEYS[5], 'GT', i0(score), CAND_MEMBER)
end

-- cand_check is called by the scripts that apply demand (acquire, sync,
-- release, check) right before they save the bucket: at most once per
-- mark interval it reads the key's demand and marks the key when it needs
-- the global tier.
local function cand_check()
  if MARKEVERY <= 0 then return end
  -- A key served by leases alone (sd = 0) whose leases ask for nothing or
  -- less than half its share and that holds no grant reads and writes
  -- nothing more. (On its floor a region's share may be 0: only demand
  -- above nothing counts.)
  if B.sd == 0 and not (B.dr > 0 and B.dr / 1000 >= SR / 2) and not (B.ge > NOW) then return end
  local c = redis.call('HMGET', KEYS[1], 'cw', 'cs')
  local cw, cs = tonumber(c[1]) or 0, tonumber(c[2]) or 0
  if NOW - cw < MARKEVERY then return end
  local strict = 0
  if B.sd > cs then strict = (B.sd - cs) * 1000000 / (NOW - cw) end
  redis.call('HSET', KEYS[1], 'cw', i0(NOW), 'cs', i0(B.sd))
  if B.ge > NOW then
    cand_mark(B.ge)
  elseif B.dr / 1000 + strict > 0 and B.dr / 1000 + strict >= SR / 2 then
    cand_mark(NOW)
  end
end

-- cand_granted marks a key whose grant set_rate just installed (valid
-- until exp): the allocator is owed an acknowledgement, and the region
-- reports the key while the grant lasts.
local function cand_granted(exp)
  if MARKEVERY <= 0 then return end
  if exp < NOW then exp = NOW end
  cand_mark(exp)
end

-- begin starts one key's call: its KEYS and ARGV (see the top of this
-- file), the call's state reset, the bucket loaded and brought up to now.
local function begin(keys, argv)
  KEYS, ARGV = keys, argv
  ARGC = argc()
  SR = tonumber(ARGV[1])
  SB = tonumber(ARGV[2])
  LTTL = tonumber(ARGV[3])
  RECLAIM = ARGV[4] == '1'
  WAIT = tonumber(ARGV[5])
  REAPMAX = tonumber(ARGV[6])
  DWIN = tonumber(ARGV[7]) * 1000
  FILL = tonumber(ARGV[ARGC - 5]) or 0
  RISE = tonumber(ARGV[ARGC - 8]) or 0
  FR = math.min(tonumber(ARGV[ARGC - 7]) or 0, SR)
  FB = math.min(tonumber(ARGV[ARGC - 6]) or 0, SB)
  NOW = clock()
  -- Too late: before anything is read or written (see Deadline above).
  DEADLINE = tonumber(ARGV[ARGC - 2]) or 0
  if DEADLINE > 0 and NOW > DEADLINE then
    error({ err = 'TOOLATE ' .. i0(NOW) .. ' ' .. i0(DEADLINE) })
  end
  B = {}
  RECLAIMED = 0
  STAMP = false
  LEASES = false
  CAND_MEMBER = ARGV[ARGC - 1]
  MARKEVERY = (tonumber(ARGV[ARGC]) or 0) * 1000
  GENSEEN = tonumber(ARGV[ARGC - 3]) or 0
  AWAIT = ARGV[ARGC - 4] == '1'
  load_born()
  load_bucket()
  refill()
  TTL = bucket_ttl(B.gb, B.ge)
  -- A missing bucket (no grant) at a static cap of 0 that is a share
  -- awaited, with no lease record: the call holds the key.
  HOLD = AWAIT and B.missing and SB == 0 and LN == 0
end

-- gen_reply appends the data set's generation after the call and reborn
-- (0|1) to a script's reply (see Rollback above).
local function gen_reply(r)
  r[#r + 1] = GEN
  if REBORN then r[#r + 1] = 1 else r[#r + 1] = 0 end
  return r
end

-- A report carries the instance's incarnation (a decimal string), its
-- lease number on the key (le: the seq of the lease's first report), its
-- seq, and the cumulative totals of the lease: tokens used, denied and
-- returned since the lease began. The record keeps the totals of the last
-- applied report, so each report books exactly what it adds to them,
-- whether or not an earlier report arrived.
--
-- report_kind classifies a report against the record L:
--   'new'       the lease's next report: book totals - applied totals
--   'retry'     the report last applied (same seq, same totals)
--   'stale'     an older report of this incarnation, superseded by the
--               one applied (or of an earlier lease than the record's)
--   'supersede' a later lease of this incarnation: the record is left over
--               from its earlier lease, whose final report never arrived
--   'conflict'  none of these: another process reports under this id (or
--               the record has no fingerprint); never answered with the
--               record's grant
local function report_kind(L, inc, le, seq, tu, td, tr)
  if L.inc == nil or L.inc ~= inc then return 'conflict' end
  if le > L.le then return 'supersede' end
  if le < L.le then return 'stale' end
  if seq > L.seq then
    if tu < L.au or td < L.ad or tr < L.ar then return 'conflict' end
    return 'new'
  end
  if seq == L.seq then
    if tu == L.au and td == L.ad and tr == L.ar then return 'retry' end
    return 'conflict'
  end
  if tu <= L.au and td <= L.ad and tr <= L.ar then return 'stale' end
  return 'conflict'
end

-- forfeit ends a lease whose holder cannot be trusted to report exactly
-- (a conflict, or a record its own instance has left behind): its unspent
-- tokens count as spent and never return to the bucket (under-admission,
-- never over-admission).
local function forfeit(id, L)
  drop_lease(id, L, false)
end

-- lease_carry gives a new lease the demand rate dr (milli-tokens/s) of the
-- record of the same instance it supersedes: the instance's demand did not
-- stop when its lease number changed, so the key's reading does not drop
-- to nothing until the new lease's first window closes. The new lease's
-- window opens at its first report as any new lease's does (the old
-- window's tail, in a final report that never arrived, is unknown), and
-- its first closed window replaces the carried rate.
local function lease_carry(L, dr)
  if dr <= 0 then return end
  L.dr = dr
  B.dr = B.dr + dr
end

-- lease_op applies one instance's report for this key and takes a new batch
-- (only when create is true may a lease record be opened: a strict class
-- keeps booking the leases it already has, and opens none).
-- A retry is answered with the original grant and the lease's remaining
-- validity (not a fresh TTL), so the instance's deadline, measured from the
-- retry's send time, still ends before the lease does; a stale report gets
-- nothing; a conflict forfeits the lease and grants nothing.
-- Reply: { granted, ttl_ms, remaining, retry_ms, rate, cap, live, reset_ms,
--          now_us, duplicate(0|1), reclaimed, conflict(0|1), returned,
--          generation, reborn(0|1) };
--          rate and cap as '%.17g' strings; reclaimed = tokens returned
--          from expired leases; returned = tokens the report gave back
--          that were put back in the bucket (apply_usage); retry_ms is
--          retry_ms(min), or giveback_ms when that is sooner.
local function lease_op(id, inc, le, seq, tu, td, tr, want, min, create, built)
  reap(REAPMAX)
  local L = own_lease(id)
  local granted, ttl, retry, dup, conflict, back = 0, LTTL, 0, 0, 0, 0
  local held = false
  local kind = 'new'
  if L then kind = report_kind(L, inc, le, seq, tu, td, tr) end
  -- carry: the demand rate a superseded record leaves to the lease that
  -- follows it (see lease_carry).
  local carry = 0
  if kind == 'supersede' then
    carry = L.dr
    forfeit(id, L)
    L = nil
    kind = 'new'
  end
  if kind == 'conflict' then
    forfeit(id, L)
    conflict, ttl = 1, 0
  elseif kind == 'retry' or kind == 'stale' then
    dup = 1
    if kind == 'retry' then granted = L.lg end
    ttl = math.floor((L.exp - NOW) / 1000)
  elseif HOLD and create and want > 0 then
    -- Held (see "Awaited share"): no lease and no bucket; what the
    -- request needs is the key's demand.
    if min < 1 then min = 1 end
    B.sd = B.sd + min
    retry = retry_ms(min)
    ttl = 0
    held = true
  elseif L or (create and want > 0) then
    if L then
      back = apply_usage(L, tu - L.au, td - L.ad, tr - L.ar, built)
    else
      -- A new lease starts from the report's totals: nothing to book yet.
      L = { g = 0, u = 0, r = 0, seq = 0, exp = 0, lg = 0, lt = 0, pd = 0, dr = 0 }
      apply_usage(L, 0, 0, 0, built)
      lease_carry(L, carry)
    end
    L.au, L.ad, L.ar, L.le, L.inc = tu, td, tr, le, inc
    if want > 0 then
      if min < 1 then min = 1 end
      local avail = math.floor(B.tk)
      if avail >= min then
        granted = want
        if granted > avail then granted = avail end
        B.tk = B.tk - granted
        B.out = B.out + granted
        L.g = L.g + granted
      else
        retry = retry_ms(min)
      end
    end
    L.seq = seq
    L.exp = NOW + LTTL * 1000
    L.lg = granted
    save_lease(id, L)
    if retry > 0 then
      local gb = giveback_ms(min, L, LN)
      if gb >= 0 and gb < retry then retry = gb end
    end
  else
    -- No lease to book against and nothing asked for: a report of a lease
    -- the region does not know (reaped, or never issued) can only undo,
    -- so it opens no record, and on a missing bucket writes nothing.
    ttl = 0
  end
  if L or not B.missing or LEASES then
    cand_check()
    save_bucket()
  elseif held then
    cand_check()
    save_held()
  end
  local live = LN
  return gen_reply({ granted, ttl, math.floor(B.tk), retry, f17(rate_now()), f17(cap_now()), live, reset_ms(), NOW, dup, RECLAIMED, conflict, back })
end

