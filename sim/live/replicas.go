package live

import (
	"context"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/sim/oracle"
)

// replicasPerRegion is how many regional daemons serve each region. Two
// make a region leader's loss survivable: the other replica takes over
// the leadership and keeps serving leases.
const replicasPerRegion = 2

// leadingReplica is the replica leading r now, or nil.
func (r *liveRegion) leadingReplica() *devcluster.RegionalReplica {
	for _, rep := range r.replicas {
		if rep.IsLeading() {
			return rep
		}
	}
	return nil
}

// restartReplica starts rep again at its address (a new pod behind the
// same Service) and keeps its daemon for the metrics.
func (r *liveRegion) restartReplica(ctx context.Context, rep *devcluster.RegionalReplica) error {
	if err := rep.Restart(ctx); err != nil {
		return err
	}
	if dm := rep.Daemon(); dm != nil {
		r.mu.Lock()
		r.daemons = append(r.daemons, dm)
		r.mu.Unlock()
	}
	return nil
}

// dialRegion connects an instance to every replica of r as an application
// does (lease.ServiceConfig, lease.ConnectParams): round robin, as over a
// headless Service, a replica that goes down dropping out of the rotation
// until it is back, and a lease RPC cut by a replica's stop sent once more
// to the other.
func dialRegion(r *liveRegion, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	res := manual.NewBuilderWithScheme("sluice-sim")
	var addrs []resolver.Address
	for _, rep := range r.replicas {
		addrs = append(addrs, resolver.Address{Addr: rep.Addr()})
	}
	res.InitialState(resolver.State{Addresses: addrs})
	return grpc.NewClient(res.Scheme()+":///"+r.name, append([]grpc.DialOption{grpc.WithResolvers(res),
		grpc.WithDefaultServiceConfig(lease.ServiceConfig), grpc.WithConnectParams(lease.ConnectParams()),
		grpc.WithTransportCredentials(insecure.NewCredentials())}, extra...)...)
}

// earlyGrant is a grant a region applied before recording began.
type earlyGrant struct {
	rate, burst float64
	expiryUS    int64
}

// grantApplied tells the oracle that region applied a grant of key. Region
// leaders call it as soon as Redis accepted the grant, before their next
// report, so the oracle sees a donor's smaller grant before any recipient
// can be given the difference: observing by polling Redis instead would
// now and then see the recipient's grant first, an oversubscription that
// never happened.
func (d *deployment) grantApplied(region, key int, rate, burst float64, expiryUS int64) {
	d.grantMu.Lock()
	defer d.grantMu.Unlock()
	d.trace.add(key, region, time.Now(), fmt.Sprintf("applied %.4g/s burst %.4g until %s", rate/d.scale, burst, d.untilLocked(expiryUS)))
	d.noteGrantLocked(region, key, earlyGrant{rate, burst, expiryUS})
}

// untilLocked is how the key trace shows a grant's expiry: scenario time
// once recording began, wall time before. The caller holds grantMu.
func (d *deployment) untilLocked(expiryUS int64) string {
	if d.rec != nil {
		return fmt.Sprintf("%.3fs", d.rec.virtual(time.UnixMicro(expiryUS)).Seconds())
	}
	return fmt.Sprintf("wall %s", time.UnixMicro(expiryUS).Format("15:04:05.000"))
}

// reportedHeld is told every report region's leader sends, before the
// global tier sees it. A report echoes what the region's Redis holds of
// each key's grant, read just before it: a grant set_rate applied whose
// answer the leader never got (a call that timed out on a starved
// machine after Redis ran it) has no OnApplied, and the oracle would go
// on counting the grant it replaced, up to that one's expiry, beside the
// capacity the global tier moves once this report acknowledges the new
// one. A held grant the oracle was not told is recorded here; the global
// tier acts on the report only after.
//
// The echo's validity counts from the read, whose Redis time is the
// report's seq or earlier (regionsync.Leader.Report: seq is
// max(last + 1, send time)), so the grant ends at the latest at seq plus
// the validity echoed (plus the millisecond it was truncated to), not at
// now plus it: the report may leave long after the read on a starved
// machine, and a grant that ended meanwhile, counted again from now, is
// an oversubscription that never happened (seen: a grant that had ended
// 0.65 s of scenario time before counted again beside the static share
// the region had fallen back to).
func (d *deployment) reportedHeld(region int, r *sluicev1.RegionReport) {
	now := time.Now()
	d.grantMu.Lock()
	defer d.grantMu.Unlock()
	readUS := min(int64(r.GetSeq()), now.UnixMicro())
	for _, kd := range r.GetKeys() {
		if kd.GetHeldValidMs() <= 0 {
			continue
		}
		key, ok := d.keyOf(kd.GetKey())
		if !ok {
			continue
		}
		held := earlyGrant{kd.GetHeldRate(), kd.GetHeldBurst(), readUS + (kd.GetHeldValidMs()+1)*1000}
		if held.expiryUS <= now.UnixMicro() {
			continue // ended before the report left: nothing to count from now
		}
		// The grant the oracle already counts, at least as long: its
		// expiry stands.
		if last, ok := d.seen[[2]int{region, key}]; ok && sameValue(last.rate, held.rate) && sameValue(last.burst, held.burst) &&
			last.expiryUS >= held.expiryUS-1000 {
			continue
		}
		d.noteGrantLocked(region, key, held)
		// What the oracle counts from an echo goes in the key's trace: a
		// violation beside an echoed grant is read against it.
		d.trace.add(key, region, now, fmt.Sprintf("oracle counts the echoed %.4g/s burst %.4g until %s (read at %s)",
			held.rate/d.scale, held.burst, d.untilLocked(held.expiryUS), d.untilLocked(readUS)))
	}
}

// sameValue: a rate or burst read back from Redis is the one applied, up
// to its decimal round trip.
func sameValue(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(math.Abs(a), math.Abs(b)) }

// noteGrantLocked records that region holds grant g of key; the caller
// holds grantMu.
func (d *deployment) noteGrantLocked(region, key int, g earlyGrant) {
	if d.seen == nil {
		d.seen = map[[2]int]earlyGrant{}
	}
	d.seen[[2]int{region, key}] = g
	if d.rec == nil {
		if d.early == nil {
			d.early = map[[2]int]earlyGrant{}
		}
		d.early[[2]int{region, key}] = g
		return
	}
	d.recordGrantLocked(region, key, g)
}

func (d *deployment) recordGrantLocked(region, key int, g earlyGrant) {
	expiry := d.rec.virtual(time.UnixMicro(g.expiryUS))
	d.rec.do(func(o *oracle.Oracle, now time.Duration) {
		if expiry > now {
			o.GrantApplied(now, region, key, g.rate/d.scale, g.burst, expiry)
		}
	})
}

// startRecording makes rec the recorder and hands it the grants applied
// so far.
func (d *deployment) startRecording(rec *recorder) {
	d.grantMu.Lock()
	defer d.grantMu.Unlock()
	d.rec = rec
	for k, g := range d.early {
		d.recordGrantLocked(k[0], k[1], g)
	}
	for region, told := range d.told {
		for k, s := range told {
			if s.ok {
				d.tellShareLocked(region, k, s)
			}
		}
	}
	for region, until := range d.staticEnd {
		d.tellStaticLocked(region, until)
	}
	d.early = nil
}
