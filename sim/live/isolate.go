package live

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/sim/oracle"
)

// An isolated instance is alive but cut off from its region's service, as
// in the virtual simulator (sim/world/isolate.go): its lease calls fail
// (leasefaults.go), it serves from its leases until their deadlines, then
// by its classes' on_failure. When the region reaps such a lease, the
// tokens the instance spent since its last delivered report go back to
// the bucket and are handed out again: ε, bounded by what the lease held
// at that report, counted like a crashed instance's. The region's reaping
// happens inside its scripts, so each watched lease record is read from
// Redis once per epoch: a record gone, or replaced by a new lease, after
// its expiry was reaped. A watch ends once a report after the isolation
// reached the lease, the record is gone, or the run ends.

// isolate cuts in off from its region for lasting (scenario time) and
// follows the leases it holds now.
func (d *deployment) isolate(ctx context.Context, in *liveInstance, lasting time.Duration) {
	r := in.region
	in.mu.Lock()
	var keys []int
	for k := range in.used {
		keys = append(keys, k)
	}
	in.mu.Unlock()
	in.isolated.Store(true)
	watched := map[int]luascripts.LeaseRecord{}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	for _, k := range keys {
		if l, ok, err := d.leaseRecord(rctx, in, k); ok && err == nil {
			watched[k] = l
		}
	}
	cancel()
	d.after(ctx, lasting, func() { in.isolated.Store(false) })
	if len(watched) == 0 {
		return
	}
	d.faultJobs.Add(1)
	go func() {
		defer d.faultJobs.Done()
		healSeq := map[int]uint64{}
		tick := time.NewTicker(time.Duration(d.cfg.Epoch))
		defer tick.Stop()
		for len(watched) > 0 {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			healed := !in.isolated.Load()
			if healed && len(healSeq) == 0 {
				for k, l := range watched {
					healSeq[k] = l.Seq
				}
			}
			rctx, cancel := context.WithTimeout(ctx, time.Duration(d.cfg.Epoch))
			nowUS, err := r.rdb.Time(rctx).Result()
			if err != nil {
				cancel()
				continue // Redis down: nothing is reaped meanwhile
			}
			for k, last := range watched {
				l, ok, err := d.leaseRecord(rctx, in, k)
				if err != nil {
					break // read again next epoch
				}
				if ok && l.Continues(last) {
					watched[k] = l
					if healed && l.Seq > healSeq[k] {
						// A report after the isolation reached it: what
						// the instance spent meanwhile is counted.
						fmt.Fprintf(d.log, "live: isolated %s's lease of %s outlived the isolation\n", in.id, d.plan.Keys[k])
						delete(watched, k)
					}
					continue
				}
				// Reaped only if it had expired: a record dropped before
				// its expiry (superseded) gives nothing back.
				if last.ExpiryUS <= nowUS.UnixMicro() {
					eps := d.unreported(in, k, last)
					fmt.Fprintf(d.log, "live: isolated %s's lease of %s reaped: ε %.1f tokens\n", in.id, d.plan.Keys[k], eps)
					if eps > 0 {
						d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.CrashError(now, k, eps) })
					}
				}
				delete(watched, k)
			}
			cancel()
		}
	}()
}

// leaseRecord reads in's lease record of key k from its region's Redis:
// ok false when there is none (or it does not parse), err when Redis did
// not answer.
func (d *deployment) leaseRecord(ctx context.Context, in *liveInstance, k int) (l luascripts.LeaseRecord, ok bool, err error) {
	rec, err := in.region.rdb.HGet(ctx, d.rkeys[k].Bucket, luascripts.LeaseField(in.id)).Result()
	if errors.Is(err, redis.Nil) {
		return l, false, nil
	}
	if err != nil {
		return l, false, err
	}
	l, perr := luascripts.ParseLeaseRecord(rec)
	return l, perr == nil, nil
}
