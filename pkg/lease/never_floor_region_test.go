package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// floorRegions: two regions with a global tier and short periods, so a
// region cut off from the global tier runs on its floor a few seconds
// later. Both classes keep partition_share 0 (the default for local and
// closed): on its floor, or drained, a region's rate and cap for every key
// are 0. The rate is well above the requests' so that a denial comes only
// from the floor.
const floorRegions = `
epoch: 200ms
grant_validity: 1s
region_lease: 2s
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}, far: {weight: 1}}
classes:
  read:   {mode: lease}
  export: {mode: strict, on_failure: closed}
tiers: {free: {read: {rate: 100/s, burst: 100}, export: {rate: 100/s, burst: 100}}}
default_tier: free
`

// cutTier fails every report of a region to the global tier while cut is
// set: a partition between the region and the global tier.
type cutTier struct {
	next regional.GlobalTier
	cut  *atomic.Bool
}

func (c cutTier) Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	if c.cut.Load() {
		return nil, errors.New("partitioned from the global tier")
	}
	return c.next.Sync(ctx, r)
}

// TestRegionOnItsFloorAnswersAWait: a region's rate for a key is 0 while
// it runs on its floor (partition_share 0) because its static lease lapsed
// (cut off from the global tier for longer than region_lease), and while
// it is drained. Neither is a limit of the key: the global tier confers
// the lease again once the region reaches it, and a restore gives the
// drained region its share back, with no change to the key's limits. So
// the region's "never" is a denial with a wait until the client asks again
// (at most a refresh), on the lease and the strict path, not RetryNever;
// and the same requests are admitted once the region is back. (Real
// daemons: embedded etcd, the global allocator, two regions on real
// redis-servers.)
func TestRegionOnItsFloorAnswersAWait(t *testing.T) {
	cfg := regiontest.MustConfig(t, floorRegions)
	epoch, validity, regionLease := time.Duration(cfg.Epoch), time.Duration(cfg.GrantValidity), time.Duration(cfg.RegionLease)
	var cut atomic.Bool
	c, err := devcluster.Start(context.Background(), devcluster.Options{
		Config: cfg,
		WrapGlobal: func(region string, next regional.GlobalTier) regional.GlobalTier {
			if region != "local" {
				return next
			}
			return cutTier{next: next, cut: &cut}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	client, err := lease.NewClient(regiontest.Dial(t, c.Regions["local"].Replicas[0].Addr()), lease.Options{
		InstanceID: "it-floor", Refresh: 200 * time.Millisecond,
		// Generous: the machine is shared, and no decision here is meant
		// to be degraded.
		BreakerTimeout: 5 * time.Second, SyncTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(context.Background()) })
	refresh := client.Table().Options().Refresh
	keys := []quota.Key{{Tenant: "acme", Class: "read"}, {Tenant: "acme", Class: "export"}}

	// until polls every key at a quarter epoch (20 requests a second, a
	// fifth of the rate) until done holds for each, failing on a
	// RetryNever or a degraded decision.
	until := func(what string, within time.Duration, done func(quota.Decision) bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		left := map[quota.Key]bool{keys[0]: true, keys[1]: true}
		for len(left) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v for %v", what, within, left)
			}
			for k := range left {
				d := mustAllow(t, client, k, 1)
				switch {
				case d.Degraded:
					t.Fatalf("%s, %s: %+v, degraded (the region answers)", what, k, d)
				case d.RetryNever:
					t.Fatalf("%s, %s: %+v, RetryNever for one token of a key of burst 100 at 100/s", what, k, d)
				case done(d):
					delete(left, k)
				}
			}
			time.Sleep(epoch / 4)
		}
	}
	// onFloor: denied at the region's rate of 0, with a wait of at most a
	// refresh.
	onFloor := func(what string) func(quota.Decision) bool {
		return func(d quota.Decision) bool {
			if d.Allowed || d.Refill != 0 {
				return false
			}
			if d.RetryAfter <= 0 || d.RetryAfter > refresh {
				t.Fatalf("%s: %+v; want a RetryAfter of at most the refresh %v", what, d, refresh)
			}
			return true
		}
	}
	admitted := func(d quota.Decision) bool { return d.Allowed }

	// The region's first round confers its static lease: an epoch or two,
	// given many here for a starved machine.
	settle := 20*epoch + 2*validity
	until("the region leased", settle, admitted)

	cut.Store(true)
	// The region's lease ends region_lease after its last answered report
	// was sent, its grants a validity after it.
	until("cut off from the global tier, on its floor", regionLease+settle, onFloor("on its floor"))
	cut.Store(false)
	// Its next round is answered and confers the lease again.
	until("the global tier reached again", settle, admitted)

	_, rev, err := c.Store.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	drained := regiontest.MustConfig(t, strings.Replace(floorRegions, "local: {weight: 1}", "local: {weight: 1, drained: true}", 1))
	if rev, err = c.Store.Apply(context.Background(), drained, rev); err != nil {
		t.Fatal(err)
	}
	// The region adopts the drain within an epoch or two; its grants end a
	// validity later.
	until("drained", settle, onFloor("drained"))
	if _, err = c.Store.Apply(context.Background(), cfg, rev); err != nil {
		t.Fatal(err)
	}
	// The restore raises the static share once both regions adopted it.
	until("restored", settle, admitted)
}
