package lease_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestAnInstanceReachesTheRegionSoonAfterAPartitionHeals: an instance
// whose connection attempt, made while its path to the region was cut,
// was accepted and never answered (a gateway or load balancer whose
// upstream was unreachable holds it) is answered by the region again
// within lease.ConnectTimeout, a reconnect delay and a breaker cooldown of
// the path coming back. With gRPC's default connect timeout the held
// attempt kept every request of the instance on its on_failure policy for
// 20 s after the attempt began.
func TestAnInstanceReachesTheRegionSoonAfterAPartitionHeals(t *testing.T) {
	// Mostly waiting on connection attempts: beside the package's other
	// parallel tests.
	t.Parallel()
	const timeout = 200 * time.Millisecond
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease, on_failure: local}}
tiers: {free: {read: {rate: 1000/s, burst: 1000}}}
default_tier: free
`)
	region := regiontest.Start(t, cfg, "local")
	path := grpctest.CuttableAddr(t, region.Addr)
	c := balancedClient(t, []string{path.Addr}, timeout, grpc.WithConnectParams(lease.ConnectParams()))
	key := quota.Key{Tenant: "acme", Class: "read"}
	// Polled every 10 ms: a request decided by its policy takes no time.
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	answered := func() bool {
		t.Helper()
		<-poll.C
		d, err := c.Allow(context.Background(), key, 1)
		if err != nil {
			t.Fatal(err)
		}
		return !d.Degraded
	}
	if !answered() {
		t.Fatal("the region did not answer over the open path")
	}

	// The path is cut: the connection closes, and the client's next
	// attempt is accepted and held unanswered. Requests go on (each
	// decided by the local policy, or from what the instance holds).
	path.Cut()
	for !path.Holding() {
		answered()
	}

	// The path comes back; the held attempt stays held.
	path.Heal()
	start := time.Now()
	// 5 s: the connect timeout the docs promise (lease.ConnectTimeout),
	// written out so that the bound does not follow the constant.
	bound := 5*time.Second + 2*lease.MaxReconnectDelay + 2*lease.DefaultBreakerCooldown
	for !answered() {
		if time.Since(start) > bound {
			t.Fatalf("requests still decided without the region %v after the path came back, want the region within %v", time.Since(start), bound)
		}
	}
	t.Logf("answered by the region %v after the path came back", time.Since(start))
}
