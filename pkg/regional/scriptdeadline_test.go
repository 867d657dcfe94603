package regional_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestScriptsOnTheStaticShareRunByTheLeaseEndAndOnTheFloorWhenever: a
// key's scripts handed the static share carry the stored static lease's
// end as their deadline; once the lease ends within the margin (an epoch)
// they are handed the floor, and carry no deadline, though the lease has
// not ended yet.
func TestScriptsOnTheStaticShareRunByTheLeaseEndAndOnTheFloorWhenever(t *testing.T) {
	// Long epochs: the test's steps take a small part of one.
	cfg := regiontest.MustConfig(t, `
epoch: 10s
grant_validity: 50s
region_lease: 600s
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease, partition_share: 0.5}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`)
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	srv, err := regional.New(regional.Options{Region: "eu", Redis: rdb, Config: regional.StaticConfig{C: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	epoch := time.Duration(cfg.Epoch)
	for _, tc := range []struct {
		name   string
		left   time.Duration // of the lease when stored
		static bool
	}{
		// Shortest first: the replica never shortens a lease it read.
		{"half an epoch left", epoch / 2, false},
		{"ten epochs left", 10 * epoch, true},
	} {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		until := now.Add(tc.left).UnixMicro()
		if err := rdb.Set(ctx, staticKey, until, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := regional.RefreshStaticForTest(ctx, srv); err != nil {
			t.Fatal(err)
		}
		_, c, _, err := srv.CommonFor(cfg, leaseKey)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case tc.static && (!near(c.StaticRate, staticRate) || c.DeadlineUS != until):
			t.Errorf("%s: static rate %v, deadline %d; want %v by the lease's end %d", tc.name, c.StaticRate, c.DeadlineUS, staticRate, until)
		case !tc.static && (!near(c.StaticRate, floorRate) || c.DeadlineUS != 0):
			t.Errorf("%s: static rate %v, deadline %d; want the floor %v and none", tc.name, c.StaticRate, c.DeadlineUS, floorRate)
		}
	}
}
