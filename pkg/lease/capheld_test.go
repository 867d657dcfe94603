package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// capHeldGrant: a lone instance in a region of 1000/s, burst 1000, whose
// bucket holds remaining tokens after the grant.
func capHeldGrant(remaining int64) func(*sluicev1.Grant) {
	return func(g *sluicev1.Grant) {
		g.RegionRate, g.RegionBurst, g.Limit, g.Remaining = 1000, 1000, 1000, remaining
	}
}

// startDraining gives kW a first batch of 100, spends it at 2000/s, and
// acquires again at t0+50ms: the region grants 930 and keeps 70, so the
// bucket and the pool fill the region's cap of 1000.
func startDraining(t *testing.T, tb *Table) time.Time {
	t.Helper()
	acquire(t, tb, t0, t0, kW, 1, 100, capHeldGrant(900))
	for i := range 100 {
		if d, _ := allow(t, tb, t0.Add(time.Duration(i)*500*time.Microsecond), kW, 1); !d.Allowed {
			t.Fatalf("request %d of the first batch denied", i)
		}
	}
	now := t0.Add(50 * time.Millisecond)
	acquire(t, tb, now, now, kW, 1, 930, capHeldGrant(70))
	return now
}

// TestReportsSpendingThatHoldsTheRegionAtItsCap: the region refills its
// bucket only up to its cap less the tokens out in leases as last
// reported, so while its bucket and one instance's pool fill the cap
// (a key that just started: the bucket starts full and the instance took
// most of it), every token the instance spends unreported is refill the
// region loses. An instance that drains the region reports after spending
// the bucket's room (at least a sixteenth of the burst), not at its usual
// low-water mark a quarter refresh of demand above empty. Before, a hot
// key through the Envoy endpoint lost 1.8–4% of b + r·t in its first 5 s
// this way (pkg/envoyrls TestHotKeyDeliversTheLimitFromTheStart).
func TestReportsSpendingThatHoldsTheRegionAtItsCap(t *testing.T) {
	tb := newTestTable(t)
	now := startDraining(t, tb)
	st := state(t, tb, kW)
	// room = 1000 − 70 − 930 = 0: report after a sixteenth of the burst.
	if st.Tokens != 930 || st.LowWater != 930-62 {
		t.Fatalf("pool %d, low water %d; want 930 and %d", st.Tokens, st.LowWater, 930-62)
	}
	var refill int
	for i := range 62 {
		now = now.Add(500 * time.Microsecond)
		if _, act := allow(t, tb, now, kW, 1); act == ActRefill {
			refill = i + 1
			break
		}
	}
	if refill != 62 {
		t.Fatalf("refill signalled after %d tokens, want 62", refill)
	}
	b := tb.PrepareRefill(now)
	if b == nil || len(b.Reports) != 1 || b.Reports[0].Used != 100+62 {
		t.Fatalf("early refill %+v, want one report of the 162 tokens spent", b)
	}
}

// TestNoEarlyReportWithoutDemand: the mark is set with the rate the batch
// was sized with; when the demand measured on reaching it no longer
// drains the region, no report goes out and the usual mark (2000/s × a
// quarter refresh = 500) is back. A pool already down to the usual mark
// gets its report whatever the demand.
func TestNoEarlyReportWithoutDemand(t *testing.T) {
	for _, tc := range []struct {
		spent  int
		report bool
	}{
		{spent: 62},
		{spent: 429},               // pool 501: above the usual mark
		{spent: 430, report: true}, // pool 500: at it
	} {
		tb := newTestTable(t)
		now := startDraining(t, tb)
		// A token every 10 ms: about 100/s, a tenth of the region's rate.
		for range tc.spent {
			now = now.Add(10 * time.Millisecond)
			allow(t, tb, now, kW, 1)
		}
		b := tb.PrepareRefill(now)
		if got := b != nil; got != tc.report {
			t.Errorf("%d spent at 100/s: early report %v, want %v", tc.spent, got, tc.report)
			continue
		}
		if st := state(t, tb, kW); !tc.report && st.LowWater != 500 {
			t.Errorf("%d spent at 100/s: low water %d with %d tokens, want the usual 500 back", tc.spent, st.LowWater, st.Tokens)
		}
	}
}

// TestAnswerGrantingNothingPutsTheUsualMarkBack: the cap-held mark is for
// a pool just credited by a grant after which the region's bucket is
// known to hold too little. An answer that grants nothing puts the usual
// mark back, even while the pool and the bucket still fill the cap, and so
// does a grant after which the region does not say what its bucket holds.
// Here a Sync asks to top the pool of 930 up to its target of 1000; the
// usual mark is 2000/s × a quarter refresh = 500 (with nothing granted
// from a bucket left empty, the cap-held mark would be 930 − 70).
func TestAnswerGrantingNothingPutsTheUsualMarkBack(t *testing.T) {
	for _, tc := range []struct {
		granted, remaining int64
		wantPool           int64
	}{
		{granted: 0, remaining: 0, wantPool: 930},
		{granted: 70, remaining: -1, wantPool: 1000},
	} {
		tb := newTestTable(t)
		now := startDraining(t, tb)
		syncs, _ := tb.PrepareSync(now)
		if len(syncs) != 1 || len(syncs[0].Reports) != 1 || syncs[0].Reports[0].Want != 70 {
			t.Fatalf("syncs %v, want one report asking for 70", syncs)
		}
		g := regionGrant(syncs[0].Reports[0], tc.granted, capHeldGrant(tc.remaining))
		if err := tb.Apply(now, syncs[0], []*sluicev1.Grant{g}); err != nil {
			t.Fatal(err)
		}
		if st := state(t, tb, kW); st.Tokens != tc.wantPool || st.LowWater != 500 {
			t.Errorf("granted %d, remaining %d: pool %d, low water %d; want %d and the usual 500",
				tc.granted, tc.remaining, st.Tokens, st.LowWater, tc.wantPool)
		}
	}
}
