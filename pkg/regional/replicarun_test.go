package regional_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestReplicaRunReadsTheStaticLease: a replica enforcing static leases
// (not Unleased) starts on its floor and, once its Run has read the static
// lease its leader stored, runs on its static share.
func TestReplicaRunReadsTheStaticLease(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A lease far longer than the replica's reads (every quarter epoch),
	// so it is still valid when a starved machine gets to them.
	cfg := regiontest.MustConfig(t, `
epoch: 1s
grant_validity: 5s
region_lease: 30s
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease, partition_share: 0.5}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`)
	r := newLeaseRigWith(t, cfg)
	if until, _ := r.syncStored(ctx, r.leader); until == 0 {
		t.Fatal("the leader stored no static lease")
	}
	srv, _ := r.replica("eu-2")
	if got := r.static(srv); !near(got, floorRate) {
		t.Fatalf("a replica that read no lease yet runs at %v/s, want its floor %v/s", got, floorRate)
	}
	epoch := time.Duration(cfg.Epoch)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, epoch) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	wait := time.Duration(cfg.RegionLease) / 2
	for deadline := time.Now().Add(wait); !near(r.static(srv), staticRate); {
		if time.Now().After(deadline) {
			t.Fatalf("the replica's Run never read the stored lease in %v: it runs at %v/s, want %v/s", wait, r.static(srv), staticRate)
		}
		time.Sleep(epoch / 20) // polling the replica's view with a deadline
	}
}

// TestRunChecksTheRestartGuardEveryInterval: a replica's Run checks its
// restart guard every interval: the first check stamps the data set's
// birth, and a later one notices the data set lost.
func TestRunChecksTheRestartGuardEveryInterval(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartConservative, slog.New(slog.DiscardHandler))
	r := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local", func(o *regional.Options) { o.Guard = g })
	const interval = 20 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- r.Server.Run(ctx, interval) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	born := luascripts.DefaultPrefix + "born"
	// Polled with a deadline of many intervals: a starved machine ticks late.
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(500 * interval); !ok(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v of Run", what, 500*interval)
			}
			time.Sleep(interval / 2)
		}
	}
	waitFor("the first check stamps the birth", func() bool { return r.RDB.Exists(ctx, born).Val() == 1 })
	if err := r.RDB.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor("a check notices the data set lost", func() bool { return g.Restarts() == 1 })
}
