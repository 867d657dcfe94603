package regional_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional/reply"
	"github.com/sluicehq/sluice/pkg/regional/rpcerr"
)

// TestHungClusterMasterSkippedWhenCallersWaitLessThanRedisTimeout: the
// lease client waits less than the service's Redis timeout for its calls
// (an acquire four breaker timeouts, 200 ms by default; a Sync refresh/2,
// at most the Redis timeout). With one master of a three-master cluster
// stopped, its keys must still come to be answered at once as that node's
// failure, and a Sync with one of its keys per key, to callers that give up
// before the Redis timeout. (A caller that gave up left no verdict on the
// node, so a hung master was never skipped: every acquire for its keys ran
// into its caller's deadline and every Sync with one of its keys failed as
// a whole, for as long as the master was stopped, which opened the
// instances' per-region breakers and sent every key of the region to its
// on_failure policy.)
func TestHungClusterMasterSkippedWhenCallersWaitLessThanRedisTimeout(t *testing.T) {
	t.Parallel()
	t.Run("acquire", func(t *testing.T) { t.Parallel(); hungMasterShortCallers(t, false) })
	t.Run("sync", func(t *testing.T) { t.Parallel(); hungMasterShortCallers(t, true) })
}

func hungMasterShortCallers(t *testing.T, sync bool) {
	cfg := regiontest.MustConfig(t, `
lease_ttl: 1s
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  read: {mode: lease, on_failure: closed}
tiers:
  free: {read: {rate: 1000/s, burst: 1000}}
default_tier: free
`)
	procs, d, masterOf := startClusterRegion(t, cfg)
	ctx := context.Background()
	stopped := procs[0]
	var hung, healthy string
	for i := 0; hung == "" || healthy == ""; i++ {
		tenant := fmt.Sprintf("t%d", i)
		if masterOf(tenant, "read") == stopped.Addr() {
			hung = tenant
		} else {
			healthy = tenant
		}
	}
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rpc := sluicev1.NewLeaseServiceClient(conn)
	n := 0
	syncBoth := func(wait time.Duration) (*sluicev1.SyncResponse, error) {
		n++
		cctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		return rpc.Sync(cctx, &sluicev1.SyncRequest{InstanceId: fmt.Sprintf("i%d", n), Incarnation: 1, KeyFailures: true,
			Reports: []*sluicev1.KeyReport{
				{Key: qk(healthy, "read"), Seq: 1, Lease: 1, Want: 1},
				{Key: qk(hung, "read"), Seq: 1, Lease: 1, Want: 1},
			}})
	}
	acquireHung := func(wait time.Duration) error {
		n++
		cctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		_, err := rpc.Acquire(cctx, &sluicev1.AcquireRequest{InstanceId: fmt.Sprintf("i%d", n), Incarnation: 1,
			Report: &sluicev1.KeyReport{Key: qk(hung, "read"), Seq: 1, Lease: 1, Want: 1, Min: 1}})
		return err
	}
	if _, err := syncBoth(10 * reply.DefaultRedisTimeout); err != nil {
		t.Fatalf("a Sync before the stop: %v", err)
	}

	if err := stopped.Pause(); err != nil {
		t.Fatal(err)
	}
	defer stopped.Resume()
	// Callers that wait a fraction of the Redis timeout, as the lease
	// client's do.
	wait := reply.DefaultRedisTimeout / 2
	var last error
	for deadline := time.Now().Add(20 * reply.DefaultRedisTimeout); ; {
		if time.Now().After(deadline) {
			t.Fatalf("%v after the stop, calls that wait %v still not answered as the stopped master's failure; last: %v",
				20*reply.DefaultRedisTimeout, wait, last)
		}
		if sync {
			resp, err := syncBoth(wait)
			if err == nil && !resp.Grants[0].RedisFailed && resp.Grants[1].RedisFailed {
				return
			}
			last = err
			if err == nil {
				last = fmt.Errorf("grants %v", resp.Grants)
			}
			continue
		}
		err := acquireHung(wait)
		if rpcerr.RedisNodeFailed(err) {
			return
		}
		last = err
	}
}
