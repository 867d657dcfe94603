package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestAFallIsReportedBeforeTheNextSync: a key whose demand since its last
// report fell plainly below the rate that report measured, by more than a
// tenth of the region's rate, is sent an early Sync from a tenth of a
// refresh on (PrepareFalls), so its region reads the fall before the
// periodic Sync; a steady demand, a fall within a Poisson count's noise
// or within a tenth of the region's rate, and an open window shorter than
// a tenth of a refresh are left to the periodic Sync (and a fall from a
// rate read from too few requests: TestAFallFromAShortWindowWaits). It
// fails with any of these margins dropped.
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
			tb := newTestTable(t)
			acquire(t, tb, t0, t0, kW, 1, 1, region)
			now := t0
			spendWindow(t, tb, &now, tc.base, region)
			spendWindow(t, tb, &now, tc.base, region)
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

// TestAFallFromAShortWindowWaits: a rate read from fewer than ten
// requests (a Sync 15ms after the last, at 600/s) is no reading, so a fall
// from it is left to the periodic Sync; the same fall from a window of a
// second is reported.
func TestAFallFromAShortWindowWaits(t *testing.T) {
	region := func(g *sluicev1.Grant) { g.RegionRate, g.RegionBurst, g.LiveInstances = 1000, 2000, 1 }
	for _, short := range []bool{false, true} {
		tb := newTestTable(t)
		acquire(t, tb, t0, t0, kW, 1, 1, region)
		now := t0
		spendWindow(t, tb, &now, 600, region)
		if short {
			for i := range 9 {
				allow(t, tb, now.Add(time.Duration(i)*time.Second/600), kW, 1)
			}
			now = now.Add(15 * time.Millisecond)
			syncs, _ := tb.PrepareSync(now)
			r := syncs[0].Reports[0]
			if err := tb.Apply(now, syncs[0], []*sluicev1.Grant{regionGrant(r, r.Want, region)}); err != nil {
				t.Fatal(err)
			}
		}
		if b := tb.PrepareFalls(now.Add(300 * time.Millisecond)); (b != nil) == short {
			t.Errorf("no demand for 300ms after a window of 600/s over %v: early report %v, want %v",
				map[bool]string{false: "1s", true: "15ms"}[short], b != nil, !short)
		}
	}
}
