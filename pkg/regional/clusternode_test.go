package regional_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redisproc"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/regional/reply"
	"github.com/sluicehq/sluice/pkg/regional/rpcerr"
)

// TestOneFailedClusterMasterCostsOnlyItsKeys: a region on a three-master
// Redis Cluster, one master stopped (SIGSTOP, as a stalled disk or a frozen
// VM does) or killed. The keys of the other two masters go on being served from
// leases the region renews: an instance's Sync is answered for them, with
// the stopped master's keys marked redis_failed, and its requests on them
// are never decided by the failure policy for longer than a lease lasts.
// The stopped master's keys are decided by their on_failure policy
// (closed: denied) and, once a stopped one runs again, by the region
// again. (One hung master failed every Sync it had a key in, its
// pipelines held the service's batch workers, and each request on its
// keys called the region.)
func TestOneFailedClusterMasterCostsOnlyItsKeys(t *testing.T) {
	// Clusters of their own, mostly waiting on lease periods: they run
	// side by side and beside the package's other parallel tests.
	t.Parallel()
	t.Run("hung", func(t *testing.T) { t.Parallel(); oneFailedClusterMaster(t, false) })
	t.Run("killed", func(t *testing.T) { t.Parallel(); oneFailedClusterMaster(t, true) })
}

func oneFailedClusterMaster(t *testing.T, kill bool) {
	const cfgText = `
lease_ttl: 1s
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  read:   {mode: lease, on_failure: closed}
  export: {mode: strict, on_failure: closed}
tiers:
  free: {read: {rate: 200/s, burst: 200}, export: {rate: 200/s, burst: 200}}
default_tier: free
`
	cfg := regiontest.MustConfig(t, cfgText)
	procs, d, masterOf := startClusterRegion(t, cfg)
	ttl, refresh := time.Duration(cfg.LeaseTTL), time.Duration(cfg.Refresh)
	ctx := context.Background()
	stopped := procs[0]
	var hung, healthy []string
	for i := 0; len(hung) < 2 || len(healthy) < 4; i++ {
		tenant := fmt.Sprintf("t%d", i)
		if masterOf(tenant, "read") == stopped.Addr() {
			if len(hung) < 2 {
				hung = append(hung, tenant)
			}
		} else if len(healthy) < 4 {
			healthy = append(healthy, tenant)
		}
	}

	// The instance's acquires for the stopped master's keys, counted from
	// the first answer that the master failed (an acquire's, or a key's in
	// a Sync); before it, a call waits out the instance's own wait while
	// the master is not known failed yet, more of them the busier the
	// machine.
	isHung := map[string]bool{hung[0]: true, hung[1]: true}
	var hungCalls atomic.Int64
	var firstAnswer atomic.Pointer[time.Time]
	answered := func() {
		now := time.Now()
		firstAnswer.CompareAndSwap(nil, &now)
	}
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		r, acq := req.(*sluicev1.AcquireRequest)
		acq = acq && isHung[r.GetReport().GetKey().GetTenant()]
		if acq && firstAnswer.Load() != nil {
			hungCalls.Add(1)
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if acq && rpcerr.RedisNodeFailed(err) {
			answered()
		}
		if resp, ok := reply.(*sluicev1.SyncResponse); ok && err == nil {
			for _, g := range resp.GetGrants() {
				if g.GetRedisFailed() && isHung[g.GetKey().GetTenant()] {
					answered()
				}
			}
		}
		return err
	}
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(count))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const cooldown = time.Second
	client, err := lease.NewClient(conn, lease.Options{InstanceID: "i1", Refresh: refresh, BreakerCooldown: cooldown})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close(context.Background())
	allow := func(tenant string) quota.Decision {
		dec, err := client.Allow(ctx, quota.Key{Tenant: tenant, Class: "read"}, 1)
		if err != nil {
			t.Fatalf("allow %s: %v", tenant, err)
		}
		return dec
	}
	// Every key leased before the fault. A first acquire that outlives the
	// instance's wait on a busy machine is decided by the policy: ask
	// again, within many lease TTLs.
	for _, tenant := range append(append([]string{}, healthy...), hung...) {
		for deadline := time.Now().Add(20 * ttl); ; {
			dec := allow(tenant)
			if dec.Allowed && !dec.Degraded {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("requests on %s before the fault not decided by the region within %v: %+v", tenant, 20*ttl, dec)
			}
			time.Sleep(refresh / 10) // polling the key's decisions with a deadline
		}
	}

	resumed := kill // a killed master is not brought back
	if kill {
		stopped.Stop()
	} else if err := stopped.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	defer func() {
		if !resumed {
			stopped.Resume()
		}
	}()

	// The service itself: a Sync that takes per-key failures is answered
	// for the healthy masters' keys, the stopped one's marked.
	rpc := sluicev1.NewLeaseServiceClient(conn)
	var reports []*sluicev1.KeyReport
	for _, tenant := range []string{healthy[0], hung[0]} {
		reports = append(reports, &sluicev1.KeyReport{Key: qk(tenant, "read"), Seq: 1, Lease: 1, Want: 3})
	}
	resp, err := rpc.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "raw", Incarnation: 1, Reports: reports, KeyFailures: true})
	if err != nil {
		t.Errorf("a Sync with a key on the stopped master and one on a healthy master: %v, want per-key answers", err)
	} else {
		if g := resp.Grants[0]; g.RedisFailed || g.Granted != 3 {
			t.Errorf("the healthy master's key: %+v, want its 3 tokens granted", g)
		}
		if g := resp.Grants[1]; !g.RedisFailed || g.Granted != 0 {
			t.Errorf("the stopped master's key: %+v, want redis_failed and nothing granted", g)
		}
	}
	// A single-key call on the stopped master's key is answered as that
	// node's failure, one on a healthy master's key served.
	// A Release of a key on each is answered as the stopped master's
	// failure within about a Redis timeout, not held until the caller's
	// deadline.
	rctx, cancel := context.WithTimeout(ctx, 20*reply.DefaultRedisTimeout)
	_, err = rpc.Release(rctx, &sluicev1.ReleaseRequest{InstanceId: "raw", Incarnation: 1, Reports: []*sluicev1.KeyReport{
		{Key: qk(healthy[0], "read"), Seq: 2, Lease: 1},
		{Key: qk(hung[0], "read"), Seq: 2, Lease: 1},
	}})
	cancel()
	if !rpcerr.RedisNodeFailed(err) {
		t.Errorf("a Release with a key on the stopped master: %v, want its node's failure (REDIS_NODE_FAILED)", err)
	}
	_, err = rpc.Check(ctx, &sluicev1.CheckRequest{Key: qk(hung[0], "export"), Cost: 1})
	if masterOf(hung[0], "export") == stopped.Addr() && !rpcerr.RedisNodeFailed(err) {
		t.Errorf("a Check on the stopped master's key: %v, want its node's failure (REDIS_NODE_FAILED)", err)
	}
	for _, tenant := range healthy {
		if masterOf(tenant, "export") == stopped.Addr() {
			continue
		}
		if c, err := rpc.Check(ctx, &sluicev1.CheckRequest{Key: qk(tenant, "export"), Cost: 1}); err != nil || !c.Allowed {
			t.Errorf("a Check on a healthy master's key %s while another master is stopped: %v %v", tenant, c, err)
		}
	}

	// The instance: the healthy keys are decided from leases the region
	// renews for several lease TTLs in a row (a lease not renewed ends
	// after one), the stopped master's keys by their policy, which takes
	// no call for a breaker cooldown after the region answered that their
	// master failed. Requests on the healthy keys spaced a tenth of a
	// refresh, far within the keys' rate; on the stopped master's keys as
	// fast as four callers go.
	stopHammer := make(chan struct{})
	var hammering sync.WaitGroup
	for i := range 4 {
		hammering.Go(func() {
			for {
				select {
				case <-stopHammer:
					return
				default:
				}
				if _, err := client.Allow(ctx, quota.Key{Tenant: hung[i%2], Class: "read"}, 1); err != nil {
					t.Errorf("allow %s: %v", hung[i%2], err)
					return
				}
				time.Sleep(refresh / 100) // a caller's pace, not a wait for anything
			}
		})
	}
	var stopOnce sync.Once
	stopHammering := func() {
		stopOnce.Do(func() {
			close(stopHammer)
			hammering.Wait()
		})
	}
	defer stopHammering()
	const streakTTLs = 3
	wait := 30 * (ttl + reply.DefaultRedisTimeout)
	var streakFrom time.Time
	sawHungDegraded := false
	last := map[string]quota.Decision{}
	for deadline := paused.Add(wait); ; {
		now := time.Now()
		if now.After(deadline) {
			t.Fatalf("within %v of the stop: healthy keys decided by the region for %v at most in a row, want %d lease TTLs (%v); hung key degraded: %v; last decisions %+v",
				wait, now.Sub(streakFrom), streakTTLs, streakTTLs*ttl, sawHungDegraded, last)
		}
		ok := true
		for _, tenant := range healthy {
			dec := allow(tenant)
			last[tenant] = dec
			if dec.Degraded || !dec.Allowed {
				ok = false
			}
		}
		for _, tenant := range hung {
			if dec := allow(tenant); dec.Degraded && !dec.Allowed {
				sawHungDegraded = true
			}
		}
		switch {
		case !ok:
			streakFrom = time.Time{}
		case streakFrom.IsZero():
			streakFrom = now
		case now.Sub(streakFrom) >= streakTTLs*ttl && sawHungDegraded:
			goto recovered
		}
		time.Sleep(refresh / 10) // spacing requests at a rate the keys allow
	}
recovered:
	stopHammering()
	// Once the region answered that the master failed: at most one call
	// per key and cooldown, and a call per key in flight at that answer.
	first := firstAnswer.Load()
	if first == nil {
		t.Fatal("the region never answered that the stopped master failed (no acquire answered REDIS_NODE_FAILED, no redis_failed grant in a Sync)")
	}
	since := time.Since(*first)
	if n, most := hungCalls.Load(), int64(len(hung))*(int64(since/cooldown)+2); n > most {
		t.Errorf("%d acquires for the stopped master's %d keys in the %v since the region first answered that their master failed, want at most %d (one per key and cooldown %v): its keys' requests each called the region",
			n, len(hung), since.Round(time.Millisecond), most, cooldown)
	}
	if kill {
		return
	}
	if err := stopped.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	// Running again, the stopped master's keys are the region's again.
	for deadline := time.Now().Add(wait); ; {
		if dec := allow(hung[0]); dec.Allowed && !dec.Degraded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the resumed master's key %s still decided by its policy %v after the resume", hung[0], wait)
		}
		time.Sleep(refresh / 10) // polling the key's decisions with a deadline
	}
}

// startClusterRegion runs an unleased regional daemon on cfg over a fresh
// three-master Redis Cluster that serves the other masters' slots once it
// marked a failed one failed (without full coverage required, as the
// failure table advises; with it, every node refuses then), after the
// restart guard's first look. masterOf names the master holding a key's
// bucket. Everything stops at cleanup.
func startClusterRegion(t *testing.T, cfg *config.Config) (procs []*redisproc.Proc, d *regional.Daemon, masterOf func(tenant, class string) string) {
	t.Helper()
	procs = redistest.StartClusterProcs(t, 3, "--cluster-require-full-coverage", "no")
	var addrs []string
	for _, p := range procs {
		addrs = append(addrs, p.Addr())
	}
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: strings.Join(addrs, ","),
		Config: regional.StaticConfig{C: cfg}, ColdStart: regional.ColdStartFull, Unleased: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	awaitFirstLook(t, d)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { cc.Close() })
	return procs, d, func(tenant, class string) string {
		c, err := cc.MasterForKey(context.Background(), luascripts.ClusterKeysFor(luascripts.DefaultPrefix, quota.Key{Tenant: tenant, Class: class}).Bucket)
		if err != nil {
			t.Fatal(err)
		}
		return c.Options().Addr
	}
}
