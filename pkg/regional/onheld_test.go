package regional_test

import (
	"context"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// heldCall is one OnHeld call.
type heldCall struct {
	k           quota.Key
	rate, burst float64
	expiryUS    int64
}

// watchedTier answers every report with a grant of 10/s burst 10 for
// leaseKey, first running atSync with the report.
type watchedTier struct {
	atSync func(r *sluicev1.RegionReport)
}

func (g watchedTier) Sync(_ context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	g.atSync(r)
	return leaseKeyGrant(), nil
}

// TestOnHeldTellsTheStoredGrantBeforeTheReport: the leader tells OnHeld
// each reported key's held grant as Redis stores it, expiry included,
// before the report leaves: the grant it applied itself (the expiry
// OnApplied gave), and a grant whose expiry Redis holds differently (as
// when set_rate ran for a call the leader saw time out), which the
// report's echo alone could not date.
func TestOnHeldTellsTheStoredGrantBeforeTheReport(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
epoch: 1s
grant_validity: 60s
region_lease: 120s
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`)
	ctx := context.Background()
	rs := redistest.Start(t)
	srv, err := regional.New(regional.Options{Region: "eu", Redis: rs.Client(), Config: regional.StaticConfig{C: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	var applied []int64
	var held []heldCall
	var heldAtSync [][]heldCall // what OnHeld had been told when each report arrived
	l, err := regional.NewLeader(srv, regional.LeaderOptions{
		Etcd: etcdtest.Start(t).Client(t), ElectionPrefix: "/sl/election/", Identity: "eu-1",
		Global: watchedTier{atSync: func(r *sluicev1.RegionReport) {
			heldAtSync = append(heldAtSync, held)
			held = nil
		}},
		OnApplied: func(k quota.Key, rate, burst float64, expiryUS int64) { applied = append(applied, expiryUS) },
		OnHeld: func(k quota.Key, rate, burst float64, expiryUS int64) {
			held = append(held, heldCall{k, rate, burst, expiryUS})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Round 1 reads no key (none is a candidate yet) and installs the
	// grant; round 2 reads the key holding it.
	for round := 1; round <= 2; round++ {
		if err := l.SyncOnce(ctx, nil); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	if len(applied) != 2 || len(heldAtSync) != 2 {
		t.Fatalf("%d grants applied, %d reports sent; want 2 of each", len(applied), len(heldAtSync))
	}
	if len(heldAtSync[0]) != 0 {
		t.Fatalf("OnHeld told %v before a report that read no key", heldAtSync[0])
	}
	want := heldCall{leaseKey, 10, 10, applied[0]}
	if got := heldAtSync[1]; len(got) != 1 || got[0] != want {
		t.Fatalf("before the second report OnHeld was told %v, want %v (the grant round 1 applied)", got, want)
	}

	// Redis holds the grant with another expiry than the leader applied.
	keys := luascripts.KeysFor(luascripts.DefaultPrefix, leaseKey)
	storedUS := applied[1] - int64(20*time.Second/time.Microsecond)
	if err := rs.Client().HSet(ctx, keys.Bucket, "ge", storedUS).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.SyncOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	want = heldCall{leaseKey, 10, 10, storedUS}
	if got := heldAtSync[2]; len(got) != 1 || got[0] != want {
		t.Fatalf("before the third report OnHeld was told %v, want %v (the expiry Redis stores)", got, want)
	}
}
