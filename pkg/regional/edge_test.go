package regional_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/regional"
)

const edgeConfig = `
lease_ttl: 2s
refresh: 500ms
regions: {local: {weight: 1}}
classes:
  read: {mode: lease}
tiers:
  free: {read: {rate: 1000/s, burst: 1000}}
default_tier: free
envoy:
  descriptors:
    - {domain: sluice, tenant_key: tenant, class: read}
`

// edgeDaemon runs a regional daemon serving the LeaseService and the Envoy
// endpoint (deciding through a loopback lease client, as cmd/regional
// does) against a real Redis.
func edgeDaemon(t *testing.T, rs *redistest.Server, cfg *config.Config) (*regional.Daemon, *grpc.ClientConn) {
	t.Helper()
	src := regional.StaticConfig{C: cfg}
	envoy, err := envoyrls.New(envoyrls.Options{Config: src})
	if err != nil {
		t.Fatal(err)
	}
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RedisAddr: rs.Addr(),
		Config: src, ColdStart: regional.ColdStartFull, Unleased: true,
		Envoy: envoy,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	loop, err := envoyrls.DialLoopback(d.GRPCAddr(), insecure.NewCredentials(), lease.Options{InstanceID: lease.UniqueID("envoy")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Close(context.Background()) })
	envoy.SetLimiter(loop)
	conn := regiontest.Dial(t, d.GRPCAddr())
	return d, conn
}

// floodKeys counts the Redis keys naming a flood- tenant.
func floodKeys(t *testing.T, rs *redistest.Server) int {
	t.Helper()
	c := rs.Client()
	defer c.Close()
	keys, err := c.Keys(context.Background(), "*flood-*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

func scrape(t *testing.T, d *regional.Daemon) string {
	t.Helper()
	return metrictest.Scrape(t, "http://"+d.HTTPAddr()+"/metrics")
}

// TestOversizedRequestsAreRefusedBeforeRedis: an Envoy request with 10,000
// descriptors and a Sync with 10,000 reports are refused with
// InvalidArgument naming their bound, create no Redis key, and are counted.
func TestOversizedRequestsAreRefusedBeforeRedis(t *testing.T) {
	rs := redistest.Start(t)
	d, conn := edgeDaemon(t, rs, regiontest.MustConfig(t, edgeConfig))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	req := &rlsv3.RateLimitRequest{Domain: "sluice"}
	for i := range 10000 {
		req.Descriptors = append(req.Descriptors, &corev3.RateLimitDescriptor{
			Entries: []*corev3.RateLimitDescriptor_Entry{{Key: "tenant", Value: fmt.Sprintf("flood-%d", i)}}})
	}
	start := time.Now()
	_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	t.Logf("10,000 descriptors refused after %v", time.Since(start))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptors_per_request=64") {
		t.Errorf("10,000 descriptors: got %v, want InvalidArgument naming descriptors_per_request=64", err)
	}

	sync := &sluicev1.SyncRequest{InstanceId: "flood"}
	for i := range 10000 {
		sync.Reports = append(sync.Reports, &sluicev1.KeyReport{Key: qk(fmt.Sprintf("flood-%d", i), "read"), Seq: 1, Want: 1})
	}
	start = time.Now()
	_, err = sluicev1.NewLeaseServiceClient(conn).Sync(ctx, sync)
	t.Logf("10,000 reports refused after %v", time.Since(start))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "reports_per_sync=1000") {
		t.Errorf("10,000 reports: got %v, want InvalidArgument naming reports_per_sync=1000", err)
	}
	if n := floodKeys(t, rs); n != 0 {
		t.Errorf("refused requests created %d Redis keys", n)
	}
	m := scrape(t, d)
	for _, want := range []string{
		`sluice_rpc_refused_total{bound="descriptors_per_request",method="/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"} 1`,
		`sluice_rpc_refused_total{bound="reports_per_sync",method="/sluice.v1.LeaseService/Sync"} 1`,
		`sluice_rpc_bound{bound="reports_per_sync"} 1000`,
		`sluice_rpc_bound{bound="inflight_per_connection"} 2048`,
		`sluice_rpc_bound{bound="entries_per_descriptor"} 32`,
		`sluice_rpc_bound{bound="message_bytes"} 1.048576e+06`,
		`sluice_rpc_bound{bound="streams_per_connection"} 1024`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// At the bound, both are served.
	req.Descriptors = req.Descriptors[:envoyrls.MaxDescriptors]
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req); err != nil {
		t.Errorf("%d descriptors: %v", envoyrls.MaxDescriptors, err)
	}
	sync.Reports = sync.Reports[:regional.MaxReportsPerCall]
	if _, err := sluicev1.NewLeaseServiceClient(conn).Sync(ctx, sync); err != nil {
		t.Errorf("%d reports: %v", regional.MaxReportsPerCall, err)
	}
}

// TestFloodedRegionStaysResponsive: while one client floods the region
// with as many concurrent full-size Syncs as it can, a well-behaved
// instance on its own connection still renews its lease N times within one
// lease TTL (the time after which its lease, and its share of the key,
// would lapse).
func TestFloodedRegionStaysResponsive(t *testing.T) {
	rs := redistest.Start(t)
	// An instance renews every refresh; its lease lapses one lease TTL
	// after its last renewal.
	cfg := regiontest.MustConfig(t, strings.Replace(edgeConfig, "lease_ttl: 2s\nrefresh: 500ms", "lease_ttl: 10s\nrefresh: 1s", 1))
	d, good := edgeDaemon(t, rs, cfg)
	flood := regiontest.Dial(t, d.GRPCAddr())

	// The instance is connected before the flood starts, as running
	// instances are.
	c := sluicev1.NewLeaseServiceClient(good)
	if _, err := c.Acquire(context.Background(), &sluicev1.AcquireRequest{InstanceId: "good",
		Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Want: 1}}); err != nil {
		t.Fatal(err)
	}
	fctx, stopFlood := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var served atomic.Int64
	const flooders = 32
	baseline := redistest.KeyCount(t, rs.Addr())
	for g := range flooders {
		wg.Go(func() {
			c := sluicev1.NewLeaseServiceClient(flood)
			req := &sluicev1.SyncRequest{}
			for i := range regional.MaxReportsPerCall {
				req.Reports = append(req.Reports, &sluicev1.KeyReport{Key: qk(fmt.Sprintf("flood-%d", i), "read"), Seq: 1, Want: 1})
			}
			for round := 0; fctx.Err() == nil; round++ {
				req.InstanceId = fmt.Sprintf("flood-%d-%d", g, round) // every call new leases
				if _, err := c.Sync(fctx, req); err == nil {
					served.Add(1)
				}
			}
		})
	}
	defer func() { stopFlood(); wg.Wait() }()
	// Redis is busy with the flood once its keys appear.
	for deadline := time.Now().Add(30 * time.Second); redistest.KeyCount(t, rs.Addr()) < baseline+regional.MaxReportsPerCall; {
		if time.Now().After(deadline) {
			t.Fatal("the flood never reached Redis")
		}
		time.Sleep(10 * time.Millisecond) // polling Redis with a deadline
	}

	// The renewals due within one lease TTL, all within it. A renewal
	// Redis did not answer within the server's bound (Unavailable: a
	// starved machine queued the flood's scripts ahead of it) is sent
	// again, as an instance does; what must not happen is the lease
	// lapsing, all n not done within the TTL.
	ttl := time.Duration(cfg.LeaseTTL)
	n := int(ttl / time.Duration(cfg.Refresh))
	before := served.Load()
	ctx, cancel := context.WithTimeout(context.Background(), ttl)
	defer cancel()
	start := time.Now()
	retried := 0
	for i := 0; i < n; {
		_, err := c.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "good",
			Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: uint64(i + 2), Want: 1}})
		switch {
		case err == nil:
			i++
		case status.Code(err) == codes.Unavailable && ctx.Err() == nil:
			retried++
		default:
			t.Fatalf("renewal %d of %d within one lease TTL (%v) while flooded (%d sent again): %v", i+1, n, ttl, retried, err)
		}
	}
	t.Logf("%d renewals took %v (%d sent again); the flood had %d full Syncs served meanwhile", n, time.Since(start), retried, served.Load()-before)
}
