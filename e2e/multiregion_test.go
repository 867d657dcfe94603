package e2e

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

const threeRegions = `
epoch: 200ms
grant_validity: 1s
lease_ttl: 1s
refresh: 100ms
regions:
  us-east:  {weight: 2}
  eu-west:  {weight: 1}
  ap-south: {weight: 1}
classes:
  read: {mode: lease, on_failure: local}
tiers:
  free: {read: {rate: 10/s, burst: 10}}
  pro:  {read: {rate: 400/s, burst: 200}}
tenants:
  acme: {tier: pro}
default_tier: free
`

const epoch = 200 * time.Millisecond

// waitLeader polls the global replicas until one leads and has left
// learning mode.
func waitLeader(t *testing.T, c *devcluster.Cluster, within time.Duration) (leader string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, addr := range c.GlobalAddrs() {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			st, err := sluicev1.NewAllocatorServiceClient(conn).Status(ctx, &sluicev1.StatusRequest{})
			cancel()
			conn.Close()
			if err == nil && st.Leader && !st.Learning {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no global leader out of learning mode within %v", within)
		}
		time.Sleep(20 * time.Millisecond) // polling leadership with a deadline
	}
}

// waitGrant polls region's bucket until it refills at >= want tokens/s,
// and returns how long that took.
func waitGrant(t *testing.T, c *devcluster.Cluster, region string, key quota.Key, want float64, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		st := regionRate(t, c, region, key)
		if st.Rate >= want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			dumpStatus(t, c)
			t.Fatalf("%s: rate %.1f after %v, want >= %.1f", region, st.Rate, within, want)
		}
		time.Sleep(10 * time.Millisecond) // polling Redis state with a deadline
	}
}

// TestDemandShiftsBetweenRegions: a tenant's saturating demand moves from
// us-east to eu-west. Globally admitted never exceeds b + r·t; while demand
// saturates one region, the fleet admits >= 95% of r; the demanding
// region's grant reaches its weighted max-min share (all of r) soon after
// each shift.
func TestDemandShiftsBetweenRegions(t *testing.T) {
	c := startCluster(t, devcluster.Options{Config: mustConfig(t, threeRegions), GlobalReplicas: 2, SessionTTL: time.Second})

	key := quota.Key{Tenant: "acme", Class: "read"}
	const r, b = 400.0, 200.0
	start := time.Now()
	l := startLoad(t, c, key, 100*time.Millisecond, 3)
	conf := watchConformance(t, l, r, b, start, 50*time.Millisecond)

	for _, region := range []string{"us-east", "eu-west"} {
		l.set(region)
		seen, seenEpoch := waitDemandSeen(t, c, region, key, r, 20*epoch)
		took := waitGrant(t, c, region, key, 0.95*r, 20*epoch)
		epochs := allocatorEpoch(t, c) - seenEpoch
		t.Logf("%s: the global tier saw the demand %v after the shift; the grant reached 95%% of r %d allocator epochs (%v) later",
			region, seen, epochs, took)
		// The shift reaches the allocator about an epoch late (instance
		// refresh, then the region leader's epoch); from there, moving the
		// capacity takes the donors' next reports (answered from their new
		// demand, each acknowledged at once by an extra report) and the
		// recipient's next report, early when it was told a raise is
		// pending: up to 2 epochs. Counted in the allocator's own
		// epochs, so a loaded machine that delays every loop alike does not
		// fail the test; three more for region tickers drifting against the
		// allocator's under load.
		if epochs > 5 {
			t.Errorf("%s: grant took %d allocator epochs after the allocator saw the shift, want <= 2 (+3 for tick drift under load)", region, epochs)
		}
		// Steady state: measure admitted over a window.
		before, t0 := l.total.Load(), time.Now()
		<-time.After(1500 * time.Millisecond)
		rate := float64(l.total.Load()-before) / time.Since(t0).Seconds()
		t.Logf("%s: admitted %.1f/s in steady state (%.1f%% of r)", region, rate, 100*rate/r)
		if rate < 0.95*r {
			t.Errorf("%s: admitted %.1f/s, want >= 95%% of %v", region, rate, r)
		}
	}
	l.halt()
	conf.finish()
	t.Logf("conformance: %d checkpoints, worst margin %d tokens (negative = under the bound)", conf.samples.Load(), conf.worst.Load())
	reports := map[string]float64{}
	for _, kind := range []string{"epoch", "ack", "catch_up"} {
		for _, reg := range c.Regions {
			for _, rep := range reg.Replicas {
				reports[kind] += counterWithLabel(t, rep.Daemon(), "sluice_regional_global_reports_total", "kind", kind)
			}
		}
	}
	t.Logf("region reports to the global tier: %v", reports)
	// Each shift moved capacity to a region whose raise waited on the
	// donors' acknowledgements: it was told to report again early.
	if reports["catch_up"] == 0 || reports["ack"] == 0 {
		t.Errorf("reports %v: want acknowledgements and catch-up reports while capacity moved", reports)
	}
}

// counterWithLabel sums the counter name's series with label=value in d's
// registry.
func counterWithLabel(t *testing.T, d *regional.Daemon, name, label, value string) float64 {
	t.Helper()
	fams, err := d.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func dumpStatus(t *testing.T, c *devcluster.Cluster) {
	for _, addr := range c.GlobalAddrs() {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			continue
		}
		st, err := sluicev1.NewAllocatorServiceClient(conn).Status(context.Background(), &sluicev1.StatusRequest{TopKeys: 5})
		conn.Close()
		t.Logf("global %s: %v %v", addr, st, err)
	}
}

// leaderStatus is the global leader's Status, or nil when no replica
// answers as leader.
func leaderStatus(t *testing.T, c *devcluster.Cluster) *sluicev1.StatusResponse {
	t.Helper()
	for _, addr := range c.GlobalAddrs() {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		st, err := sluicev1.NewAllocatorServiceClient(conn).Status(context.Background(), &sluicev1.StatusRequest{TopKeys: 10})
		conn.Close()
		if err == nil && st.Leader {
			return st
		}
	}
	return nil
}

// allocatorEpoch is the global leader's allocation epoch counter.
func allocatorEpoch(t *testing.T, c *devcluster.Cluster) uint64 {
	t.Helper()
	st := leaderStatus(t, c)
	if st == nil {
		t.Fatal("no global leader")
	}
	return st.Epoch
}

// waitDemandSeen polls the global leader's Status until region's demand
// for key exceeds its static share (the shift is visible to the
// allocator) and returns how long that took and the allocator's epoch.
func waitDemandSeen(t *testing.T, c *devcluster.Cluster, region string, key quota.Key, r float64, within time.Duration) (time.Duration, uint64) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if st := leaderStatus(t, c); st != nil {
			for _, ks := range st.Keys {
				if ks.Key.Tenant != key.Tenant || ks.Key.Class != key.Class {
					continue
				}
				for _, rs := range ks.Regions {
					if rs.Region == region && rs.Demand > rs.StaticRate {
						return time.Since(start), st.Epoch
					}
				}
			}
		}
		time.Sleep(5 * time.Millisecond) // polling the allocator with a deadline
	}
	t.Fatalf("%s: the global tier never saw the demand", region)
	return 0, 0
}
