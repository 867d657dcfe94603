package live

import (
	"context"
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
	if d.rec == nil {
		if d.early == nil {
			d.early = map[[2]int]earlyGrant{}
		}
		d.early[[2]int{region, key}] = earlyGrant{rate, burst, expiryUS}
		return
	}
	d.recordGrantLocked(region, key, earlyGrant{rate, burst, expiryUS})
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
