package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestAFrozenReplicaLeavesTheRotation: of two replicas an instance
// balances over, one freezes (a paused process, a frozen node: its
// connection stays open and nothing on it is answered, not even HTTP/2
// pings). Round robin went on sending it half the calls for as long as
// the freeze lasted, each waiting out the breaker timeout and decided
// without the region. With lease.KeepaliveParams its connection is closed
// within KeepaliveTime + KeepaliveTimeout, and a new one is not ready
// while it stays frozen: the region answers every request again, through
// the other replica, until the freeze ends.
func TestAFrozenReplicaLeavesTheRotation(t *testing.T) {
	// Mostly waiting on the keepalive's timers: beside the package's other
	// parallel tests.
	t.Parallel()
	const timeout = 300 * time.Millisecond
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease, on_failure: local}}
tiers: {free: {read: {rate: 10/s, burst: 20}}}
default_tier: free
`)
	region := regiontest.Start(t, cfg, "local")
	healthy := grpctest.FreezableAddr(t, region.Addr)
	freezing := grpctest.FreezableAddr(t, region.Addr)
	c := balancedClient(t, []string{healthy.Addr, freezing.Addr}, timeout, grpc.WithKeepaliveParams(lease.KeepaliveParams()))
	n := 0
	answered := func() bool {
		t.Helper()
		n++
		d, err := c.Allow(context.Background(), quota.Key{Tenant: fmt.Sprintf("k%d", n), Class: "read"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return !d.Degraded && d.Allowed
	}
	// Both replicas answer before the freeze: 8 requests in a row. A
	// starved machine may hold a first acquire past the 300 ms wait, so
	// the requests go on until 8 in a row were answered.
	before := 0
	for inRow, deadline := 0, time.Now().Add(time.Minute); inRow < 8; {
		if time.Now().After(deadline) {
			t.Fatalf("not 8 requests in a row answered by the region before the freeze within a minute (%d in a row at the end)", inRow)
		}
		before++
		if answered() {
			inRow++
		} else {
			inRow = 0
		}
	}

	freezing.Freeze()
	frozeAt := time.Now()
	// Waiting out the keepalive, then 20 requests in a row answered: with
	// the frozen replica in the rotation, every other one went to it.
	deadline := frozeAt.Add(3 * (lease.KeepaliveTime + lease.KeepaliveTimeout))
	missed, inRow := 0, 0
	for inRow < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("%v after the freeze the frozen replica still takes calls: %d of %d requests decided without the region, %d answered in a row at the end",
				time.Since(frozeAt), missed, n-before, inRow)
		}
		if answered() {
			inRow++
		} else {
			missed, inRow = missed+1, 0
		}
	}
	t.Logf("frozen replica out of the rotation after %v (%d requests decided without the region)", time.Since(frozeAt), missed)
	if missed == 0 {
		t.Errorf("no request went to the frozen replica: the freeze was not seen at all")
	}
}
