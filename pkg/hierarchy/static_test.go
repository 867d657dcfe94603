package hierarchy

import (
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluicehq/sluice/pkg/quota"
)

func sampleRegions() []Region {
	return []Region{{Name: "us-east", Weight: 2}, {Name: "eu-west", Weight: 1}, {Name: "ap-south", Weight: 1}}
}

// The sample config's free `export` (burst 1 over weights 2:1:1) used to be
// split 0.5/0.25/0.25: no region could ever admit a request of cost 1.
func TestStaticBurstsSampleConfig(t *testing.T) {
	out := make([]float64, 3)
	StaticBursts(1, 1, sampleRegions(), out)
	if want := []float64{1, 0, 0}; fmt.Sprint(out) != fmt.Sprint(want) {
		t.Fatalf("burst 1 over 2:1:1 = %v, want %v", out, want)
	}
	StaticBursts(5, 1, sampleRegions(), out)
	if want := []float64{3, 1, 1}; fmt.Sprint(out) != fmt.Sprint(want) {
		t.Fatalf("burst 5 over 2:1:1 = %v, want %v", out, want)
	}
	StaticBursts(5, 2, sampleRegions(), out) // 2 units of 2 (ties by name), 1 token left over to the first in line
	if want := []float64{2, 0, 3}; fmt.Sprint(out) != fmt.Sprint(want) {
		t.Fatalf("burst 5 in units of 2 over 2:1:1 = %v, want %v", out, want)
	}
}

func TestStaticBurstsProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "regions")
		regions := make([]Region, n)
		for i := range regions {
			regions[i] = Region{Name: fmt.Sprintf("r%d", i), Weight: float64(rapid.IntRange(1, 5).Draw(t, "weight")) / float64(rapid.IntRange(1, 3).Draw(t, "div"))}
		}
		unit := float64(rapid.IntRange(1, 5).Draw(t, "unit"))
		burst := float64(rapid.Int64Range(int64(unit), 1<<40).Draw(t, "burst"))
		if rapid.Bool().Draw(t, "small") {
			burst = float64(rapid.IntRange(int(unit), 12).Draw(t, "smallBurst"))
		}
		out := make([]float64, n)
		StaticBursts(burst, unit, regions, out)
		var sum, sumW float64
		for i, r := range regions {
			sum += out[i]
			sumW += r.Weight
		}
		if sum != burst {
			t.Fatalf("caps %v add up to %v, want exactly %v", out, sum, burst)
		}
		left := burst - math.Floor(burst/unit)*unit
		whole := 0
		for i, r := range regions {
			units := out[i] / unit
			if units != math.Floor(units) {
				if out[i]-left != math.Floor((out[i]-left)/unit)*unit {
					t.Fatalf("cap %v of region %d is not whole units of %v (plus the %v left over)", out[i], i, unit, left)
				}
			}
			if out[i] >= unit {
				whole++
			}
			if d := math.Abs(out[i] - burst*r.Weight/sumW); d > unit+left+1e-9*burst {
				t.Fatalf("cap %v of region %d is %v from its proportional share", out[i], i, d)
			}
		}
		if whole == 0 {
			t.Fatalf("no region holds a whole unit: %v", out)
		}
		// The order of regions does not matter.
		rev := make([]Region, n)
		for i := range regions {
			rev[n-1-i] = regions[i]
		}
		out2 := make([]float64, n)
		StaticBursts(burst, unit, rev, out2)
		for i := range regions {
			if out2[n-1-i] != out[i] {
				t.Fatalf("order matters: %v then %v (reversed)", out, out2)
			}
		}
	})
}

// A region whose static burst holds no whole unit gets one from the global
// tier once it has demand, and the caps never add up to more than b.
func TestRegionWithoutUnitGetsOneFromGlobal(t *testing.T) {
	regions := sampleRegions()
	a := mustAllocator(t, regions)
	key := quota.Key{Tenant: "someone", Class: "export"}
	lim := KeyLimit{Rate: 0.1, Burst: 1, Unit: 1} // 6/m, burst 1
	if err := a.SetLimit(key, lim); err != nil {
		t.Fatal(err)
	}
	static := make([]float64, 3)
	StaticBursts(lim.Burst, lim.Unit, regions, static)
	type held struct {
		rate, burst float64
		expiry      time.Time
	}
	hold := make([]held, 3)
	var seq uint64
	capOf := func(r int, now time.Time) float64 {
		if now.Before(hold[r].expiry) {
			return hold[r].burst
		}
		return static[r]
	}
	demand := []float64{0, 0.05, 0} // eu-west: a request every 20 s
	got := false
	for e := 1; e <= 40 && !got; e++ {
		now := testStart.Add(5*time.Second + time.Duration(e)*time.Second)
		a.Allocate(now)
		for r := range regions {
			seq++
			at := now.Add(time.Duration(r+1) * 10 * time.Millisecond)
			kd := KeyDemand{Key: key, Window: time.Second}
			kd.SetDemandRate(demand[r])
			if at.Before(hold[r].expiry) {
				kd.HeldRate, kd.HeldBurst, kd.HeldValid = hold[r].rate, hold[r].burst, hold[r].expiry.Sub(at).Truncate(time.Millisecond)
			}
			grants, err := grantsOf(a.Report(at, Report{Region: regions[r].Name, Seq: seq, Keys: []KeyDemand{kd}}))
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range grants {
				hold[r] = held{g.Rate, g.Burst, at.Add(g.Valid)}
			}
			var sum float64
			for y := range regions {
				sum += capOf(y, at)
			}
			if sum > lim.Burst {
				t.Fatalf("epoch %d: caps add up to %v, above the burst %v", e, sum, lim.Burst)
			}
		}
		got = capOf(1, now.Add(time.Second)) >= 1
	}
	if !got {
		t.Fatalf("eu-west has demand but never got a whole token of burst: holds %+v", hold)
	}
}

// A region with demand and no static unit gets one even when the only
// region that can spare a unit is gaining rate: b = 3 over weights 1:1:3
// is 1/0/2 units; a (demand 0.125) gives rate away and holds its one unit,
// c (demand 1) takes what a leaves. A region may not give up burst while
// getting more rate, so c used to keep both its units and b none, forever.
// c is held a hair below its static rate so that it can give one, and in
// steady state every region holds a unit, the rates are stable and the
// whole rate is assigned; caps and rates never add up to more than the
// limit at any report.
func TestUnitForRegionWhenOnlyRateRecipientCanSpare(t *testing.T) {
	regions := []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 3}}
	a := mustAllocator(t, regions)
	key := quota.Key{Tenant: "t1", Class: "write"}
	lim := KeyLimit{Rate: 1, Burst: 3}
	if err := a.SetLimit(key, lim); err != nil {
		t.Fatal(err)
	}
	staticR, staticB := make([]float64, 3), make([]float64, 3)
	StaticShares(lim.Rate, regions, staticR)
	StaticBursts(lim.Burst, lim.Unit, regions, staticB)
	if staticB[0] != 1 || staticB[1] != 0 || staticB[2] != 2 {
		t.Fatalf("static bursts %v, want [1 0 2]", staticB)
	}
	type held struct {
		rate, burst float64
		expiry      time.Time
	}
	hold := make([]held, 3)
	usable := func(r int, now time.Time) (float64, float64) {
		if now.Before(hold[r].expiry) {
			return hold[r].rate, hold[r].burst
		}
		return staticR[r], staticB[r]
	}
	demand := []float64{0.125, 0.0625, 1}
	var seq uint64
	const epochs, steady = 60, 20
	var last [3][2]float64
	for e := 1; e <= epochs; e++ {
		now := testStart.Add(5*time.Second + time.Duration(e)*time.Second)
		a.Allocate(now)
		// Every region reports at the same instant, a then b then c: the
		// order in which b sees c's older grants.
		at := now.Add(6 * time.Millisecond)
		for r := range regions {
			seq++
			kd := KeyDemand{Key: key, Window: time.Second}
			kd.SetDemandRate(demand[r])
			if at.Before(hold[r].expiry) {
				kd.HeldRate, kd.HeldBurst, kd.HeldValid = hold[r].rate, hold[r].burst, hold[r].expiry.Sub(at).Truncate(time.Millisecond)
			}
			grants, err := grantsOf(a.Report(at, Report{Region: regions[r].Name, Seq: seq, Keys: []KeyDemand{kd}}))
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range grants {
				hold[r] = held{g.Rate, g.Burst, at.Add(g.Valid)}
			}
			var sumR, sumB float64
			for y := range regions {
				rate, burst := usable(y, at)
				sumR += rate
				sumB += burst
			}
			if sumR > lim.Rate*(1+1e-9) || sumB > lim.Burst*(1+1e-9) {
				t.Fatalf("epoch %d: regions may use rate %v and burst %v, above %v and %v", e, sumR, sumB, lim.Rate, lim.Burst)
			}
		}
		if e <= epochs-steady {
			continue
		}
		var sumR float64
		for r := range regions {
			rate, burst := usable(r, at)
			sumR += rate
			if burst < 1 {
				t.Fatalf("epoch %d: region %s has demand %v and a burst cap %v below one unit (holds %+v)", e, regions[r].Name, demand[r], burst, hold)
			}
			if e > epochs-steady+1 && math.Abs(rate-last[r][0]) > 1e-9 {
				t.Fatalf("epoch %d: region %s rate moved from %v to %v in steady state", e, regions[r].Name, last[r][0], rate)
			}
			last[r] = [2]float64{rate, burst}
		}
		if math.Abs(sumR-lim.Rate) > 1e-6 {
			t.Fatalf("epoch %d: %v of the rate %v assigned in steady state (holds %+v)", e, sumR, lim.Rate, hold)
		}
	}
}

// TestSplitUnitsProperties checks the burst split's promises on random
// pools, weights, static caps, demands and roles: Σ out <= pool (or the
// fractions of a unit kept, when they are more); whole
// units each (recipients and regions at their share keep the fraction of
// a unit their static cap carries once they hold their static units); a
// donor (role < 0) gets at most its static units and, when the pool covers
// the static caps of the others, a region at its share exactly its static
// cap and a recipient at least its static cap; no unit is left over while
// some region may take one; and a region with demand is left without a
// unit only when no region could give it one.
func TestSplitUnitsProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(t, "regions")
		unit := rapid.SampledFrom([]float64{1, 2.5}).Draw(t, "unit")
		weight, sb, demand := make([]float64, n), make([]float64, n), make([]float64, n)
		role := make([]int8, n)
		var sumSb float64
		for j := range n {
			weight[j] = float64(rapid.IntRange(0, 5).Draw(t, "weight"))
			sb[j] = float64(rapid.IntRange(0, 3).Draw(t, "staticUnits")) * unit
			if rapid.IntRange(0, 3).Draw(t, "fraction") == 0 {
				sb[j] += unit / 2
			}
			sumSb += sb[j]
			demand[j] = float64(rapid.IntRange(0, 2).Draw(t, "demand"))
			role[j] = int8(rapid.IntRange(-1, 1).Draw(t, "role"))
		}
		pool := float64(rapid.IntRange(0, int(sumSb/unit)+3).Draw(t, "poolUnits")) * unit
		if rapid.Bool().Draw(t, "poolFraction") {
			pool += unit / 2
		}
		out := make([]float64, n)
		var us unitScratch
		splitUnits(pool, unit, weight, sb, demand, role, out, &us)
		var sum, kept, keepers float64
		for j := range n {
			sum += out[j]
			if role[j] >= 0 {
				kept += sb[j] - math.Floor(sb[j]/unit)*unit
				keepers += sb[j]
			}
		}
		// The fractions of a unit that static caps carry are kept even
		// when the pool cannot hold them (a silent region may be counted
		// above its static cap); the fence caps every grant anyway.
		if sum > max(pool, kept)+1e-9 {
			t.Fatalf("split %v adds up to %v, above the pool %v", out, sum, pool)
		}
		units := math.Floor(max(0, pool-kept) / unit)
		var given float64
		for j := range n {
			whole := math.Floor(sb[j] / unit)
			u := out[j] / unit
			if role[j] >= 0 && out[j] >= whole*unit && out[j] > 0 {
				u = (out[j] - (sb[j] - whole*unit)) / unit
			}
			if u != math.Floor(u) || u < 0 {
				t.Fatalf("region %d (role %d, static %v) got %v: not whole units of %v; split %v", j, role[j], sb[j], out[j], unit, out)
			}
			given += u
			if role[j] < 0 && out[j] > whole*unit {
				t.Fatalf("donor %d got %v, above its static units %v; split %v", j, out[j], whole*unit, out)
			}
			if keepers <= pool && role[j] == 0 && out[j] != sb[j] {
				t.Fatalf("region %d at its share got %v, want its static cap %v (pool %v covers them); split %v", j, out[j], sb[j], pool, out)
			}
			if keepers <= pool && role[j] > 0 && out[j] < sb[j] {
				t.Fatalf("recipient %d got %v, below its static cap %v (pool %v covers them); split %v", j, out[j], sb[j], pool, out)
			}
		}
		if given < units {
			for j := range n {
				if role[j] > 0 {
					t.Fatalf("%v of %v units given, yet recipient %d could take more; split %v", given, units, j, out)
				}
			}
		}
		for j := range n {
			if !(demand[j] > 0) || out[j] > 0 || (role[j] <= 0 && sb[j] < unit) {
				continue
			}
			for d := range n {
				keep := 0.0
				if role[d] >= 0 {
					keep = math.Floor(sb[d] / unit)
				}
				if demand[d] > 0 {
					keep = max(keep, 1)
				}
				if d != j && out[d] > keep*unit+(sb[d]-math.Floor(sb[d]/unit)*unit)*float64(max(0, min(1, role[d]+1))) {
					t.Fatalf("region %d has demand and no unit while region %d holds %v it could give; split %v (weights %v, static %v, demand %v, roles %v, pool %v)",
						j, d, out[d], out, weight, sb, demand, role, pool)
				}
			}
		}
	})
}

// TestSplitUnitsWithoutWeights: with no weight at all (no rate assigned)
// the units are shared equally, the one left over to the first region.
func TestSplitUnitsWithoutWeights(t *testing.T) {
	out := make([]float64, 3)
	var us unitScratch
	splitUnits(4, 1, []float64{0, 0, 0}, []float64{0, 0, 0}, []float64{0, 0, 0}, []int8{1, 1, 1}, out, &us)
	if want := []float64{2, 1, 1}; fmt.Sprint(out) != fmt.Sprint(want) {
		t.Fatalf("4 units over 3 regions without weights = %v, want %v", out, want)
	}
}

// TestStaticBurstsWithoutRegionsWritesNothing: no regions, no caps (and
// no panic).
func TestStaticBurstsWithoutRegionsWritesNothing(t *testing.T) {
	StaticBursts(10, 1, nil, nil)
	out := []float64{7}
	StaticBursts(10, 1, []Region{}, out[:0])
	if out[0] != 7 {
		t.Fatalf("wrote %v past zero regions", out[0])
	}
}

// TestStaticBurstsDoesNotAllocate: the split runs on every limit and
// region change; up to MaxRegions regions it allocates nothing.
func TestStaticBurstsDoesNotAllocate(t *testing.T) {
	for _, n := range []int{1, MaxRegions} {
		regions := make([]Region, n)
		for i := range regions {
			regions[i] = Region{Name: fmt.Sprintf("r%02d", i), Weight: float64(1 + i%3)}
		}
		out := make([]float64, n)
		if a := testing.AllocsPerRun(20, func() { StaticBursts(1000, 1, regions, out) }); a != 0 {
			t.Fatalf("%d regions: %v allocations per split, want 0", n, a)
		}
	}
}

// TestSplitUnitsReusesItsScratch: once the scratch holds n regions, a
// split of n regions allocates nothing.
func TestSplitUnitsReusesItsScratch(t *testing.T) {
	weight, sb, demand := []float64{1, 2, 3}, []float64{1, 1, 1}, []float64{1, 0, 2}
	role := []int8{1, 0, -1}
	out := make([]float64, 3)
	var us unitScratch
	splitUnits(5, 1, weight, sb, demand, role, out, &us)
	if a := testing.AllocsPerRun(20, func() { splitUnits(5, 1, weight, sb, demand, role, out, &us) }); a != 0 {
		t.Fatalf("%v allocations per split with a grown scratch, want 0", a)
	}
}
