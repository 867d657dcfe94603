package live

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/sim/oracle"
)

// staleGrant is one grant a region leader had installed when it froze:
// what it installs again when it wakes.
type staleGrant struct {
	key   int
	grant luascripts.StoredGrant
}

// staleLeader plays a stale-leader fault on region r, as virtual mode's
// does (sim/world, staleLeader): its leader freezes (a long GC pause, a
// frozen VM), its session lapses and the other replica is elected; when
// it wakes, lasting later, it installs the last answer it had, from
// before the new leader's. An in-process leader cannot be frozen, so the
// leader is killed as region-leader-loss kills it (a replacement starts
// where it ran) and its wake is played by this function: the grants that
// leader had installed, read from Redis when it froze (rate, burst,
// expiry and fence exactly as set_rate stored them), are installed again
// through the same set_rate calls a leader makes, planned by a live
// replica of the region as a leader plans its installs. Each Redis must
// refuse a grant whose fence is older than one a newer leader installed;
// one it still takes (no newer grant for its key yet) is the same grant
// again, which the global tier counts until its expiry anyway, and the
// oracle is told of it as of any applied grant. A key whose bucket idled
// out meanwhile takes the old grant too: its fence went with the bucket,
// and the grant, as old as the newer one it follows or older, has ended
// (a bucket outlives its grants: lib.lua, bucket_ttl). It returns what the
// fault's label adds.
func (d *deployment) staleLeader(ctx context.Context, r *liveRegion, lasting time.Duration) string {
	rep := d.awaitLeader(ctx, r)
	if rep == nil {
		return " (no replica was leading)"
	}
	var last []staleGrant
	for key, k := range d.rkeys {
		g, ok, err := luascripts.ReadGrant(ctx, r.rdb, k)
		if err != nil {
			fmt.Fprintf(d.log, "live: stale leader of %s: %v\n", r.name, err)
			continue
		}
		if ok {
			last = append(last, staleGrant{key: key, grant: g})
		}
	}
	d.killLeader(ctx, r, rep)
	d.after(ctx, lasting, func() {
		applied, refused, failed := d.installStale(ctx, r, last)
		fmt.Fprintf(d.log, "live: the stale leader of %s woke and installed its %d grants again: %d refused as older than the newer leader's, %d taken (the same grant again), %d failed\n",
			r.name, len(last), refused, applied, failed)
	})
	return fmt.Sprintf(" %s (%d grants held)", rep.Addr(), len(last))
}

// installStale installs the grants of a stale leader again (staleLeader)
// and returns how many Redis applied, refused and failed to run.
func (d *deployment) installStale(ctx context.Context, r *liveRegion, last []staleGrant) (applied, refused, failed int) {
	rep := r.leadingReplica()
	if rep == nil {
		for _, x := range r.replicas {
			if x.Daemon() != nil {
				rep = x
				break
			}
		}
	}
	if rep == nil || rep.Daemon() == nil {
		fmt.Fprintf(d.log, "live: the stale leader of %s found no replica to plan its installs with\n", r.name)
		return 0, 0, len(last)
	}
	srv := rep.Daemon().Server
	cfg := d.cfg
	if w := rep.Watcher(); w != nil {
		cfg = w.Current()
	}
	var items []luascripts.SetRateItem
	var keys []int
	for _, s := range last {
		k := d.plan.Keys[s.key]
		rk, common, _, err := srv.CommonFor(cfg, quota.Key{Tenant: k.Tenant, Class: k.Class})
		if err != nil {
			failed++
			continue
		}
		items = append(items, luascripts.SetRateItem{Keys: rk, Common: common, Rate: s.grant.Rate, Burst: s.grant.Burst,
			ExpiryUS: s.grant.ExpiryUS, IssuedUS: s.grant.FenceUS})
		keys = append(keys, s.key)
	}
	// The fence each key holds now, and until when that bucket is sure to
	// be there: a grant applied over a newer fence while it is, is what
	// the oracle's grant order check is for. A key that idled out since
	// (a starved run's instances and leader may not touch it for its
	// whole TTL) is a new bucket holding no fence, which takes any grant;
	// the oracle cannot judge that install's order, and the log counts it.
	lives := make([]luascripts.GrantLife, len(items))
	for i, it := range items {
		if l, err := luascripts.ReadGrantLife(ctx, r.rdb, it.Keys, time.Duration(cfg.LeaseTTL)); err == nil {
			lives[i] = l
		}
	}
	idled := 0
	for i, res := range srv.Scripts().SetRateMany(ctx, r.rdb, items) {
		switch {
		case res.Err != nil:
			failed++
		case res.Reply.Applied:
			applied++
			key, held, fence := keys[i], lives[i].Grant.FenceUS, items[i].IssuedUS
			if fence < held && res.Reply.NowUS >= lives[i].UntilUS {
				idled++
			} else {
				d.rec.do(func(o *oracle.Oracle, now time.Duration) {
					o.GrantIssued(now, r.idx, key, held)
					o.GrantIssued(now, r.idx, key, fence)
				})
			}
			d.grantApplied(r.idx, key, items[i].Rate, items[i].Burst, items[i].ExpiryUS)
		default:
			refused++
		}
	}
	if idled > 0 {
		fmt.Fprintf(d.log, "live: %d of the stale leader's grants in %s were taken by a bucket that idled out after its fence was read (a new bucket holds no fence)\n", idled, r.name)
	}
	return applied, refused, failed
}
