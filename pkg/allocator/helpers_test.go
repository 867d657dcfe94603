package allocator_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
)

const (
	testEpoch    = 100 * time.Millisecond
	testValidity = 500 * time.Millisecond
	testTTL      = time.Second
)

// twoRegions: one contended key class with r = 100/s, b = 100.
const twoRegions = `
epoch: 100ms
grant_validity: 500ms
regions:
  a: {weight: 1}
  b: {weight: 1}
classes:
  write: {}
tiers:
  free: {write: {rate: 100/s, burst: 100}}
default_tier: free
`

func mustConfig(t testing.TB, yaml string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("parse config: %v", err)
	}
	return c
}

// replica is one daemon with its own path to etcd, which the test can cut.
type replica struct {
	*allocator.Daemon
	link *etcdtest.Link
	api  sluicev1.AllocatorServiceClient
}

func startReplica(t *testing.T, srv *etcdtest.Server, src allocator.ConfigSource, ttl time.Duration) *replica {
	t.Helper()
	link := srv.Link(t)
	cli := link.Client(t)
	logs := &testWriter{t: t}
	d, err := allocator.StartDaemon(context.Background(), allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Etcd: cli, Prefix: "/test",
		SessionTTL: ttl, Config: src, DrainTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	t.Cleanup(func() {
		d.Stop()
		logs.over.Store(true)
	})
	return &replica{Daemon: d, link: link, api: dial(t, d.GRPCAddr())}
}

// startLeaderAndStandby starts a replica, waits for it to lead, then starts
// a second one and waits until it names the first as leader.
func startLeaderAndStandby(t *testing.T, srv *etcdtest.Server, src allocator.ConfigSource, ttl time.Duration) (leader, standby *replica) {
	t.Helper()
	leader = startReplica(t, srv, src, ttl)
	waitFor(t, 10*time.Second, "the first replica leads", leader.IsLeader)
	standby = startReplica(t, srv, src, ttl)
	waitFor(t, 5*time.Second, "the standby names the leader", func() bool { return redirectsTo(t, standby, leader.Advertise(), 1) })
	return leader, standby
}

func dial(t *testing.T, addr string) sluicev1.AllocatorServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return sluicev1.NewAllocatorServiceClient(conn)
}

// testWriter sends daemon logs to the test log (shown on failure or -v)
// until the daemon stopped.
type testWriter struct {
	t    *testing.T
	over atomic.Bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	if !w.over.Load() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	return time.Since(start)
}

func rpcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func qk(tenant, class string) *sluicev1.QuotaKey {
	return &sluicev1.QuotaKey{Tenant: tenant, Class: class}
}

func report(region string, seq uint64, keys ...*sluicev1.KeyDemand) *sluicev1.RegionReport {
	return &sluicev1.RegionReport{Region: region, Seq: seq, Keys: keys}
}

func demand(tenant string, admitted int64) *sluicev1.KeyDemand {
	return &sluicev1.KeyDemand{Key: qk(tenant, "write"), Admitted: admitted, WindowMs: testEpoch.Milliseconds()}
}

func scrape(t *testing.T, d *allocator.Daemon) string {
	t.Helper()
	return metrictest.Scrape(t, "http://"+d.HTTPAddr()+"/metrics")
}
