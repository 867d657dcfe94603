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
// losses it notices. A first look that did not answer at start is made
// again before the first call's scripts run (Server.lookFirst) and at
// every epoch, until it answers.
//
// A data set that goes back in time (restored from an older snapshot, a
// replica promoted while it lagged) keeps its sentinel. The guard holds
// the process's view of the data sets' write generations
// (luascripts.Generations), which the server's scripts share: every call
// passes the highest generation seen, and the call that finds its data set
// below it re-births the data set itself, atomically (see
// docs/architecture.md, "Redis rolls back"); the guard's own stamping does
// the same for data sets no call touched. The guard counts those re-births
// with the losses and logs them, once per check (every epoch) however many
// data sets (cluster slots) were re-birthed since the last one.
//
// Safe for concurrent use.
type RestartGuard struct {
	prefix  string
	mode    ColdStart
	logger  *slog.Logger
	scripts *luascripts.Scripts
	gens    *luascripts.Generations

	mu   sync.Mutex       // guards last, lostAt, reborn, relabelled and rebornUS
	last map[string]int64 // guarded by mu: every sentinel's last seen value
	// lostAt is, per sentinel, the birth a check last counted as a data
	// loss (found renewed): a script call's re-birth whose reply reaches
	// the guard after that check read the new birth relabels the loss a
	// rollback instead of counting it again. Guarded by mu; at most one
	// entry per sentinel.
	lostAt map[string]int64
	// reborn counts the data sets script calls re-birthed since the last
	// check, relabelled the losses found to be such re-births after a
	// check counted them, rebornUS the last one's birth; guarded by mu.
	reborn     int
	relabelled int
	rebornUS   int64

	seen      atomic.Bool  // a first look was made (stamped or read)
	restarts  atomic.Int64 // data losses noticed, rollbacks included
	rollbacks atomic.Int64 // of which rollbacks (data sets re-birthed)
}

// NewRestartGuard returns a guard for the sentinels under prefix.
func NewRestartGuard(prefix string, mode ColdStart, logger *slog.Logger) *RestartGuard {
	if logger == nil {
		logger = slog.Default()
	}
	gens := luascripts.NewGenerations()
	g := &RestartGuard{prefix: prefix, mode: mode, logger: logger, scripts: luascripts.NewWith(gens), gens: gens, last: map[string]int64{}, lostAt: map[string]int64{}}
	gens.OnRebirth(g.rebirth)
	return g
}

// Generations is the process's view of its data sets' write generations,
// for the scripts of every server this guard dates the data sets of; nil
// on a nil guard.
func (g *RestartGuard) Generations() *luascripts.Generations {
	if g == nil {
		return nil
	}
	return g.gens
}

// Rollbacks counts the data sets found gone back in time and re-birthed
// (counted among Restarts too), as of the last check.
func (g *RestartGuard) Rollbacks() int64 {
	if g == nil {
		return 0
	}
	return g.rollbacks.Load()
}

// rebirth notes a script call's (or the guard's own stamp's) re-birth of
// the data set of sentinel born at bornUS, for the next check to count and
// log: a cluster node that went back re-births each of its slots' data
// sets in whichever call touches it first.
func (g *RestartGuard) rebirth(born string, bornUS int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if v, ok := g.last[born]; ok && v == bornUS {
		// Already seen: a check read the new birth first. If it counted
		// it as a loss, that loss was this rollback.
		if at, ok := g.lostAt[born]; ok && at == bornUS {
			delete(g.lostAt, born)
			g.relabelled++
			g.rebornUS = bornUS
		}
		return
	}
	g.last[born] = bornUS
	g.reborn++
	g.rebornUS = bornUS
}

// reportRebirths counts and logs the re-births noted since the last check.
func (g *RestartGuard) reportRebirths() {
	g.mu.Lock()
	n, relabelled, at := g.reborn, g.relabelled, g.rebornUS
	g.reborn, g.relabelled = 0, 0
	g.mu.Unlock()
	if relabelled > 0 {
		// Counted among the data losses by an earlier check already.
		g.rollbacks.Add(1)
	}
	if n > 0 {
		g.restarts.Add(1)
		g.rollbacks.Add(1)
	}
	if n+relabelled == 0 {
		return
	}
	g.logger.Warn("redis data set went back in time (restored from an older snapshot, or a replica promoted while it lagged): its write generation was below one already seen; re-born as after a data loss, its buckets start empty and earn tokens only after the longer of one lease TTL and one grant validity plus one epoch",
		"data_sets", n+relabelled, "born_us", at)
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
	defer g.reportRebirths()
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
	bs, err := g.stampBorn(ctx, c, keys, full)
	if err != nil {
		return err
	}
	g.mu.Lock()
	lost, wrote := 0, 0
	var bornUS int64
	for i, b := range bs {
		if b.Reborn {
			continue // counted as a rollback (rebirth, reportRebirths)
		}
		if b.Written {
			wrote++
		}
		if v, ok := g.last[keys[i]]; ok && (b.Written || v != b.BornUS) {
			lost++
			bornUS = b.BornUS
			g.lostAt[keys[i]] = b.BornUS
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
		g.logger.Warn("redis holds no Sluice data (cold start, -cold-start conservative): every new bucket starts empty and refills at its rate from the birth plus the longer of one lease TTL and one grant validity plus one epoch, so a key is denied until it has earned a token and holds rate x (time since birth - that wait), up to its burst: seconds for a per-second limit, most of its period for a per-hour or per-day one; -cold-start full starts buckets full instead, for a fresh deployment whose Redis never held leases (on a Redis that lost its data while leases were out, one extra burst per key)",
			"sentinel", keys[0], "born_us", bs[0].BornUS)
	}
	return nil
}

// stampBorn stamps keys' missing sentinels, as trusted to start full
// (0) when full, but never one of a data set a script call of this
// process already answered from: a first look retried after it failed
// (at the next epoch, or lazily before a call, Server.lookFirst) may come
// after calls that wrote the sentinel, and that data set may have been
// lost since with leases the process issued still out. Such a data set is
// dated on the Redis clock, as one lost while the process runs.
func (g *RestartGuard) stampBorn(ctx context.Context, c Redis, keys []string, full bool) ([]luascripts.Born, error) {
	if !full {
		return g.scripts.StampBorn(ctx, c, keys, false)
	}
	var trusted, used []string
	var usedAt []int
	for i, k := range keys {
		if g.gens.Seen(k) != 0 {
			used = append(used, k)
			usedAt = append(usedAt, i)
			continue
		}
		trusted = append(trusted, k)
	}
	if len(used) == 0 {
		return g.scripts.StampBorn(ctx, c, keys, true)
	}
	tb, err := g.scripts.StampBorn(ctx, c, trusted, true)
	if err != nil {
		return nil, err
	}
	ub, err := g.scripts.StampBorn(ctx, c, used, false)
	if err != nil {
		return nil, err
	}
	out := make([]luascripts.Born, len(keys))
	ti, ui := 0, 0
	for i := range keys {
		if ui < len(usedAt) && usedAt[ui] == i {
			out[i] = ub[ui]
			ui++
			continue
		}
		out[i] = tb[ti]
		ti++
	}
	return out, nil
}

// Looked reports whether the guard has made its first look at Redis
// (stamped or read every sentinel once); true on a nil guard.
func (g *RestartGuard) Looked() bool {
	return g == nil || g.seen.Load()
}
