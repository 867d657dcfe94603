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

// raiseStatic sets the key to ARGV[1] unless it already holds a later end:
// the lease only ever grows, so a deposed leader's late write is harmless.
var raiseStatic = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local v = tonumber(ARGV[1])
if v > cur then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0
`)

// staticView is what a replica knows of the static leases: their ends as
// last read (or as this process's leader set them), one per shard, and its
// latest Redis TIME reading.
type staticView struct {
	leases regionsync.ShardLeases
	clock  regionsync.RedisClock
}

// readStatic reads the stored lease ends of shards 0..n-1 and Redis TIME
// in one round trip. sent is the local time before the request
// (regionsync.RedisClock). A shard whose key does not hold a time counts
// as holding none (its floor), and the first such error is returned with
// the others' leases.
func readStatic(ctx context.Context, rdb Redis, prefix string, n int) (regionsync.ShardLeases, regionsync.RedisClock, error) {
	n = max(n, 1)
	sent := time.Now()
	var tcmd *redis.TimeCmd
	gcmds := make([]*redis.StringCmd, n)
	// Each command's own error is checked below.
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		tcmd = p.Time(ctx)
		for i := range gcmds {
			gcmds[i] = p.Get(ctx, shardStaticKey(prefix, i))
		}
		return nil
	})
	now, err := tcmd.Result()
	if err != nil {
		return nil, regionsync.RedisClock{}, fmt.Errorf("redis time: %w", err)
	}
	clock := regionsync.RedisClock{RedisUS: now.UnixMicro(), Sent: sent}
	leases := make(regionsync.ShardLeases, n)
	var firstErr error
	for i, g := range gcmds {
		v, err := g.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			firstErr = cmp.Or(firstErr, fmt.Errorf("read %s: %w", shardStaticKey(prefix, i), err))
			continue
		}
		until, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			// Not a lease the leader wrote: count it as none (the floor).
			firstErr = cmp.Or(firstErr, fmt.Errorf("%s holds %q, not a time: %w", shardStaticKey(prefix, i), v, err))
			continue
		}
		leases[i] = regionsync.StaticLease{UntilUS: until}
	}
	return leases, clock, firstErr
}

// storeStatic raises shard i's stored lease end to s (never lowers it).
func storeStatic(ctx context.Context, rdb Redis, prefix string, i int, s regionsync.StaticLease) error {
	return raiseStatic.Run(ctx, rdb, []string{shardStaticKey(prefix, i)}, s.UntilUS).Err()
}

// noteStatic updates the replica's view: each shard's lease only grows,
// the Redis clock reading is replaced by a newer one (zero clock: kept).
func (s *Server) noteStatic(leases regionsync.ShardLeases, clock regionsync.RedisClock) {
	s.staticMu.Lock()
	defer s.staticMu.Unlock()
	v := *s.static.Load()
	v.leases = v.leases.Merge(leases)
	if !clock.Sent.IsZero() && !clock.Sent.Before(v.clock.Sent) {
		v.clock = clock
	}
	s.static.Store(&v)
}

// refreshStatic reads the stored leases and Redis TIME into the view.
func (s *Server) refreshStatic(ctx context.Context) error {
	leases, clock, err := readStatic(ctx, s.opts.Redis, s.opts.Prefix, s.shardsInPlay())
	s.noteStatic(leases, clock) // a failed read of a key still moves the clock
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
