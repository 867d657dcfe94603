package regional_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestRegionRemovedFromTheConfigIsAFailedPrecondition: a replica whose live
// config no longer lists its region (an operator removed it while it ran)
// answers every request FailedPrecondition, naming the region, and writes
// nothing to Redis; the instances decide with their on_failure policy, as
// for any region that cannot decide. (It answered InvalidArgument, which
// blamed the request: the lease client forgot the key and failed the call,
// and the agent answered 400.)
func TestRegionRemovedFromTheConfigIsAFailedPrecondition(t *testing.T) {
	const twoRegions = `
lease_ttl: 1s
refresh: 200ms
regions: {local: {weight: 1}, far: {weight: 1}}
classes:
  read:   {mode: lease, on_failure: closed}
  export: {mode: strict, on_failure: closed}
tiers:
  free: {read: {rate: 10/s, burst: 100}, export: {rate: 10/s, burst: 20}}
default_tier: free
`
	with := regiontest.MustConfig(t, twoRegions)
	without := regiontest.MustConfig(t, strings.Replace(twoRegions, "local: {weight: 1}, ", "", 1))
	var src regiontest.SwappedConfig
	src.Store(with)
	reg := regiontest.Start(t, with, "local", func(o *regional.Options) { o.Config = &src })
	src.Store(without)

	rpc := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	report := &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Lease: 1, Want: 5}
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Acquire", func() error {
			_, err := rpc.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i1", Incarnation: 1, Report: report})
			return err
		}},
		{"Sync", func() error {
			_, err := rpc.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "i1", Incarnation: 1, Reports: []*sluicev1.KeyReport{report}})
			return err
		}},
		{"Release", func() error {
			_, err := rpc.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: "i1", Incarnation: 1, Reports: []*sluicev1.KeyReport{report}})
			return err
		}},
		{"Check", func() error {
			_, err := rpc.Check(ctx, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: 1})
			return err
		}},
	} {
		err := c.call()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), `region "local" is not in the live config`) {
			t.Errorf("%s in a region removed from the config: %v, want FailedPrecondition naming the region", c.name, err)
		}
	}
	if n, err := reg.RDB.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("Redis holds %d keys (%v) after requests a removed region refused, want none", n, err)
	}

	client, err := lease.NewClient(reg.Dial(t), lease.Options{InstanceID: "i2"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close(ctx)
	d, err := client.Allow(ctx, quota.Key{Tenant: "acme", Class: "read"}, 1)
	if err != nil || !d.Degraded {
		t.Fatalf("Allow in a removed region: %+v, %v; want a decision by the on_failure policy", d, err)
	}
}

// TestRegionRemovedFromTheConfigIsNotReady: a replica whose region the
// live config no longer lists refuses every request, so it is not ready
// (gRPC health NOT_SERVING, which /healthz follows), said once at WARN,
// and ready again once a config lists the region. It stayed SERVING while
// it refused everything: a Service kept routing to it and nothing told
// the operator.
func TestRegionRemovedFromTheConfigIsNotReady(t *testing.T) {
	// Mostly waiting on readiness intervals: beside the package's other
	// parallel tests.
	t.Parallel()
	const twoRegions = `
regions: {local: {weight: 1}, far: {weight: 1}}
classes: {read: {mode: lease, on_failure: closed}}
tiers: {free: {read: {rate: 10/s, burst: 100}}}
default_tier: free
`
	with := regiontest.MustConfig(t, twoRegions)
	without := regiontest.MustConfig(t, strings.Replace(twoRegions, "local: {weight: 1}, ", "", 1))
	var src regiontest.SwappedConfig
	src.Store(with)
	rs := redistest.Start(t)
	var logs logtest.Buffer
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RedisAddr: rs.Addr(),
		Config: &src, Unleased: true, Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	r := readiness{t: t, d: d, wait: 60 * regional.ReadinessInterval, logs: &logs}
	serving, waitFor := r.serving, r.waitFor
	waitFor("ready", serving)
	src.Store(without)
	waitFor("not ready", func() bool { return !serving() })
	const removed, back = "region not in the live config; replica not ready", "region in the live config again"
	waitFor("the removal logged", func() bool { return logs.Count(removed) == 1 })
	src.Store(with)
	waitFor("ready again", serving)
	waitFor("the return logged", func() bool { return logs.Count(back) == 1 })
	if n := logs.Count(removed); n != 1 {
		t.Errorf("one removal logged %q %d times, want once", removed, n)
	}
}
