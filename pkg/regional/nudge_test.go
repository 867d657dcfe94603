package regional_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestDonorReportsWhenNudged: region eu's leader runs its real loop against
// a real allocator daemon through allocator.Client, with a long epoch. us
// (driven by hand) wants far more than its static share of a key eu barely
// uses; us's short answer makes the global leader nudge eu, whose leader
// answers with a nudged report between its epochs, acknowledges the grant
// it gets for the key it did not report at once, and us then gets what eu
// gave up.
func TestDonorReportsWhenNudged(t *testing.T) {
	// Mostly waits out epochs of its own allocator: it runs beside the
	// package's other parallel tests.
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := regiontest.MustConfig(t, `
epoch: 1s
grant_validity: 4s
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 10000/s, burst: 10000}}}
default_tier: free
`)
	epoch := time.Duration(cfg.Epoch)
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	// A session of 10 s, as the lease rig's: the allocator stops granting
	// after half of it without a confirmed refresh, which a starved machine
	// reached with a shorter one.
	d, err := allocator.StartDaemon(ctx, allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Etcd: cli, Prefix: "/nd", SessionTTL: 10 * time.Second,
		Config: regional.StaticConfig{C: cfg},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	// The reports below go to the daemon's service directly, which refuses
	// them ("not leader") until the daemon has won its election.
	awaitAllocatorLeader(t, d, 10*time.Second)
	gc, err := allocator.NewClient([]string{d.GRPCAddr()}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gc.Close() })

	rs := redistest.Start(t)
	reg := prometheus.NewRegistry()
	srv, err := regional.New(regional.Options{Region: "eu", Redis: rs.Client(), Config: regional.StaticConfig{C: cfg}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	l, err := regional.NewLeader(srv, regional.LeaderOptions{Etcd: cli, ElectionPrefix: "/nd/election/", Global: gc, Identity: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	// eu serves the key a little, below half its static share: eu does
	// not report it until the allocator grants it the key (a donor
	// grant), after which the key is marked and reported.
	if _, err := srv.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "eu-app", Report: &sluicev1.KeyReport{
		Key: &sluicev1.QuotaKey{Tenant: leaseKey.Tenant, Class: leaseKey.Class}, Seq: 1, Want: 1,
	}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	defer func() { cancel(); <-done }()

	reports := func(kind string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "sluice_regional_global_reports_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "kind" && lp.GetValue() == kind {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	// us reports every tenth of eu's epoch, echoing what it holds, until
	// it holds more than its static share; learning lasts one validity.
	var seq uint64
	var held *sluicev1.KeyGrant
	var heldUntil time.Time
	deadline := time.Now().Add(30 * epoch)
	for held == nil || held.Rate <= 5000 || time.Now().After(heldUntil) {
		if time.Now().After(deadline) {
			t.Fatalf("us never got more than its static share: holds %v; eu sent %v nudged reports", held, reports("nudged"))
		}
		seq++
		kd := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: leaseKey.Tenant, Class: leaseKey.Class},
			Admitted: 20000, WindowMs: epoch.Milliseconds()} // a reading over one epoch
		sent := time.Now()
		if held != nil && sent.Before(heldUntil) {
			kd.HeldRate, kd.HeldBurst, kd.HeldValidMs = held.Rate, held.Burst, heldUntil.Sub(sent).Milliseconds()
		}
		g, err := d.Service.Sync(ctx, &sluicev1.RegionReport{Region: "us", Seq: seq, Keys: []*sluicev1.KeyDemand{kd}})
		if err != nil {
			t.Fatal(err)
		}
		for _, gr := range g.Grants {
			held, heldUntil = gr, sent.Add(time.Duration(gr.ValidMs)*time.Millisecond)
		}
		time.Sleep(epoch / 10) // us's report period
	}
	if n := reports("nudged"); n < 1 {
		t.Fatalf("us got %v/s with eu sending no nudged report", held.Rate)
	}
	// eu's grant of the key it had not reported is below its static share:
	// it acknowledged it at once (regionsync.Install.FromStatic) rather
	// than at its next report.
	if n := reports("ack"); n < 1 {
		t.Fatalf("us got %v/s with eu acknowledging no donor grant at once", held.Rate)
	}
	t.Logf("us holds %.0f/s; eu sent %v epoch, %v nudged, %v ack reports", held.Rate, reports("epoch"), reports("nudged"), reports("ack"))
}
