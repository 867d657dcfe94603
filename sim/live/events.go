package live

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/scenario"
)

// Operator events and the static shares they move. An event (drain,
// restore) is a config revision written to the embedded etcd, as sluicectl
// writes it; every regional replica adopts it when its config watch
// delivers it, and raises a share only once the global tier confirms a
// revision every region reported (regionsync.Chain). The oracle learns
// each replica's static shares from the replica itself (regional.Options.
// OnChain, called before anything is served under a new chain), the way it
// learns grants (OnApplied): a donor's lowered share is seen before the
// global tier can hand it to another region, so the oracle's order is the
// order that matters.

// keyShare is one key's static share and floor under one chain, in the
// daemons' units (rates scaled).
type keyShare struct {
	rate, burst, floorRate, floorBurst float64
	ok                                 bool // the key resolves under the chain
}

// chainShares is region's replica's static share of every key of the plan
// under chain c, as world.chainShares works it out in virtual mode.
func (d *deployment) chainShares(region string, c regionsync.Chain) []keyShare {
	cur := c.Current().Cfg
	out := make([]keyShare, len(d.plan.Keys))
	if cur == nil {
		return out
	}
	for i, k := range d.plan.Keys {
		res, err := cur.Resolve(k)
		if err != nil {
			continue
		}
		rate, burst, err := c.Share(region, k, cur, res)
		if err != nil {
			continue
		}
		fl := regionsync.FloorOf(regionsync.Share{Rate: rate, Burst: burst}, res)
		out[i] = keyShare{rate: rate, burst: burst, floorRate: fl.Rate, floorBurst: fl.Burst, ok: true}
	}
	return out
}

// chainStored is regional.Options.OnChain for replica (its number) of
// region: it keeps the replica's shares and hands the oracle every key
// whose largest share over the region's replicas changed (both replicas
// serve, so the region may run on the larger).
func (d *deployment) chainStored(region string, replica int, c regionsync.Chain) {
	shares := d.chainShares(region, c)
	d.grantMu.Lock()
	defer d.grantMu.Unlock()
	if d.byReplica == nil {
		d.byReplica = map[int][]keyShare{}
		d.replicaRegion = map[int]string{}
		d.told = map[string][]keyShare{}
	}
	d.byReplica[replica], d.replicaRegion[replica] = shares, region
	told := d.told[region]
	if told == nil {
		told = make([]keyShare, len(d.plan.Keys))
		d.told[region] = told
	}
	for k := range d.plan.Keys {
		var top keyShare
		for rep, s := range d.byReplica {
			if d.replicaRegion[rep] != region || !s[k].ok {
				continue
			}
			x := s[k]
			if !top.ok {
				top = x
				continue
			}
			top.rate, top.burst = max(top.rate, x.rate), max(top.burst, x.burst)
			top.floorRate, top.floorBurst = max(top.floorRate, x.floorRate), max(top.floorBurst, x.floorBurst)
		}
		if top == told[k] {
			continue
		}
		told[k] = top
		if d.rec != nil && top.ok {
			d.tellShareLocked(region, k, top)
		}
	}
}

// tellShareLocked hands the oracle region's static share of key k; the
// caller holds grantMu and rec is set.
func (d *deployment) tellShareLocked(region string, k int, s keyShare) {
	idx, ok := d.regionIdx[region]
	if !ok {
		return
	}
	d.rec.do(func(o *oracle.Oracle, now time.Duration) {
		o.StaticShares(now, idx, k, s.rate/d.scale, s.burst, s.floorRate/d.scale, s.floorBurst)
	})
}

// playEvents writes the scenario's operator events at their times, in
// order, until ctx ends.
func (d *deployment) playEvents(ctx context.Context) {
	events := slices.Clone(d.sc.Events)
	slices.SortStableFunc(events, func(a, b scenario.Event) int { return int(a.At - b.At) })
	for _, e := range events {
		if sleepUntil(ctx, d.wallAt(time.Duration(e.At))) != nil {
			return
		}
		d.event(ctx, e)
	}
}

// event writes one operator event as a new config revision, retried
// every epoch while etcd does not take it (an outage, a write racing
// another), as an operator retries sluicectl.
func (d *deployment) event(ctx context.Context, e scenario.Event) {
	tick := time.NewTicker(time.Duration(d.cfg.Epoch))
	defer tick.Stop()
	for tries := 1; ; tries++ {
		rev, err := d.writeEvent(ctx, e)
		if err == nil {
			d.rec.do(func(o *oracle.Oracle, now time.Duration) {
				o.Note(now, fmt.Sprintf("config revision %d written: %s %s", rev, e.Kind, e.Region))
			})
			return
		}
		var invalid *invalidEvent
		if errors.As(err, &invalid) || ctx.Err() != nil {
			if ctx.Err() == nil {
				fmt.Fprintf(d.log, "live: %s %s: %v\n", e.Kind, e.Region, err)
			}
			return
		}
		if tries == 1 {
			fmt.Fprintf(d.log, "live: %s %s: %v; retrying every epoch\n", e.Kind, e.Region, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// eventTimeout bounds one try of writing an event: etcd's own request
// bound, not the scaled epoch, which a busy etcd's write may outlast.
const eventTimeout = 5 * time.Second

// invalidEvent is an event whose config the store would refuse.
type invalidEvent struct{ err error }

func (e *invalidEvent) Error() string { return "the new config is invalid: " + e.err.Error() }

// writeEvent reads the config etcd holds and writes it back with the
// event's region drained or restored, fenced on the revision read.
func (d *deployment) writeEvent(ctx context.Context, e scenario.Event) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, eventTimeout)
	defer cancel()
	cur, rev, err := d.c.Store.Get(ctx)
	if err != nil {
		return 0, err
	}
	next := *cur
	next.Regions = maps.Clone(cur.Regions)
	rg := next.Regions[e.Region]
	rg.Drained = e.Kind == scenario.EventDrain
	next.Regions[e.Region] = rg
	if err := next.Validate(); err != nil {
		return 0, &invalidEvent{err}
	}
	if cur.Regions[e.Region].Drained == rg.Drained {
		// An earlier try was written after all (its answer was lost), or
		// the config already says so: nothing to write.
		return rev, nil
	}
	return d.c.Store.Apply(ctx, &next, rev)
}
