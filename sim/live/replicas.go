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
		grpc.WithKeepaliveParams(lease.KeepaliveParams()),
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

// grantHeld is told every grant a region leader's state read finds held
// (LeaderOptions.OnHeld), with its expiry as Redis stores it, before the
// report built from that read is sent. A grant set_rate applied whose
// answer the leader never got (a call that timed out on a starved
// machine after Redis ran it) has no OnApplied, and the oracle would go
// on counting the grant it replaced, up to that one's expiry, beside the
// capacity the global tier moves once the report acknowledges the new
// one. A held grant the oracle was not told is recorded here; the global
// tier acts on the report only after.
//
// The expiry is the stored one, not one worked out from the report's
// echo: the echo's validity counts from the key's state read, which the
// report does not date (its seq is the Redis time taken before the
// candidates and states are read, so on a starved machine the read comes
// hundreds of milliseconds later). Counted from the seq, a donor's
// grant ended early in the oracle, which then counted the region at its
// larger static share while Redis still refilled at the grant: a
// violation that never happened (seen: Σ 1.11 r at globex/read, the
// echoed grant ended 0.2 s of scenario time before Redis's). Counted
// from when the report left, a grant that had ended counted again.
func (d *deployment) grantHeld(region, key int, rate, burst float64, expiryUS int64) {
	now := time.Now()
	d.grantMu.Lock()
	defer d.grantMu.Unlock()
	if expiryUS <= now.UnixMicro() {
		return // ended before the read was seen: nothing to count from now
	}
	held := earlyGrant{rate, burst, expiryUS}
	if last, ok := d.seen[[2]int{region, key}]; ok && sameValue(last.rate, held.rate) && sameValue(last.burst, held.burst) &&
		last.expiryUS == held.expiryUS {
		return // the grant the oracle already counts
	}
	d.noteGrantLocked(region, key, held)
	// What the oracle counts from a read goes in the key's trace: a
	// violation beside a grant the leader did not apply is read against it.
	d.trace.add(key, region, now, fmt.Sprintf("oracle counts the held %.4g/s burst %.4g until %s (read from the region's Redis)",
		held.rate/d.scale, held.burst, d.untilLocked(held.expiryUS)))
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
