package regional

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/regionsync"
)

// The static leases on the region's side, one per global-tier shard
// (shards.go). The region leader holds them (regional.Leader's leases) and
// stores each one's end in the region's Redis under its own key; every
// replica reads those keys and Redis TIME every quarter epoch and hands its
// scripts, per key, the static share while its conservative estimate of
// Redis time is before the end of the key's lease (regionsync.KeyLease,
// minus regionsync.StaticMargin), else the floor (regionsync.Chain.Leased).
// Next to each lease the region keeps its rise (regionsync.ShardRises):
// when the region last came back from its floor for that shard's keys,
// handed to the scripts with the key's floor (Server.common).

// staticKey holds the end of the region's static lease from global-tier
// shard 0 (the whole global tier when it is not sharded) (Redis time, µs,
// a decimal string); missing means none: the region runs that shard's keys
// on their floor. The hash tag keeps it alone in its slot on Redis
// Cluster: no script that touches a bucket ever names it.
func staticKey(prefix string) string { return prefix + "{static}:lease" }

// shardStaticKey holds the static lease from shard i: staticKey for shard
// 0, staticKey + ":I" for the others (same slot).
func shardStaticKey(prefix string, i int) string {
	if i == 0 {
		return staticKey(prefix)
	}
	return staticKey(prefix) + ":" + strconv.Itoa(i)
}

// shardRiseKey holds shard i's rise (regionsync.ShardRises): the Redis
// time (µs, a decimal string) from which the region's static share of the
// shard's keys last stood above its floor again, its lease conferred
// again after it had ended or a drain lifted. staticKey + ":rise" for
// shard 0, + ":rise:I" for the others: the same hash tag, so the same
// slot as the leases. No TTL; missing means no rise known (0).
func shardRiseKey(prefix string, i int) string {
	if i == 0 {
		return staticKey(prefix) + ":rise"
	}
	return staticKey(prefix) + ":rise:" + strconv.Itoa(i)
}

// raiseStatic sets the lease key (KEYS[1]) to ARGV[1] unless it already
// holds a later end: the lease only ever grows, so a deposed leader's late
// write is harmless. When the lease had ended a grant validity (ARGV[3],
// µs) before Redis TIME now and the new end is after now, the lease comes
// back from an end the global tier may have counted (regionsync.CameBack):
// the rise key (KEYS[2]) is raised to now (never lowered), so every
// replica, and a process started later, sees when the region came back.
// The end is the later of the stored one and the leader's own (ARGV[2]):
// a Redis that lost its data while the region was on its floor has lost
// the stored end, but the leader that ran through it still knows its own.
// No end known anywhere (a fresh region) records no rise: the global tier
// never counted the region at its floor.
var raiseStatic = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local v = tonumber(ARGV[1])
if v > cur then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local known = math.max(cur, tonumber(ARGV[2]) or 0)
  if known > 0 and known + (tonumber(ARGV[3]) or 0) <= now and v > now then
    local rise = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
    if now > rise then
      redis.call('SET', KEYS[2], string.format('%.0f', now))
    end
  end
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0
`)

// raiseRises raises every rise key given to Redis TIME now (never lowers
// one) and returns now: the whole region rose (a drain lifted).
var raiseRises = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
for _, k in ipairs(KEYS) do
  local rise = tonumber(redis.call('GET', k) or '0') or 0
  if now > rise then
    redis.call('SET', k, string.format('%.0f', now))
  end
end
return string.format('%.0f', now)
`)

// staticView is what a replica knows of the static leases: their ends as
// last read (or as this process's leader set them), one per shard, each
// shard's rise (the latest it read, noticed or raised itself), and its
// latest Redis TIME reading.
type staticView struct {
	leases regionsync.ShardLeases
	rises  regionsync.ShardRises
	clock  regionsync.RedisClock
}

// readStatic reads the stored lease ends and rises of shards 0..n-1 and
// Redis TIME in one round trip. sent is the local time before the request
// (regionsync.RedisClock). A shard whose key does not hold a time counts
// as holding none (its floor; no rise), and the first such error is
// returned with the others' leases and rises.
func readStatic(ctx context.Context, rdb Redis, prefix string, n int) (regionsync.ShardLeases, regionsync.ShardRises, regionsync.RedisClock, error) {
	n = max(n, 1)
	sent := time.Now()
	var tcmd *redis.TimeCmd
	gcmds := make([]*redis.StringCmd, n)
	rcmds := make([]*redis.StringCmd, n)
	// Each command's own error is checked below.
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		tcmd = p.Time(ctx)
		for i := range gcmds {
			gcmds[i] = p.Get(ctx, shardStaticKey(prefix, i))
			rcmds[i] = p.Get(ctx, shardRiseKey(prefix, i))
		}
		return nil
	})
	now, err := tcmd.Result()
	if err != nil {
		return nil, nil, regionsync.RedisClock{}, fmt.Errorf("redis time: %w", err)
	}
	clock := regionsync.RedisClock{RedisUS: now.UnixMicro(), Sent: sent}
	leases := make(regionsync.ShardLeases, n)
	rises := make(regionsync.ShardRises, n)
	var firstErr error
	for i := range n {
		until, err := storedTime(gcmds[i], shardStaticKey(prefix, i))
		firstErr = cmp.Or(firstErr, err)
		leases[i] = regionsync.StaticLease{UntilUS: until}
		rise, err := storedTime(rcmds[i], shardRiseKey(prefix, i))
		firstErr = cmp.Or(firstErr, err)
		rises[i] = rise
	}
	return leases, rises, clock, firstErr
}

// storedTime is the Redis time (µs) a GET of name read; 0 when the key is
// missing, or does not hold a time (not one the leader wrote: counted as
// none, with an error).
func storedTime(g *redis.StringCmd, name string) (int64, error) {
	v, err := g.Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	us, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s holds %q, not a time: %w", name, v, err)
	}
	return us, nil
}

// storeStatic raises shard i's stored lease end to s (never lowers it),
// and its stored rise to Redis time when the lease (the stored one, or
// prev, the leader's own before s) had ended a grant validity before and
// s runs (raiseStatic).
func storeStatic(ctx context.Context, rdb Redis, prefix string, i int, s, prev regionsync.StaticLease, validity time.Duration) error {
	return raiseStatic.Run(ctx, rdb, []string{shardStaticKey(prefix, i), shardRiseKey(prefix, i)}, s.UntilUS, prev.UntilUS,
		max(validity, 0).Microseconds()).Err()
}

// storeRises raises the stored rise of shards 0..n-1 to Redis time
// (never lowers one) and returns that time (µs).
func storeRises(ctx context.Context, rdb Redis, prefix string, n int) (int64, error) {
	keys := make([]string, max(n, 1))
	for i := range keys {
		keys[i] = shardRiseKey(prefix, i)
	}
	v, err := raiseRises.Run(ctx, rdb, keys).Text()
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// noteStatic updates the replica's view: each shard's lease and rise only
// grow, the Redis clock reading is replaced by a newer one (zero clock:
// kept). A shard whose lease the view held ended at its estimate of Redis
// time now and that runs after the update came back from its end: its
// rise is raised to that estimate, an upper bound of Redis time
// (regionsync.ShardRises.Noticed), which covers this process even when
// the stored rise was not written. A view that never read Redis notices
// nothing: a process that starts sees its region's past rises in the
// stored ones, and is not taken as coming back itself.
func (s *Server) noteStatic(leases regionsync.ShardLeases, rises regionsync.ShardRises, clock regionsync.RedisClock) {
	s.staticMu.Lock()
	defer s.staticMu.Unlock()
	v := *s.static.Load()
	read := !v.clock.Sent.IsZero()
	next := v.leases.Merge(leases)
	if !clock.Sent.IsZero() && !clock.Sent.Before(v.clock.Sent) {
		v.clock = clock
	}
	v.rises = v.rises.Merge(rises)
	if read {
		v.rises = v.rises.Noticed(v.leases, next, v.clock.Estimate(time.Now()), time.Duration(s.opts.Config.Current().GrantValidity))
	}
	v.leases = next
	s.static.Store(&v)
}

// noteRiseAll raises the rise of every shard below n, and of every shard
// the view holds, to us in the view (a drain lifted).
func (s *Server) noteRiseAll(n int, us int64) {
	s.staticMu.Lock()
	defer s.staticMu.Unlock()
	v := *s.static.Load()
	v.rises = v.rises.All(max(n, len(v.leases)), us)
	s.static.Store(&v)
}

// refreshStatic reads the stored leases and Redis TIME into the view.
func (s *Server) refreshStatic(ctx context.Context) error {
	leases, rises, clock, err := readStatic(ctx, s.opts.Redis, s.opts.Prefix, s.shardsInPlay())
	s.noteStatic(leases, rises, clock) // a failed read of a key still moves the clock
	return err
}

// followStatic refreshes the view every quarter epoch, and once at once,
// until ctx ends. A replica that cannot read Redis keeps extrapolating its
// last reading with its own clock: its estimate only grows, so it falls to
// the floor when the lease it knows ends.
func (s *Server) followStatic(ctx context.Context) {
	for {
		epoch := time.Duration(s.opts.Config.Current().Epoch)
		rctx, cancel := context.WithTimeout(ctx, max(epoch, s.opts.RedisTimeout))
		if err := s.refreshStatic(rctx); err != nil && ctx.Err() == nil {
			s.log.Debug("reading the static lease failed", "err", err)
		}
		cancel()
		t := time.NewTimer(max(epoch/4, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// onStatic says whether the replica hands its scripts static shares now
// for the keys of every shard of the config it runs, and the least that
// remains of those shards' leases on its estimate of Redis time (for the
// metrics; Server.common decides per key through regionsync.KeyLease and
// regionsync.Chain.Leased).
func (s *Server) onStatic(now time.Time) (bool, time.Duration) {
	if s.opts.Unleased {
		return true, time.Duration(math.MaxInt64)
	}
	v := s.static.Load()
	est := v.clock.Estimate(now)
	cfg := s.opts.Config.Current()
	epoch := time.Duration(cfg.Epoch)
	on, left := true, time.Duration(math.MaxInt64)
	for i := range cfg.ShardMap().N() {
		lease := v.leases.Of(i)
		on = on && regionsync.OnStatic(est, lease, regionsync.StaticMargin(epoch))
		l := time.Duration(0)
		if est < lease.UntilUS {
			l = time.Duration(lease.UntilUS-est) * time.Microsecond
		}
		left = min(left, l)
	}
	return on, left
}
