package allocator_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/pkg/allocator"
)

// TestRegionReachesAReplicaSoonAfterALongOutage: after a global replica
// was gone for many connection attempts, a region's client reaches it
// within a few capped reconnect delays (allocator.MaxReconnectDelay) of it
// coming back on the same address. With gRPC's default backoff (growing
// to 120 s) the attempt after the sixth failed one comes at least
// 0.8 × 1.6^6 s ≈ 13 s later: regions of a replica back after a few
// minutes could not report to it for up to two minutes while it led, and
// their static leases lapsed to their floors.
//
// The outage is counted in attempts, not waited out: until the replica
// comes back its address accepts each connection and closes it at once.
func TestRegionReachesAReplicaSoonAfterALongOutage(t *testing.T) {
	gone := grpctest.ClosingAddr(t)
	addr := gone.Addr

	c, err := allocator.NewClient([]string{addr}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	if _, err := c.Sync(ctx, report("a", 1, demand("acme", 10))); err == nil {
		t.Fatal("a Sync to a gone replica succeeded")
	}
	cancel()
	// Six failed attempts: ~6 s with the capped backoff; gRPC's default
	// would take ~26 s. The deadline only guards a hang.
	const n = 6
	for i := range n {
		select {
		case <-gone.Attempts:
		case <-time.After(5 * time.Minute):
			t.Fatalf("only %d connection attempts to the gone replica within 5m", i)
		}
	}

	// The replica comes back on the same address and leads.
	gone.Stop()
	srv := etcdtest.Start(t)
	d, err := allocator.StartDaemon(context.Background(), allocator.DaemonOptions{
		GRPCAddr: addr, HTTPAddr: "off", Etcd: srv.Client(t), Prefix: "/test",
		SessionTTL: time.Second, Config: allocator.StaticConfig{C: mustConfig(t, twoRegions)},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("start the replica again on %s: %v", addr, err)
	}
	defer d.Stop()
	waitFor(t, time.Minute, "the replica to lead", d.IsLeader)
	start := time.Now()

	// The next attempt comes within MaxReconnectDelay (plus its 20%
	// jitter); the rest is headroom for a loaded machine.
	bound := 5 * allocator.MaxReconnectDelay
	for seq := uint64(2); ; seq++ {
		ctx, cancel := context.WithTimeout(t.Context(), allocator.MaxReconnectDelay/4)
		_, err := c.Sync(ctx, report("a", seq, demand("acme", 10)))
		cancel()
		if err == nil {
			break
		}
		if time.Since(start) > bound {
			t.Fatalf("Sync still failing %v after the replica led again (%v), want an answer within %v", time.Since(start), err, bound)
		}
	}
	t.Logf("reached the replica %v after it led again", time.Since(start))
}

// TestRegionReachesAReplicaSoonAfterAPartitionHeals: a region's client
// whose connection attempt, made during a partition, was accepted and
// never answered (a gateway or proxy whose upstream was cut off holds it)
// reaches the replica within allocator.ConnectTimeout and a reconnect
// delay of the path coming back. With gRPC's default connect timeout the
// held attempt kept the region from reporting for 20 s after it began:
// measured live, a 6 s cut longer than region_lease kept the region on its
// floor 15 s after the path was back.
func TestRegionReachesAReplicaSoonAfterAPartitionHeals(t *testing.T) {
	srv := etcdtest.Start(t)
	d, err := allocator.StartDaemon(context.Background(), allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", Etcd: srv.Client(t), Prefix: "/test",
		SessionTTL: time.Second, Config: allocator.StaticConfig{C: mustConfig(t, twoRegions)},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	waitFor(t, time.Minute, "the replica to lead", d.IsLeader)

	path := grpctest.CuttableAddr(t, d.GRPCAddr())
	c, err := allocator.NewClient([]string{path.Addr}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	trySync := func(seq uint64) error {
		ctx, cancel := context.WithTimeout(t.Context(), allocator.MaxReconnectDelay/4)
		defer cancel()
		_, err := c.Sync(ctx, report("a", seq, demand("acme", 10)))
		return err
	}
	if err := trySync(1); err != nil {
		t.Fatalf("Sync over the open path: %v", err)
	}

	// The path is cut: the connection is reset, and the client's next
	// attempt is accepted and held unanswered.
	path.Cut()
	seq := uint64(2)
	for ; ; seq++ {
		if err := trySync(seq); err == nil {
			t.Fatal("a Sync over the cut path succeeded")
		}
		if path.Holding() {
			break
		}
		if seq > 1000 {
			t.Fatal("no connection attempt reached the cut path")
		}
	}

	// The path comes back; the held attempt stays held.
	path.Heal()
	start := time.Now()
	// 5 s: the connect timeout the docs promise (allocator.ConnectTimeout),
	// written out so that the bound does not follow the constant.
	bound := 5*time.Second + 3*allocator.MaxReconnectDelay
	for ; ; seq++ {
		err := trySync(seq)
		if err == nil {
			break
		}
		if time.Since(start) > bound {
			t.Fatalf("Sync still failing %v after the path came back (%v), want an answer within %v", time.Since(start), err, bound)
		}
	}
	t.Logf("reached the replica %v after the path came back", time.Since(start))
}
