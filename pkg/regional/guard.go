package regional

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/config"
)

// ColdStart says how a regional service treats a Redis with no Sluice
// sentinel key when it first connects.
type ColdStart int

const (
	// ColdStartConservative (the default) assumes the empty Redis may have
	// restarted and lost buckets that instances still hold leases against:
	// new buckets start empty and refill from born + lease TTL.
	ColdStartConservative ColdStart = iota
	// ColdStartFull trusts an empty Redis seen at process start to be a
	// fresh deployment: new buckets start full. A sentinel that disappears
	// later is always treated conservatively.
	ColdStartFull
)

// ParseColdStart reads "conservative" or "full".
func ParseColdStart(s string) (ColdStart, error) {
	switch s {
	case "conservative", "":
		return ColdStartConservative, nil
	case "full":
		return ColdStartFull, nil
	}
	return 0, fmt.Errorf("cold start %q: want conservative or full", s)
}

// RestartGuard detects a Redis that lost its data (restarted without
// persistence) and tells the scripts when the data set was born.
//
// Redis keeps a sentinel key with no TTL whose value is the Redis time (µs)
// at which the current data set was born. Plug OnConnect into the go-redis
// options: every new connection (and a restarted Redis only has new ones)
// reads the sentinel before the connection is used, so no script runs with
// a stale born value after a restart.
//
// Safe for concurrent use.
type RestartGuard struct {
	key    string
	mode   ColdStart
	logger *slog.Logger

	born     atomic.Int64 // µs; 0 = buckets may start full
	seen     atomic.Bool  // a sentinel was read or written by this process
	restarts atomic.Int64 // data losses noticed
}

// NewRestartGuard returns a guard for the sentinel key prefix+"born".
func NewRestartGuard(prefix string, mode ColdStart, logger *slog.Logger) *RestartGuard {
	if logger == nil {
		logger = slog.Default()
	}
	return &RestartGuard{key: prefix + "born", mode: mode, logger: logger}
}

// BornUS is when the current Redis data set was born (µs, Redis time); 0
// means new buckets may start full.
func (g *RestartGuard) BornUS() int64 { return g.born.Load() }

// WarmBornUS is the born value to pass to the scripts (ARGV born) under
// cfg. The scripts start a bucket missing after a data loss empty until
// born + lease TTL; that is not enough when grant_validity is longer: the
// lost bucket may have held a grant below the region's static share whose
// donated capacity another region still uses until the grant ends (at
// most grant_validity after its report was sent, before the loss), so
// the wait must be max(lease TTL, grant validity + one epoch of clock
// margin). The value passed is shifted so born + lease TTL in the scripts
// is born + that wait.
func (g *RestartGuard) WarmBornUS(cfg *config.Config) int64 {
	born := g.born.Load()
	if born == 0 {
		return 0
	}
	ttl := time.Duration(cfg.LeaseTTL)
	wait := max(ttl, time.Duration(cfg.GrantValidity)+time.Duration(cfg.Epoch))
	return born + (wait - ttl).Microseconds()
}

// Restarts counts the data losses this guard noticed.
func (g *RestartGuard) Restarts() int64 { return g.restarts.Load() }

// OnConnect is a go-redis OnConnect hook.
func (g *RestartGuard) OnConnect(ctx context.Context, cn *redis.Conn) error {
	return g.Check(ctx, cn)
}

// Check reads (or creates) the sentinel through c.
func (g *RestartGuard) Check(ctx context.Context, c redis.Cmdable) error {
	v, err := c.Get(ctx, g.key).Result()
	if errors.Is(err, redis.Nil) {
		first := !g.seen.Load()
		born := int64(0)
		if !(first && g.mode == ColdStartFull) {
			t, err := c.Time(ctx).Result()
			if err != nil {
				return fmt.Errorf("read redis time: %w", err)
			}
			born = t.UnixMicro()
		}
		if err := c.SetNX(ctx, g.key, born, 0).Err(); err != nil {
			return fmt.Errorf("write sentinel %s: %w", g.key, err)
		}
		if v, err = c.Get(ctx, g.key).Result(); err != nil {
			return fmt.Errorf("read sentinel %s: %w", g.key, err)
		}
		if first && born != 0 && v == strconv.FormatInt(born, 10) {
			// This process found Redis empty and set its birth: say once
			// why the first requests are denied.
			g.logger.Warn("redis holds no Sluice data (cold start, -cold-start conservative): new buckets start empty and earn tokens only after the longer of one lease TTL and one grant validity plus one epoch, so requests are denied until then; use -cold-start full for a fresh deployment whose Redis never held leases",
				"sentinel", g.key, "born_us", v)
		}
		if !first {
			g.restarts.Add(1)
			g.logger.Warn("redis lost its data (sentinel missing): new buckets start empty for the longer of one lease TTL and one grant validity",
				"sentinel", g.key, "born_us", v)
		}
	} else if err != nil {
		return fmt.Errorf("read sentinel %s: %w", g.key, err)
	}
	born, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return fmt.Errorf("sentinel %s holds %q, not a time: %w", g.key, v, err)
	}
	g.born.Store(born)
	g.seen.Store(true)
	return nil
}
