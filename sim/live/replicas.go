package live

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/sluicehq/sluice/internal/embedetcd"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/sim/oracle"
)

// replicasPerRegion is how many regional daemons serve each region. Two
// make a region leader's loss survivable: the other replica takes over
// the leadership and keeps serving leases.
const replicasPerRegion = 2

// regionReplica is one regional daemon of a region at a fixed address, so
// a replacement comes back where the instances already dial.
type regionReplica struct {
	addr string

	mu  sync.Mutex       // guards d and cli
	d   *regional.Daemon // nil while down
	cli *clientv3.Client // its own etcd client, so a crash cuts only its session
}

// startReplica runs (or reruns) a regional daemon at rep.addr.
func (d *deployment) startReplica(ctx context.Context, r *liveRegion, rep *regionReplica) error {
	cli, err := d.etcdClient()
	if err != nil {
		return err
	}
	cold := regional.ColdStartFull
	if d.sc.Topology.ColdStart == "conservative" {
		cold = regional.ColdStartConservative
	}
	dm, err := regional.StartDaemon(ctx, regional.DaemonOptions{
		Region: r.name, GRPCAddr: rep.addr, HTTPAddr: "off", RedisAddr: r.redis.Addr(),
		Config: regional.StaticConfig{C: d.cfg}, ColdStart: cold, Logger: d.logger,
		Leader: &regional.LeaderOptions{
			Etcd: cli, ElectionPrefix: configstore.NewStore(cli, etcdPrefix).ElectionPrefix(),
			Global: r.tier, SessionTTL: sessionTTL(time.Duration(d.sc.Topology.SessionTTL), d.scale),
			OnApplied: func(k quota.Key, rate, burst float64, expiryUS int64) {
				if key, ok := d.keyID[k]; ok {
					d.grantApplied(r.idx, key, rate, burst, expiryUS)
				}
			},
		},
	})
	if err != nil {
		cli.Close()
		return fmt.Errorf("region %s replica %s: %w", r.name, rep.addr, err)
	}
	rep.mu.Lock()
	rep.d, rep.cli = dm, cli
	rep.mu.Unlock()
	r.mu.Lock()
	r.daemons = append(r.daemons, dm)
	r.mu.Unlock()
	return nil
}

// stopReplica stops rep's daemon. A crash first closes its etcd client,
// so its session is neither kept alive nor resigned: another replica is
// elected only once the session's TTL lapses, as after a real crash.
func stopReplica(rep *regionReplica, crash bool) {
	rep.mu.Lock()
	dm, cli := rep.d, rep.cli
	rep.d, rep.cli = nil, nil
	rep.mu.Unlock()
	if dm == nil {
		return
	}
	if crash {
		cli.Close()
	}
	dm.Stop()
	cli.Close()
}

// leadingReplica is the replica leading r now, or nil.
func (r *liveRegion) leadingReplica() *regionReplica {
	for _, rep := range r.replicas {
		rep.mu.Lock()
		dm := rep.d
		rep.mu.Unlock()
		if dm != nil && dm.Leader != nil && dm.Leader.IsLeading() {
			return rep
		}
	}
	return nil
}

// dialRegion connects an instance to every replica of r, round robin, as a
// Kubernetes Service would: a replica that goes down drops out of the
// rotation until it is back.
func dialRegion(r *liveRegion) (*grpc.ClientConn, error) {
	res := manual.NewBuilderWithScheme("sluice-sim")
	var addrs []resolver.Address
	for _, rep := range r.replicas {
		addrs = append(addrs, resolver.Address{Addr: rep.addr})
	}
	res.InitialState(resolver.State{Addresses: addrs})
	return grpc.NewClient(res.Scheme()+":///"+r.name, grpc.WithResolvers(res),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// etcdClient is a new client of the embedded etcd's fixed endpoint.
func (d *deployment) etcdClient() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{d.etcdAddr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, nil
}

// startEtcd runs (or reruns) the embedded etcd on its fixed addresses and
// data dir.
func (d *deployment) startEtcd() error {
	e, err := embedetcd.StartAt("sluice-sim", d.etcdDir, d.etcdAddr, d.etcdPeerAddr, nil)
	if err != nil {
		return err
	}
	d.etcdMu.Lock()
	d.etcd = e
	d.etcdMu.Unlock()
	return nil
}

// stopEtcd shuts the embedded etcd down; every client loses it until
// startEtcd.
func (d *deployment) stopEtcd() {
	d.etcdMu.Lock()
	e := d.etcd
	d.etcd = nil
	d.etcdMu.Unlock()
	if e != nil {
		e.Close()
	}
}

// loopbackAddr is a free loopback host:port.
func loopbackAddr() (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), nil
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
	d.early = nil
}
