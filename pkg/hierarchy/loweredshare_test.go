package hierarchy

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLoweredShareCountsGrantsAtTheFormerShare: b holds a grant equal to
// its static share (50/s of 100/s) from while the key was contended; the
// key goes quiet, so that grant has no record left. Then b's counted share
// falls to 0 (drained, or a lower Confirmations.Reserve given through
// SetLimit). Until b's grant ends, a may get only what b's former share
// leaves; after it, the whole limit.
func TestLoweredShareCountsGrantsAtTheFormerShare(t *testing.T) {
	for _, how := range []string{"SetRegions drains b", "SetLimit lowers b's static share"} {
		t.Run(how, func(t *testing.T) {
			start := time.Unix(1_700_000_000, 0)
			regions := []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}
			a, err := NewAllocator(Options{Regions: regions, Epoch: 100 * time.Millisecond, Validity: 500 * time.Millisecond}, start)
			if err != nil {
				t.Fatal(err)
			}
			key := quota.Key{Tenant: "t", Class: "write"}
			limit := KeyLimit{Rate: 100, Burst: 100}
			if err := a.SetLimit(key, limit); err != nil {
				t.Fatal(err)
			}
			seq := map[string]uint64{}
			type held struct {
				g   Grant
				end time.Time
			}
			holds := map[string]held{}
			// report sends region's report at `at` (echoing the grant it
			// holds) and installs the grant of the answer, if any.
			report := func(at time.Time, region string, demand float64) Grant {
				t.Helper()
				kd := KeyDemand{Key: key, Window: 100 * time.Millisecond}
				kd.SetDemandRate(demand)
				if h := holds[region]; h.end.After(at) {
					kd.HeldRate, kd.HeldBurst, kd.HeldValid = h.g.Rate, h.g.Burst, h.end.Sub(at)
				}
				seq[region]++
				ans, err := a.Report(at, Report{Region: region, Seq: seq[region], Keys: []KeyDemand{kd}})
				if err != nil {
					t.Fatal(err)
				}
				for _, g := range ans.Grants {
					holds[region] = held{g, at.Add(g.Valid)}
					return g
				}
				return Grant{}
			}
			at := start
			var bGrant Grant
			var bEnd time.Time
			// Contended, equal demand: grants at the static shares.
			for range 10 {
				at = at.Add(100 * time.Millisecond)
				a.Allocate(at)
				report(at, "a", 80)
				if g := report(at, "b", 80); g.Valid > 0 {
					bGrant, bEnd = g, at.Add(g.Valid)
				}
			}
			if !nearStatic(bGrant.Rate, 50) || !bEnd.After(at) {
				t.Fatalf("b holds %+v until %v; want a grant at its 50/s share, live at %v", bGrant, bEnd, at)
			}
			// Quiet: the key needs no grant any more, and once the grants
			// it still gets are at the static shares, it keeps no fencing
			// state.
			for quiet := 0; ; quiet++ {
				if quiet == 50 {
					t.Fatalf("the quiet key still has fencing state: %+v", a.View(at).Keys)
				}
				at = at.Add(100 * time.Millisecond)
				a.Allocate(at)
				if v := a.View(at); len(v.Keys) == 1 && !v.Keys[0].Active {
					break
				}
				report(at, "a", 1)
				if g := report(at, "b", 1); g.Valid > 0 {
					bGrant, bEnd = g, at.Add(g.Valid)
				}
			}
			if !nearStatic(bGrant.Rate, 50) || !bEnd.After(at) {
				t.Fatalf("b holds %+v until %v; want a grant at its 50/s share, live at %v", bGrant, bEnd, at)
			}
			// b's counted share falls to 0.
			switch how {
			case "SetRegions drains b":
				limit.FloorShare = 0
				if err := a.SetLimit(key, limit); err != nil {
					t.Fatal(err)
				}
				regions[1].Drained = true
				if err := a.SetRegions(regions); err != nil {
					t.Fatal(err)
				}
			default:
				limit.StaticRate, limit.StaticBurst = []float64{50, 0}, []float64{50, 0}
				if err := a.SetLimit(key, limit); err != nil {
					t.Fatal(err)
				}
			}
			// a wants it all: while b's grant may be live, a gets what
			// b's former share leaves.
			for ; at.Before(bEnd.Add(time.Second)); at = at.Add(50 * time.Millisecond) {
				a.Allocate(at)
				g := report(at, "a", 100)
				if at.Before(bEnd) && g.Rate+bGrant.Rate > 100*(1+1e-9) {
					t.Fatalf("at %v (b's %v/s grant ends at %v) a got %+v: %v/s in force", at.Sub(start), bGrant.Rate, bEnd.Sub(start), g, g.Rate+bGrant.Rate)
				}
				if g.Valid > 0 && at.Add(g.Valid).After(bEnd) && g.Rate > 50*(1+1e-9) && at.Before(bEnd) {
					t.Fatalf("at %v a got %+v, running past b's grant's end %v", at.Sub(start), g, bEnd.Sub(start))
				}
			}
			if g := report(at, "a", 100); g.Rate < 99 {
				t.Fatalf("long after b's grant ended a gets %+v; want the whole 100/s", g)
			}
		})
	}
}
