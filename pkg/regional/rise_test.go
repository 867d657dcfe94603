package regional_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// watchedKeyConfig is the config of the tests of a single watched key: a
// long epoch (2 s: reads between epochs are bounded by a nudge spacing, an
// eighth of it, which a starved machine must fit in), two regions of equal
// weight, one class of 100/s.
const watchedKeyConfig = `
epoch: 2s
grant_validity: 10s
region_lease: 40s
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease, partition_share: 0.5}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`

// oneWatchedKey is a lease rig on watchedKeyConfig whose last report
// named leaseKey alone, at 40/s, above half eu's static share (so the
// leader watches it), and the driver of its demand.
func oneWatchedKey(t *testing.T) (*leaseRig, *demandDriver) {
	t.Helper()
	r := newLeaseRigWith(t, regiontest.MustConfig(t, watchedKeyConfig))
	r.reported() // the first answer confers the static lease
	d := newDemandDriver(r)
	d.open(leaseKey)
	d.demand(40, leaseKey)
	if got := r.reported(); !slices.Equal(got, []quota.Key{leaseKey}) {
		t.Fatalf("report names %v, want only %v", got, leaseKey)
	}
	return r, d
}

// TestLeaderSeesItsOneWatchedKeyRise: between epochs the leader reads the
// keys its last report watched and reports at once when one asks for
// materially more than it holds and than was reported. Here the report
// watches a single key (its demand is above half eu's static share): at
// the demand reported it has not risen; at ten times that it has.
func TestLeaderSeesItsOneWatchedKeyRise(t *testing.T) {
	ctx := context.Background()
	r, d := oneWatchedKey(t)
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

// TestLeaderSeesAFreshKeyBetweenEpochs: a key that turns hot between two
// reports is not watched (no report named it), but the scripts mark it
// into the candidate set, which grows: the leader's next look between
// epochs reads it and finds it risen. A look at a set that only had its
// members marked again reads no marks and finds nothing.
func TestLeaderSeesAFreshKeyBetweenEpochs(t *testing.T) {
	ctx := context.Background()
	r, d := oneWatchedKey(t)
	if regional.RisenForTest(ctx, r.leader) { // the first look records the set
		t.Fatal("the watched key rose with its demand as reported")
	}
	d.demand(40, leaseKey) // marked again (or not, within its mark interval)
	if regional.RisenForTest(ctx, r.leader) {
		t.Fatal("a look at a set whose members were only marked again found a rise")
	}
	// A look that outlived its spacing on a starved machine sees nothing,
	// and the next one only records the set again: a new key turns hot
	// before each look, a bounded number of times.
	for i := 0; ; i++ {
		fresh := quota.Key{Tenant: fmt.Sprintf("globex%d", i), Class: "write"}
		if i == 10 {
			t.Fatalf("keys turned hot between reports (400/s against a static share of 50/s), the last %v, and no look of the leader's saw one", fresh)
		}
		d.open(fresh)
		d.demand(400, fresh)
		if regional.RisenForTest(ctx, r.leader) {
			break
		}
	}
}

// TestWatchedKeyRiseSendsANudgedReportBetweenEpochs: a leader running its
// loop reads its watched keys between epochs and, when one rose, reports
// at once as a nudged round, not at the next epoch. The tier here cannot
// nudge (no Watch): only the rise the leader sees itself starts that
// round.
func TestWatchedKeyRiseSendsANudgedReportBetweenEpochs(t *testing.T) {
	r, d := oneWatchedKey(t)
	epoch := time.Duration(r.cfg.Epoch)
	reports := func(kind string) float64 {
		return metrictest.Series(t, r.reg, "sluice_regional_global_reports_total", map[string]string{"kind": kind})
	}
	rises := func() float64 { return r.counter("sluice_regional_demand_rises_total") }
	// Rounds come one an epoch, rise reads eight an epoch: 20 epochs leave
	// room for a starved machine.
	patience := 20 * epoch
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(patience); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, patience)
			}
			time.Sleep(regionsync.NudgeSpacing(epoch) / 4) // polling the leader's reads with a deadline
		}
	}
	epochs := reports("epoch")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.leader.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor("the loop's first round", func() bool { return reports("epoch") > epochs })

	// An epoch round that read the rise before a read between epochs did
	// leaves nothing risen: the demand rises again, a bounded number of
	// times.
	rate := 40.0
	for i := 0; rises() == 0; i++ {
		if i == 5 {
			t.Fatalf("the watched key's demand rose to %v/s and the leader never saw it rise", rate)
		}
		rate *= 10
		d.demand(rate, leaseKey)
		epochs := reports("epoch")
		waitFor("a rise seen or two epoch rounds", func() bool { return rises() > 0 || reports("epoch") >= epochs+2 })
	}
	waitFor("a nudged report after the rise", func() bool { return reports("nudged") >= 1 })
}
