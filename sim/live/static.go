package live

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/sim/oracle"
)

// The static leases. A region runs on its static shares only while its
// static lease from the global tier runs (its end stored in the region's
// Redis), on its floors after; the global tier re-divides a region's share
// once it has not heard from it for region_lease + grant validity + its
// margin. The oracle learns each region's lease from the region leader
// itself (regional.LeaderOptions.OnStaticLease, called after each store),
// as it learns grants: until the first report it counts the region's
// static shares for ever, and a dead region's share that the global tier
// handed on would read as oversubscribed. Scenarios played live run one
// global-tier shard: only shard 0's lease is observed.

// staticStored is regional.LeaderOptions.OnStaticLease for region: the
// leader stored untilUS (Redis time, µs, the clock of this machine) as
// the end of its static lease. The end in Redis only grows, so the oracle
// is told the largest end stored since the region's Redis last came back
// empty, in scenario time.
func (d *deployment) staticStored(region string, shard int, untilUS int64) {
	idx, ok := d.regionIdx[region]
	if !ok || shard != 0 {
		return
	}
	d.grantMu.Lock()
	defer d.grantMu.Unlock()
	if d.staticEnd == nil {
		d.staticEnd = map[int]int64{}
	}
	if untilUS <= d.staticEnd[idx] {
		return
	}
	d.staticEnd[idx] = untilUS
	if d.rec != nil {
		d.tellStaticLocked(idx, untilUS)
	}
}

// tellStaticLocked hands the oracle the end of region's static lease; the
// caller holds grantMu and rec is set.
func (d *deployment) tellStaticLocked(region int, untilUS int64) {
	until := d.rec.virtual(time.UnixMicro(untilUS))
	d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.StaticLease(now, region, until) })
}

// restartRedis brings r's Redis back, empty, telling the oracle first
// (oracle.RedisUp: its grants and its static lease are gone): the
// region's leader may install a grant into the new Redis the moment it
// answers, before Restart has seen it answer, and a loss told after that
// grant wiped it from the oracle's books, which then counted the region
// at its static share beside it (seen: retries at seed 8, Σ 1.23 r).
// Told first, the region counts at its floors for the moments Redis takes
// to start, where it refills nothing: more, never less, than it uses. The
// next static lease end its leader stores, and every grant a state read
// finds held, are reported whatever was reported before.
func (d *deployment) restartRedis(r *liveRegion) {
	d.grantMu.Lock()
	delete(d.staticEnd, r.idx)
	for k := range d.seen {
		if k[0] == r.idx {
			delete(d.seen, k)
		}
	}
	d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.RedisUp(now, r.idx) })
	d.grantMu.Unlock()
	if err := r.redis.Restart(); err != nil {
		fmt.Fprintf(d.log, "live: restarting Redis of %s: %v\n", r.name, err)
	}
}
