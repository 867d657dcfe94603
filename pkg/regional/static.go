package regional

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/regionsync"
)

// The static lease on the region's side. The region leader holds it
// (regionsync.Leader) and stores its end in the region's Redis under one
// key; every replica reads that key and Redis TIME every quarter epoch and
// hands its scripts, per key, the static share while its conservative
// estimate of Redis time is before the lease's end (minus
// regionsync.StaticMargin), else the floor (regionsync.Chain.Leased).

// staticKey holds the end of the region's static lease (Redis time, µs, a
// decimal string); missing means none: the region runs on its floor. The
// hash tag keeps it alone in its slot on Redis Cluster: no script that
// touches a bucket ever names it.
func staticKey(prefix string) string { return prefix + "{static}:lease" }

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

// staticView is what a replica knows of the static lease: its end as last
// read (or as this process's leader set it) and its latest Redis TIME
// reading.
type staticView struct {
	lease regionsync.StaticLease
	clock regionsync.RedisClock
}

// readStatic reads the stored lease end and Redis TIME in one round trip.
// sent is the local time before the request (regionsync.RedisClock).
func readStatic(ctx context.Context, rdb Redis, prefix string) (regionsync.StaticLease, regionsync.RedisClock, error) {
	sent := time.Now()
	var tcmd *redis.TimeCmd
	var gcmd *redis.StringCmd
	// Each command's own error is checked below.
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		tcmd = p.Time(ctx)
		gcmd = p.Get(ctx, staticKey(prefix))
		return nil
	})
	now, err := tcmd.Result()
	if err != nil {
		return regionsync.StaticLease{}, regionsync.RedisClock{}, fmt.Errorf("redis time: %w", err)
	}
	clock := regionsync.RedisClock{RedisUS: now.UnixMicro(), Sent: sent}
	v, err := gcmd.Result()
	if errors.Is(err, redis.Nil) {
		return regionsync.StaticLease{}, clock, nil
	}
	if err != nil {
		return regionsync.StaticLease{}, clock, fmt.Errorf("read %s: %w", staticKey(prefix), err)
	}
	until, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		// Not a lease the leader wrote: count it as none (the floor).
		return regionsync.StaticLease{}, clock, fmt.Errorf("%s holds %q, not a time: %w", staticKey(prefix), v, err)
	}
	return regionsync.StaticLease{UntilUS: until}, clock, nil
}

// storeStatic raises the stored lease end to s (never lowers it).
func storeStatic(ctx context.Context, rdb Redis, prefix string, s regionsync.StaticLease) error {
	return raiseStatic.Run(ctx, rdb, []string{staticKey(prefix)}, s.UntilUS).Err()
}

// noteStatic updates the replica's view: the lease only grows, the Redis
// clock reading is replaced by a newer one (zero clock: kept).
func (s *Server) noteStatic(lease regionsync.StaticLease, clock regionsync.RedisClock) {
	s.staticMu.Lock()
	defer s.staticMu.Unlock()
	v := *s.static.Load()
	v.lease = v.lease.Merge(lease)
	if !clock.Sent.IsZero() && !clock.Sent.Before(v.clock.Sent) {
		v.clock = clock
	}
	s.static.Store(&v)
}

// refreshStatic reads the stored lease and Redis TIME into the view.
func (s *Server) refreshStatic(ctx context.Context) error {
	lease, clock, err := readStatic(ctx, s.opts.Redis, s.opts.Prefix)
	s.noteStatic(lease, clock) // a failed read of the key still moves the clock
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

// onStatic says whether the replica hands its scripts static shares now,
// and the lease's remaining time on its estimate of Redis time (for the
// metrics; Server.common decides through regionsync.Chain.Leased).
func (s *Server) onStatic(now time.Time) (bool, time.Duration) {
	if s.opts.Unleased {
		return true, time.Duration(math.MaxInt64)
	}
	v := s.static.Load()
	est := v.clock.Estimate(now)
	epoch := time.Duration(s.opts.Config.Current().Epoch)
	on := regionsync.OnStatic(est, v.lease, regionsync.StaticMargin(epoch))
	left := time.Duration(0)
	if est < v.lease.UntilUS {
		left = time.Duration(v.lease.UntilUS-est) * time.Microsecond
	}
	return on, left
}
