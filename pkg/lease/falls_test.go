package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestAFallIsReportedBeforeTheNextSync: a key whose demand since the
// region's demand window for its lease opened fell plainly below the rate
// the region read last, by more than a tenth of the region's rate, is sent
// an early Sync from a tenth of a refresh on (PrepareFalls), so its region
// reads the fall before the periodic Sync; a steady demand, a fall within
// a Poisson count's noise or within a tenth of the region's rate, and an
// open window shorter than a tenth of a refresh are left to the periodic
// Sync. It fails with any of these margins dropped.
func TestAFallIsReportedBeforeTheNextSync(t *testing.T) {
	for _, tc := range []struct {
		name   string
		region float64       // the region's rate for the key
		base   int64         // requests/s before the last Sync
		rate   int64         // requests/s after it
		after  time.Duration // since the last Sync
		report bool
	}{
		{"a sevenfold fall at 150ms", 1000, 600, 90, 150 * time.Millisecond, true},
		{"no demand at 150ms", 1000, 600, 0, 150 * time.Millisecond, true},
		{"a sevenfold fall at 90ms: too soon", 1000, 600, 90, 90 * time.Millisecond, false},
		{"steady at 150ms", 1000, 600, 600, 150 * time.Millisecond, false},
		{"steady at 900ms", 1000, 600, 600, 900 * time.Millisecond, false},
		{"a quarter down", 1000, 600, 450, 150 * time.Millisecond, false},
		{"a third down, past the noise: less than a factor of two", 6000, 6000, 4000, 150 * time.Millisecond, false},
		{"a rise", 1000, 600, 1500, 150 * time.Millisecond, false},
		{"a slow key's fall within the noise: 9 expected, 1 counted", 60, 60, 10, 150 * time.Millisecond, false},
		{"a slow key's fall past the noise: 18 expected, 3 counted", 60, 60, 10, 300 * time.Millisecond, true},
		{"the same fall on a region of 600/s: less than a tenth of it", 600, 60, 10, 300 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			region := func(g *sluicev1.Grant) { g.RegionRate, g.RegionBurst, g.LiveInstances = tc.region, 2000, 1 }
			tb, now := steadyLease(t, tc.base, region)
			n := tc.rate * tc.after.Milliseconds() / 1000
			for i := range n {
				at := now.Add(time.Duration(i) * time.Second / time.Duration(tc.rate))
				if _, act := allow(t, tb, at, kW, 1); act == ActAcquire {
					t.Fatalf("request %d at %d/s found no token; the test needs the pool to last", i, tc.rate)
				}
			}
			b := tb.PrepareFalls(now.Add(tc.after))
			if (b != nil) != tc.report {
				t.Fatalf("%d/s for %v after %d/s: early report %v, want %v", tc.rate, tc.after, tc.base, b != nil, tc.report)
			}
			if b == nil {
				return
			}
			if len(b.Reports) != 1 || b.Reports[0].Used != 2*tc.base+n {
				t.Fatalf("early report %v, want one reporting every token spent (%d)", b.Reports, 2*tc.base+n)
			}
			if tb.PrepareFalls(now.Add(tc.after)) != nil {
				t.Error("a key in flight was picked again")
			}
		})
	}
}

// TestAFallAfterAMixedWindowIsReported: the region reads a lease's demand
// over its own windows, which a report closes only from a tenth of a
// refresh on, so a window the region closed across a fall read a mix of
// the old demand and the new; the instance follows that window
// (mirrorWindowLocked) and reports again once the new demand alone is a
// plain fall from what the region read, although its own last sample (an
// early refill's, after the fall) already read nothing. A refill 50ms
// into the window leaves it open; the Sync 350ms in closes it at 30
// tokens over 350ms (86/s); with no demand since, 200ms later the region
// still reads 86/s.
func TestAFallAfterAMixedWindowIsReported(t *testing.T) {
	region := func(g *sluicev1.Grant) { g.RegionRate, g.RegionBurst, g.LiveInstances = 300, 2000, 1 }
	tb, now := steadyLease(t, 600, region)
	for i := range 30 {
		allow(t, tb, now.Add(time.Duration(i)*time.Second/600), kW, 1)
	}
	syncAt(t, tb, now.Add(50*time.Millisecond), region)
	syncAt(t, tb, now.Add(350*time.Millisecond), region)
	if b := tb.PrepareFalls(now.Add(400 * time.Millisecond)); b != nil {
		t.Fatalf("50ms after the window closed: early report %v, want none (too soon)", b.Reports)
	}
	if b := tb.PrepareFalls(now.Add(550 * time.Millisecond)); b == nil {
		t.Fatal("no demand for 200ms after the region read 86/s: no early report")
	}
}
