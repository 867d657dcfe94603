package regional_test

import (
	"context"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestLeaderSeesItsOneWatchedKeyRise: between epochs the leader reads the
// keys its last report watched and reports at once when one asks for
// materially more than it holds and than was reported. Here the report
// watches a single key (its demand is above half eu's static share): at
// the demand reported it has not risen; at ten times that it has.
func TestLeaderSeesItsOneWatchedKeyRise(t *testing.T) {
	ctx := context.Background()
	// A long epoch: the read between epochs is bounded by a nudge spacing
	// (an eighth of it), which a starved machine must fit in.
	cfg := regiontest.MustConfig(t, `
epoch: 2s
grant_validity: 10s
region_lease: 40s
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease, partition_share: 0.5}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`)
	r := newLeaseRigWith(t, cfg)
	r.reported() // the first answer confers the static lease
	d := newDemandDriver(r)
	d.open(leaseKey)
	d.demand(40, leaseKey)
	if got := r.reported(); !slices.Equal(got, []quota.Key{leaseKey}) {
		t.Fatalf("report names %v, want only %v", got, leaseKey)
	}
	if regional.RisenForTest(ctx, r.leader) {
		t.Fatal("the key rose with its demand as reported")
	}
	d.demand(400, leaseKey)
	// A read that outlived its spacing on a starved machine says no rise:
	// read again, a bounded number of times.
	for i := 0; !regional.RisenForTest(ctx, r.leader); i++ {
		if i == 20 {
			t.Fatal("the key's demand rose from 40/s to 400/s and the leader never saw it")
		}
	}
}
