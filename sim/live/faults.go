package live

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/scenario"
	"github.com/sluicehq/sluice/sim/world"
)

func (d *deployment) region(name string) *liveRegion {
	for _, r := range d.regions {
		if r.name == name {
			return r
		}
	}
	return nil
}

// after runs f once d has passed in scenario time, unless ctx ends first.
func (d *deployment) after(ctx context.Context, v time.Duration, f func()) {
	d.faultJobs.Add(1)
	go func() {
		defer d.faultJobs.Done()
		t := time.NewTimer(time.Duration(float64(v) / d.scale))
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
			f()
		}
	}()
}

// awaitLeader returns the replica leading r, waiting for one while the
// region has none: at the start of a run, or after a starved leader's
// session lapsed, the replicas are still campaigning, and a fault on "the
// leader" means the one the election is about to pick. The wait ends at
// ctx or once several session TTLs passed without any leader (time enough
// for a dead holder's session to expire and a campaign to win many times
// over); it polls once per epoch. nil means no replica led in that time.
func (d *deployment) awaitLeader(ctx context.Context, r *liveRegion) *devcluster.RegionalReplica {
	ttl := sessionTTL(time.Duration(d.sc.Topology.SessionTTL), d.scale)
	deadline := time.Now().Add(10 * ttl)
	tick := time.NewTicker(time.Duration(d.cfg.Epoch))
	defer tick.Stop()
	for {
		if rep := r.leadingReplica(); rep != nil || !time.Now().Before(deadline) {
			return rep
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Skipped says why live mode does not play fault f, or "" when it does.
func Skipped(f scenario.Fault) string {
	switch f.Kind {
	case scenario.FaultInstanceCrash, scenario.FaultInstanceStop, scenario.FaultGlobalLeaderLoss, scenario.FaultRegionLeaderLoss,
		scenario.FaultEtcdDown, scenario.FaultPartition, scenario.FaultLoss, scenario.FaultRedisRestart, scenario.FaultRegionDown,
		scenario.FaultReplyLoss, scenario.FaultReportReplay, scenario.FaultRegionReportReplay, scenario.FaultInstanceIsolate,
		scenario.FaultStaleLeader:
		return ""
	case scenario.FaultLatency:
		if f.Peer != scenario.GlobalPeer {
			return "live mode injects faults only between a region and the global tier"
		}
		return ""
	}
	return "not supported in live mode"
}

// inject applies one fault to the real daemons.
func (d *deployment) inject(ctx context.Context, f scenario.Fault) {
	lasting := time.Duration(f.For)
	label := f.Kind
	if f.Region != "" {
		label += " " + f.Region
	}
	if why := Skipped(f); why != "" {
		if f.Kind == scenario.FaultLatency {
			label = fmt.Sprintf("latency %s↔%s %v", f.Region, f.Peer, time.Duration(f.Latency))
		}
		label += " (skipped: " + why + ")"
		d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.Fault(now, now, label) })
		return
	}
	r := d.region(f.Region)
	var until time.Duration
	switch f.Kind {
	case scenario.FaultInstanceCrash, scenario.FaultInstanceStop:
		for i := 0; i < f.Count; i++ {
			r.mu.Lock()
			var in *liveInstance
			if len(r.insts) > 0 {
				in = r.insts[len(r.insts)-1]
			}
			r.mu.Unlock()
			if in == nil {
				break
			}
			if f.Kind == scenario.FaultInstanceCrash {
				d.crash(in)
			} else {
				d.stop(in)
			}
			if ra := time.Duration(f.RestartAfter); ra > 0 {
				d.after(ctx, ra, func() {
					if _, err := d.startInstance(r); err != nil {
						fmt.Fprintf(d.log, "live: replacement instance in %s: %v\n", r.name, err)
					}
				})
			}
		}
		label = fmt.Sprintf("%s ×%d", label, f.Count)
	case scenario.FaultGlobalLeaderLoss:
		for _, g := range d.c.Global {
			dm := g.Daemon()
			if dm == nil || !dm.IsLeader() {
				continue
			}
			label += " " + g.Addr()
			g.Stop()
			if ra := time.Duration(f.RestartAfter); ra > 0 {
				d.after(ctx, ra, func() {
					if err := g.Restart(context.Background()); err != nil {
						fmt.Fprintf(d.log, "live: restarting the global replica: %v\n", err)
						return
					}
					d.addGlobal(g.Daemon())
				})
			}
			break
		}
	case scenario.FaultRegionLeaderLoss:
		rep := d.awaitLeader(ctx, r)
		if rep == nil {
			label += " (no replica was leading)"
			break
		}
		label += " " + rep.Addr()
		d.killLeader(ctx, r, rep)
	case scenario.FaultStaleLeader:
		label += d.staleLeader(ctx, r, lasting)
		until = lasting
	case scenario.FaultEtcdDown:
		// The outage runs from when etcd begins to stop: its Close waits
		// up to etcd's request timeout (5 s and two election timeouts) for
		// the streams clients hold open, and counted from Close's return
		// the outage ran that much longer than the scenario's, past
		// region_lease in one run of 40 s at scale 4 (every region on its
		// floor, as it should be after such an outage).
		var began time.Duration
		d.rec.do(func(_ *oracle.Oracle, now time.Duration) { began = now })
		beganWall := time.Now()
		d.c.StopEtcd()
		took := time.Since(beganWall)
		if took > 100*time.Millisecond {
			fmt.Fprintf(d.log, "live: etcd took %v to stop (its Close waits for the streams clients hold open); the outage counts from the stop's start\n", took.Round(time.Millisecond))
		}
		stopping := time.Duration(float64(took) * d.scale)
		d.after(ctx, max(0, lasting-stopping), func() {
			if err := d.c.RestartEtcd(); err != nil {
				fmt.Fprintf(d.log, "live: restarting etcd: %v\n", err)
			}
		})
		d.rec.do(func(o *oracle.Oracle, _ time.Duration) { o.Fault(began, began+lasting, label) })
		return
	case scenario.FaultPartition:
		r.faults.set(func(t *tierFaults) { t.partitioned = true })
		d.after(ctx, lasting, func() { r.faults.set(func(t *tierFaults) { t.partitioned = false }) })
		until = lasting
	case scenario.FaultLatency, scenario.FaultLoss:
		regions := d.regions
		if r != nil {
			regions = []*liveRegion{r}
		}
		for _, x := range regions {
			x.faults.set(func(t *tierFaults) {
				if f.Kind == scenario.FaultLatency {
					t.delay = time.Duration(float64(f.Latency) / d.scale)
				} else {
					t.loss = f.Loss
				}
			})
			if lasting > 0 {
				d.after(ctx, lasting, func() { x.faults.set(func(t *tierFaults) { t.delay, t.loss = 0, 0 }) })
			}
		}
		if f.Kind == scenario.FaultLoss {
			label = fmt.Sprintf("loss %.0f%%", 100*f.Loss)
		}
		until = lasting
	case scenario.FaultReplyLoss, scenario.FaultReportReplay:
		r.lease.set(func(lf *leaseFaults) {
			if f.Kind == scenario.FaultReplyLoss {
				lf.replyLoss = f.Loss
			} else {
				lf.replay = f.Loss
			}
		})
		d.after(ctx, lasting, func() {
			r.lease.set(func(lf *leaseFaults) {
				if f.Kind == scenario.FaultReplyLoss {
					lf.replyLoss = 0
				} else {
					lf.replay = 0
				}
			})
		})
		label = fmt.Sprintf("%s %s %.0f%%", f.Kind, f.Region, 100*f.Loss)
		until = lasting
	case scenario.FaultRegionReportReplay:
		r.faults.set(func(t *tierFaults) { t.replay = true })
		d.after(ctx, lasting, func() { r.faults.set(func(t *tierFaults) { t.replay = false }) })
		until = lasting
	case scenario.FaultInstanceIsolate:
		r.mu.Lock()
		var free []*liveInstance
		for _, in := range r.insts {
			if !in.isolated.Load() {
				free = append(free, in)
			}
		}
		r.mu.Unlock()
		free = free[:min(f.Count, len(free))]
		for _, in := range free {
			d.isolate(ctx, in, lasting)
		}
		label = fmt.Sprintf("%s ×%d", label, len(free))
		until = lasting
	case scenario.FaultRedisRestart:
		r.redis.Stop()
		d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.RedisDown(now, r.idx) })
		d.after(ctx, lasting, func() { d.restartRedis(r) })
		until = lasting
	case scenario.FaultRegionDown:
		label += d.regionDown(ctx, r, f)
		// Down to the end of the run, or until it is back.
		ra := time.Duration(f.RestartAfter)
		d.rec.do(func(o *oracle.Oracle, now time.Duration) {
			end := time.Duration(d.sc.Duration)
			if ra > 0 {
				end = min(end, now+ra)
			}
			o.Fault(now, end, label)
		})
		return
	}
	d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.Fault(now, now+until, label) })
}

// killLeader kills rep, region r's leader, as a crash does: its session
// lapses and the other replica takes over. A replacement starts where it
// ran (a new pod behind the same Service) and campaigns behind the
// surviving replica.
func (d *deployment) killLeader(ctx context.Context, r *liveRegion, rep *devcluster.RegionalReplica) {
	rep.Kill()
	d.faultJobs.Add(1)
	go func() {
		defer d.faultJobs.Done()
		if err := r.restartReplica(ctx, rep); err != nil && ctx.Err() == nil {
			fmt.Fprintf(d.log, "live: replacing the region leader of %s: %v\n", r.name, err)
		}
	}()
}

// regionDown kills region r whole, as virtual mode's region-down does:
// its link to the global tier is cut, every serving instance crashes, both
// regional replicas are killed (no resignation: their elections lapse with
// their sessions), and the global replica running in the region, if any
// (the topology's global primary or standby), is killed too. With
// RedisLost its Redis stops, to come back empty. With RestartAfter the
// region comes back: Redis (empty when lost), the link, the global
// replica, the regional replicas at their addresses, then as many
// instances as the topology gives it. It returns what the fault's label
// adds.
func (d *deployment) regionDown(ctx context.Context, r *liveRegion, f scenario.Fault) string {
	var label string
	r.faults.set(func(t *tierFaults) { t.partitioned = true })
	r.mu.Lock()
	insts := append([]*liveInstance(nil), r.insts...)
	r.mu.Unlock()
	for _, in := range insts {
		d.crash(in) // reads the instance's leases in Redis: before it stops
	}
	var globals []*devcluster.GlobalReplica
	for i, home := range d.globalHome {
		if home == r.name {
			g := d.c.Global[i]
			globals = append(globals, g)
			label += " (global replica " + g.Addr() + ")"
		}
	}
	// All at once: a replica killed after the others could win the
	// election they leave behind.
	var kills sync.WaitGroup
	for _, rep := range r.replicas {
		kills.Go(rep.Kill)
	}
	for _, g := range globals {
		kills.Go(g.Kill)
	}
	kills.Wait()
	lost := f.RedisLost && f.RestartAfter > 0
	if lost {
		r.redis.Stop()
		d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.RedisDown(now, r.idx) })
		label += " (Redis lost)"
	}
	ra := time.Duration(f.RestartAfter)
	if ra <= 0 {
		return label
	}
	n := 0
	for _, rs := range d.sc.Topology.Regions {
		if rs.Name == r.name {
			n = rs.Instances
		}
	}
	d.after(ctx, ra, func() {
		if lost {
			d.restartRedis(r)
		}
		r.faults.set(func(t *tierFaults) { t.partitioned = false })
		for _, g := range globals {
			if err := g.Restart(context.Background()); err != nil {
				fmt.Fprintf(d.log, "live: restarting the global replica in %s: %v\n", r.name, err)
				continue
			}
			d.addGlobal(g.Daemon())
		}
		for _, rep := range r.replicas {
			if err := r.restartReplica(ctx, rep); err != nil && ctx.Err() == nil {
				fmt.Fprintf(d.log, "live: restarting a replica of %s: %v\n", r.name, err)
			}
		}
		for i := 0; i < n && ctx.Err() == nil; i++ {
			if _, err := d.startInstance(r); err != nil {
				fmt.Fprintf(d.log, "live: restarting an instance of %s: %v\n", r.name, err)
			}
		}
		d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.Note(now, "region back: "+r.name) })
	})
	return label
}

// stop is a graceful shutdown: the load balancer stops sending, the
// request in flight is decided, then the client releases everything.
func (d *deployment) stop(in *liveInstance) {
	in.region.remove(in)
	in.dead.Store(true)
	in.serving.Lock()
	in.serving.Unlock() // (held only to wait for the request in flight)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := in.client.Close(ctx); err != nil {
		fmt.Fprintf(d.log, "live: stopping %s: %v\n", in.id, err)
	}
}

// unreported is what instance in spent of lease l of key k, as the region
// last stored it, without the region knowing: what the region counts
// unspent less what the instance still holds (world.HeldBy). Handed back
// to the bucket when the region reaps l, it is the crash error ε; 0 for a
// class that reclaims nothing.
func (d *deployment) unreported(in *liveInstance, k int, l luascripts.LeaseRecord) float64 {
	if d.cfg.Classes[d.plan.Keys[k].Class].Reclaim == "none" {
		return 0
	}
	st, _ := in.client.Table().State(d.plan.Keys[k])
	return max(l.Unspent()-world.HeldBy(st, l), 0)
}

// crash cuts an instance off without releasing anything, after telling the
// oracle its crash error: per key, tokens its region still counts unspent
// in the lease that the instance had spent.
func (d *deployment) crash(in *liveInstance) {
	r := in.region
	r.remove(in)
	in.dead.Store(true)
	in.mu.Lock()
	var keys []int
	for k := range in.used {
		keys = append(keys, k)
	}
	in.mu.Unlock()
	var eps []float64
	var tokens float64
	var lastExp time.Duration
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, k := range keys {
		l, ok, err := d.leaseRecord(ctx, in, k)
		if !ok || err != nil {
			eps = append(eps, 0)
			continue
		}
		unspent := l.Unspent()
		eps = append(eps, d.unreported(in, k, l))
		tokens += max(unspent, 0)
		lastExp = max(lastExp, d.rec.virtual(time.UnixMicro(l.ExpiryUS)))
	}
	in.conn.Close()
	d.rec.do(func(o *oracle.Oracle, now time.Duration) {
		for i, k := range keys {
			o.CrashError(now, k, eps[i])
		}
		o.Reclaimed(now, max(now, lastExp), tokens)
	})
}
