package regional

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
)

// ColdStart says how a regional service treats a Redis with no Sluice
// sentinel key when it first connects.
type ColdStart int

const (
	// ColdStartConservative (the default) assumes the empty Redis may have
	// restarted and lost buckets that instances still hold leases against:
	// new buckets start empty and refill from born + the restart wait.
	ColdStartConservative ColdStart = iota
	// ColdStartFull trusts an empty Redis seen at process start to be a
	// fresh deployment: new buckets start full. It is an explicit opt-out
	// of invariant 1 for one case only: a process started on a Redis that
	// lost its data while leases it had issued were still out (Redis and
	// every replica restarted together). A Redis that loses its data while
	// the process runs is always treated conservatively: the scripts date
	// the new data set themselves.
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

// RestartGuard dates every Redis data set and notices one that was lost
// (Redis, or one node of a Redis Cluster, restarted without persistence).
//
// Every data set holds a born sentinel with no TTL whose value is the Redis
// time (µs) it was born (luascripts.Keys.Born): one key on a single Redis,
// one per hash slot on a cluster, so each node's buckets and their
// sentinels are lost together. The scripts read the sentinel in the same
// atomic call that creates a bucket, and write it when it is missing, so a
// bucket created after a loss starts empty until born + the restart wait
// whatever the caller knew. The guard adds three things: it stamps every
// missing sentinel when the process starts (as 0 under ColdStartFull on
// its first look: buckets start full), it stamps them again on the Redis
// clock whenever it finds one missing or changed (so keys first used long
// after a loss are not held to a late birth), and it counts and logs the
// losses it notices.
//
// Safe for concurrent use.
type RestartGuard struct {
	prefix  string
	mode    ColdStart
	logger  *slog.Logger
	scripts *luascripts.Scripts

	mu   sync.Mutex       // guards last
	last map[string]int64 // guarded by mu: every sentinel's last seen value

	seen     atomic.Bool  // a first look was made (stamped or read)
	restarts atomic.Int64 // data losses noticed
}

// NewRestartGuard returns a guard for the sentinels under prefix.
func NewRestartGuard(prefix string, mode ColdStart, logger *slog.Logger) *RestartGuard {
	if logger == nil {
		logger = slog.Default()
	}
	return &RestartGuard{prefix: prefix, mode: mode, logger: logger, scripts: luascripts.New(), last: map[string]int64{}}
}

// RestartWait is what the scripts wait after a data set's birth before a
// new bucket earns tokens under cfg (luascripts.RestartWait); 0 on a nil
// guard (no guard: a missing bucket is full).
func (g *RestartGuard) RestartWait(cfg *config.Config) time.Duration {
	if g == nil {
		return 0
	}
	return luascripts.RestartWait(time.Duration(cfg.LeaseTTL), time.Duration(cfg.GrantValidity), time.Duration(cfg.Epoch))
}

// Restarts counts the data losses this guard noticed.
func (g *RestartGuard) Restarts() int64 {
	if g == nil {
		return 0
	}
	return g.restarts.Load()
}

// Check stamps the missing sentinels and notices losses. On a single
// Redis it stamps the one sentinel (one script call); on a cluster it
// probes the sentinel of the first slot each node serves and stamps all
// of them once one is missing or changed, and on the first look.
func (g *RestartGuard) Check(ctx context.Context, c Redis) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return g.checkCluster(ctx, cc)
	}
	return g.stamp(ctx, c, luascripts.BornKeys(g.prefix, false))
}

func (g *RestartGuard) checkCluster(ctx context.Context, c *redis.ClusterClient) error {
	if g.seen.Load() {
		slots, err := c.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("read cluster slots: %w", err)
		}
		probe := make([]string, 0, len(slots))
		for _, s := range slots {
			probe = append(probe, luascripts.BornKey(g.prefix, int(s.Start)))
		}
		bs, err := g.scripts.StampBorn(ctx, c, probe, false)
		if err != nil {
			return err
		}
		g.mu.Lock()
		same := true
		for i, b := range bs {
			if v, ok := g.last[probe[i]]; b.Written || !ok || v != b.BornUS {
				same = false
			}
		}
		g.mu.Unlock()
		if same {
			return nil
		}
	}
	return g.stamp(ctx, c, luascripts.BornKeys(g.prefix, true))
}

// stamp writes the missing sentinels among keys and compares every value
// with the last one seen.
func (g *RestartGuard) stamp(ctx context.Context, c Redis, keys []string) error {
	first := !g.seen.Load()
	full := first && g.mode == ColdStartFull
	bs, err := g.scripts.StampBorn(ctx, c, keys, full)
	if err != nil {
		return err
	}
	g.mu.Lock()
	lost, wrote := 0, 0
	var bornUS int64
	for i, b := range bs {
		if b.Written {
			wrote++
		}
		if v, ok := g.last[keys[i]]; ok && (b.Written || v != b.BornUS) {
			lost++
			bornUS = b.BornUS
		}
		g.last[keys[i]] = b.BornUS
	}
	g.mu.Unlock()
	g.seen.Store(true)
	switch {
	case lost > 0:
		g.restarts.Add(1)
		g.logger.Warn("redis lost its data (born sentinel missing or renewed): buckets created from now on start empty and earn tokens only after the longer of one lease TTL and one grant validity plus one epoch",
			"sentinels", lost, "of", len(keys), "born_us", bornUS)
	case first && !full && wrote == len(keys):
		// This process found Redis empty and set its birth: say once why
		// the first requests are denied.
		g.logger.Warn("redis holds no Sluice data (cold start, -cold-start conservative): new buckets start empty and earn tokens only after the longer of one lease TTL and one grant validity plus one epoch, so requests are denied until then; use -cold-start full for a fresh deployment whose Redis never held leases",
			"sentinel", keys[0], "born_us", bs[0].BornUS)
	}
	return nil
}
