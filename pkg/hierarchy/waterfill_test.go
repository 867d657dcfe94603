package hierarchy

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/sluicehq/sluice/pkg/quota"
)

// refFill solves Σ clamp(λ·w_i, lo_i, hi_i) = c by bisection on λ: a
// deliberately different algorithm from the sweep in waterLevel.
func refFill(c float64, w, lo, hi []float64) []float64 {
	n := len(w)
	out := make([]float64, n)
	g := func(l float64) float64 {
		s := 0.0
		for i := range w {
			s += min(max(l*w[i], lo[i]), hi[i])
		}
		return s
	}
	var sumHi float64
	for i := range hi {
		sumHi += hi[i]
	}
	if sumHi <= c {
		copy(out, hi)
		return out
	}
	a, b := 0.0, 1.0
	for g(b) < c {
		b *= 2
	}
	for iter := 0; iter < 200; iter++ {
		m := (a + b) / 2
		if g(m) < c {
			a = m
		} else {
			b = m
		}
	}
	for i := range w {
		out[i] = min(max(b*w[i], lo[i]), hi[i])
	}
	return out
}

// refWaterFill is the reference for WaterFill, written from its
// definition: wants are clamped demands; shortage is shared max-min by
// weight above the floors; surplus is shared by weight below the ceilings.
func refWaterFill(rate float64, regions []Region, demand []float64) []float64 {
	n := len(regions)
	w, lo, hi, want := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	var sumWant float64
	for i, r := range regions {
		w[i] = r.Weight
		lo[i] = r.MinShare * rate
		hi[i] = r.maxShare() * rate
		want[i] = min(max(demand[i], lo[i]), hi[i])
		sumWant += want[i]
	}
	if sumWant >= rate {
		return refFill(rate, w, lo, want)
	}
	room := make([]float64, n)
	for i := range room {
		room[i] = hi[i] - want[i]
	}
	extra := refFill(rate-sumWant, w, make([]float64, n), room)
	for i := range extra {
		extra[i] += want[i]
	}
	return extra
}

func genRegions(t *rapid.T, maxN int) []Region {
	n := rapid.IntRange(1, maxN).Draw(t, "regions")
	regions := make([]Region, n)
	var sumMin float64
	for i := range regions {
		regions[i] = Region{Name: string(rune('a'+i)) + "-region", Weight: float64(rapid.IntRange(1, 5).Draw(t, "weight"))}
		if rapid.IntRange(0, 3).Draw(t, "hasMin") == 0 {
			m := rapid.Float64Range(0, 0.4).Draw(t, "min")
			if sumMin+m <= 1 {
				regions[i].MinShare = m
				sumMin += m
			}
		}
	}
	// Ceilings: drawn per region, then relaxed until they cover the rate.
	var sumMax float64
	for i := range regions {
		if rapid.IntRange(0, 2).Draw(t, "hasMax") == 0 {
			regions[i].MaxShare = rapid.Float64Range(max(regions[i].MinShare, 0.05), 1).Draw(t, "max")
		}
		sumMax += regions[i].maxShare()
	}
	if sumMax < 1 {
		regions[0].MaxShare = 0
	}
	return regions
}

func genDemand(t *rapid.T, rate float64) float64 {
	switch rapid.IntRange(0, 4).Draw(t, "demandKind") {
	case 0:
		return 0
	case 1:
		return rapid.Float64Range(0, rate/4).Draw(t, "demandLow")
	default:
		return rapid.Float64Range(0, 2*rate).Draw(t, "demand")
	}
}

const eps = 1e-9

func approx(a, b, scale float64) bool { return math.Abs(a-b) <= 1e-7*scale+eps }

func TestWaterFillMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		regions := genRegions(t, 8)
		rate := rapid.Float64Range(0.001, 1e6).Draw(t, "rate")
		demand := make([]float64, len(regions))
		for i := range demand {
			demand[i] = genDemand(t, rate)
		}
		got := make([]float64, len(regions))
		if err := WaterFill(rate, regions, demand, got); err != nil {
			t.Fatalf("WaterFill: %v", err)
		}
		want := refWaterFill(rate, regions, demand)
		var sum float64
		for i := range got {
			sum += got[i]
			if !approx(got[i], want[i], rate) {
				t.Fatalf("region %d: got %v, reference %v (all got %v want %v)", i, got[i], want[i], got, want)
			}
			if got[i] < regions[i].MinShare*rate-1e-9*rate || got[i] > regions[i].maxShare()*rate+1e-9*rate {
				t.Fatalf("region %d: %v outside [%v, %v]", i, got[i], regions[i].MinShare*rate, regions[i].maxShare()*rate)
			}
		}
		if !approx(sum, rate, rate) {
			t.Fatalf("allocations add up to %v, want the whole rate %v", sum, rate)
		}
		checkMaxMin(t, rate, regions, demand, got)
	})
}

// checkMaxMin checks weighted max-min optimality from its definition: a
// region may only have a smaller weighted share than another if it is
// saturated (at its want) or the other cannot give (at its floor). When
// there is surplus, everyone has its want and the surplus obeys the same
// rule against the ceilings.
func checkMaxMin(t *rapid.T, rate float64, regions []Region, demand, got []float64) {
	n := len(regions)
	want := make([]float64, n)
	var sumWant float64
	for i, r := range regions {
		want[i] = min(max(demand[i], r.MinShare*rate), r.maxShare()*rate)
		sumWant += want[i]
	}
	tol := 1e-7 * rate
	for i := range regions {
		for j := range regions {
			if sumWant >= rate {
				if got[i]/regions[i].Weight < got[j]/regions[j].Weight-tol &&
					got[i] < want[i]-tol && got[j] > regions[j].MinShare*rate+tol {
					t.Fatalf("not max-min fair: region %d (%v, want %v) could take from region %d (%v, floor %v)",
						i, got[i], want[i], j, got[j], regions[j].MinShare*rate)
				}
				continue
			}
			if got[i] < want[i]-tol {
				t.Fatalf("surplus but region %d got %v below its want %v", i, got[i], want[i])
			}
			ei, ej := got[i]-want[i], got[j]-want[j]
			if ei/regions[i].Weight < ej/regions[j].Weight-tol && got[i] < regions[i].maxShare()*rate-tol && ej > tol {
				t.Fatalf("surplus not shared by weight: region %d extra %v, region %d extra %v", i, ei, j, ej)
			}
		}
	}
}

func TestWaterFillTable(t *testing.T) {
	two := []Region{{Name: "us", Weight: 2}, {Name: "eu", Weight: 1}}
	for _, tc := range []struct {
		name    string
		rate    float64
		regions []Region
		demand  []float64
		want    []float64
	}{
		{"shortage is shared by weight", 90, two, []float64{100, 100}, []float64{60, 30}},
		{"a small demand is met, the rest goes to the big one", 90, two, []float64{100, 10}, []float64{80, 10}},
		{"surplus is shared by weight", 90, two, []float64{10, 20}, []float64{10 + 40, 20 + 20}},
		{"no demand means static shares", 90, two, []float64{0, 0}, []float64{60, 30}},
		{"floor holds without demand", 100,
			[]Region{{Name: "a", Weight: 1, MinShare: 0.3}, {Name: "b", Weight: 1}}, []float64{0, 500}, []float64{30, 70}},
		{"ceiling caps demand and surplus", 100,
			[]Region{{Name: "a", Weight: 1, MaxShare: 0.2}, {Name: "b", Weight: 1}}, []float64{500, 10}, []float64{20, 80}},
		{"three-way with one saturated", 100,
			[]Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 2}}, []float64{10, 100, 100}, []float64{10, 30, 60}},
		// A floor of exactly 1 under a weight other than 1: a starts to
		// rise at level lo/w = 0.5, not at 1; taking 1 oversubscribed
		// the rate (2 and 1 of 2).
		{"floor of one unit under weight 2", 2,
			[]Region{{Name: "a", Weight: 2, MinShare: 0.5}, {Name: "b", Weight: 1}}, []float64{10, 10}, []float64{4.0 / 3, 2.0 / 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make([]float64, len(tc.regions))
			if err := WaterFill(tc.rate, tc.regions, tc.demand, got); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if math.Abs(got[i]-tc.want[i]) > 1e-9 {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestWaterFillRejectsBadInput(t *testing.T) {
	ok := []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}
	for _, tc := range []struct {
		name    string
		rate    float64
		regions []Region
		demand  []float64
	}{
		{"zero rate", 0, ok, []float64{1, 1}},
		{"NaN rate", math.NaN(), ok, []float64{1, 1}},
		{"negative demand", 10, ok, []float64{-1, 1}},
		{"NaN demand", 10, ok, []float64{math.NaN(), 1}},
		{"infinite demand", 10, ok, []float64{math.Inf(1), 1}},
		{"length mismatch", 10, ok, []float64{1}},
		{"no regions", 10, nil, nil},
		{"zero weight", 10, []Region{{Name: "a", Weight: 0}}, []float64{1}},
		{"duplicate name", 10, []Region{{Name: "a", Weight: 1}, {Name: "a", Weight: 1}}, []float64{1, 1}},
		{"bad name", 10, []Region{{Name: "a b", Weight: 1}}, []float64{1}},
		{"floors above one", 10, []Region{{Name: "a", Weight: 1, MinShare: 0.6}, {Name: "b", Weight: 1, MinShare: 0.6}}, []float64{1, 1}},
		{"ceilings below one", 10, []Region{{Name: "a", Weight: 1, MaxShare: 0.4}, {Name: "b", Weight: 1, MaxShare: 0.4}}, []float64{1, 1}},
		{"floor above ceiling", 10, []Region{{Name: "a", Weight: 1, MinShare: 0.5, MaxShare: 0.4}, {Name: "b", Weight: 1}}, []float64{1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := make([]float64, len(tc.demand))
			err := WaterFill(tc.rate, tc.regions, tc.demand, out)
			if !errors.Is(err, quota.ErrInvalid) {
				t.Fatalf("got %v, want an error wrapping quota.ErrInvalid", err)
			}
		})
	}
}

func TestStaticShares(t *testing.T) {
	out := make([]float64, 3)
	StaticShares(120, []Region{{Name: "a", Weight: 2}, {Name: "b", Weight: 1}, {Name: "c", Weight: 3}}, out)
	if out[0] != 40 || out[1] != 20 || out[2] != 60 {
		t.Fatalf("got %v, want [40 20 60]", out)
	}
}

// TestClampIsMinMax checks clamp against min(max(x, lo), hi) to the bit
// over every combination of values that stress it: signed zeros, NaN,
// infinities, equal and crossed bounds.
func TestClampIsMinMax(t *testing.T) {
	negZero := math.Copysign(0, -1)
	vals := []float64{negZero, 0, math.NaN(), math.Inf(-1), math.Inf(1), -1, 1, 0.5, 2, math.SmallestNonzeroFloat64}
	for _, x := range vals {
		for _, lo := range vals {
			for _, hi := range vals {
				got, want := clamp(x, lo, hi), min(max(x, lo), hi)
				if math.Float64bits(got) != math.Float64bits(want) && !(math.IsNaN(got) && math.IsNaN(want)) {
					t.Errorf("clamp(%v, %v, %v) = %v, min(max()) = %v", x, lo, hi, got, want)
				}
			}
		}
	}
}

// TestFairShareWithLittleOrNoCapacity: inside the allocator the capacity
// left for the reporting regions may be 0 (silent regions frozen at what
// they may use hold the whole rate) or below their floors. Then nobody
// gets anything, never a NaN, or the floors are scaled down in proportion.
func TestFairShareWithLittleOrNoCapacity(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity float64
		lo, hi   []float64
		demand   []float64
		want     []float64
	}{
		{"no capacity, no floors", 0, []float64{0, 0}, []float64{100, 100}, []float64{30, 60}, []float64{0, 0}},
		{"no capacity, no demand", 0, []float64{0, 0}, []float64{100, 100}, []float64{0, 0}, []float64{0, 0}},
		{"no capacity, floors", 0, []float64{20, 10}, []float64{100, 100}, []float64{30, 60}, []float64{0, 0}},
		{"floors above capacity are scaled", 15, []float64{20, 10}, []float64{100, 100}, []float64{30, 60}, []float64{10, 5}},
		{"small floors above capacity are scaled", 0.375, []float64{0.5, 0.25}, []float64{1, 1}, []float64{1, 1}, []float64{0.25, 0.125}},
		{"floors exactly the capacity", 30, []float64{20, 10}, []float64{100, 100}, []float64{30, 60}, []float64{20, 10}},
	} {
		out := make([]float64, len(tc.lo))
		var fs fillScratch
		fairShare(tc.capacity, []float64{1, 1}, tc.lo, tc.hi, tc.demand, out, &fs)
		for i := range out {
			if out[i] != tc.want[i] {
				t.Errorf("%s: got %v, want %v", tc.name, out, tc.want)
				break
			}
		}
	}
}

// TestValidateRegionsBounds pins every region check at its bound: at most
// MaxRegions regions, weights above 0, min and max shares in [0, 1] (a
// max share of 0 means 1) with the min share at most the max share, min
// shares adding up to at most 1 and max shares to at least 1, both within
// shareTolerance.
func TestValidateRegionsBounds(t *testing.T) {
	many := func(n int) []Region {
		rs := make([]Region, n)
		for i := range rs {
			rs[i] = Region{Name: fmt.Sprintf("r%d", i), Weight: 1}
		}
		return rs
	}
	one := func(r Region) []Region {
		r.Name = "a"
		return []Region{r}
	}
	two := func(a, b Region) []Region {
		a.Name, b.Name = "a", "b"
		return []Region{a, b}
	}
	above1 := math.Nextafter(1, 2)
	for _, tc := range []struct {
		name    string
		regions []Region
		ok      bool
	}{
		{"MaxRegions regions", many(MaxRegions), true},
		{"one region more than MaxRegions", many(MaxRegions + 1), false},
		{"the smallest positive weight", one(Region{Weight: math.SmallestNonzeroFloat64}), true},
		{"a negative weight", one(Region{Weight: -1}), false},
		{"an infinite weight", one(Region{Weight: math.Inf(1)}), false},
		{"min share exactly 1", one(Region{Weight: 1, MinShare: 1}), true},
		{"min share just above 1", one(Region{Weight: 1, MinShare: above1}), false},
		{"a negative min share", one(Region{Weight: 1, MinShare: -0.1}), false},
		{"a NaN min share", one(Region{Weight: 1, MinShare: math.NaN()}), false},
		{"max share exactly 1", one(Region{Weight: 1, MaxShare: 1}), true},
		{"max share just above 1", one(Region{Weight: 1, MaxShare: above1}), false},
		{"a negative max share", one(Region{Weight: 1, MaxShare: -0.1}), false},
		{"an infinite max share", one(Region{Weight: 1, MaxShare: math.Inf(1)}), false},
		{"a NaN max share", one(Region{Weight: 1, MaxShare: math.NaN()}), false},
		{"min share equal to max share", two(Region{Weight: 1, MinShare: 0.5, MaxShare: 0.5}, Region{Weight: 1}), true},
		{"min share above a max share of 0 (1)", one(Region{Weight: 1, MinShare: 1, MaxShare: 0}), true},
		{"min shares adding up to exactly 1", two(Region{Weight: 1, MinShare: 0.5}, Region{Weight: 1, MinShare: 0.5}), true},
		{"min shares adding up to exactly 1+shareTolerance", two(Region{Weight: 1, MinShare: 0.5}, Region{Weight: 1, MinShare: 0.5 + shareTolerance}), true},
		{"min shares within tolerance above 1", two(Region{Weight: 1, MinShare: 0.5 + shareTolerance/2}, Region{Weight: 1, MinShare: 0.5}), true},
		{"min shares beyond tolerance above 1", two(Region{Weight: 1, MinShare: 0.5 + 2*shareTolerance}, Region{Weight: 1, MinShare: 0.5}), false},
		{"max shares adding up to exactly 1", two(Region{Weight: 1, MaxShare: 0.5}, Region{Weight: 1, MaxShare: 0.5}), true},
		{"max shares adding up to exactly 1-shareTolerance", one(Region{Weight: 1, MaxShare: 1 - shareTolerance}), true},
		{"max shares within tolerance below 1", two(Region{Weight: 1, MaxShare: 0.5 - shareTolerance/2}, Region{Weight: 1, MaxShare: 0.5}), true},
		{"max shares beyond tolerance below 1", two(Region{Weight: 1, MaxShare: 0.5 - 2*shareTolerance}, Region{Weight: 1, MaxShare: 0.5}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateRegions(tc.regions)
			if tc.ok && err != nil {
				t.Fatalf("got %v, want valid", err)
			}
			if !tc.ok && !errors.Is(err, quota.ErrInvalid) {
				t.Fatalf("got %v, want an error wrapping quota.ErrInvalid", err)
			}
		})
	}
}

// TestFairShareFloorsExactlyTheCapacityUnderWeights: when the floors add
// up to exactly the capacity, every region gets its floor to the bit,
// whatever the weights (levels computed as floor/weight would round).
func TestFairShareFloorsExactlyTheCapacityUnderWeights(t *testing.T) {
	w := []float64{3, 1, 5, 6}
	lo := []float64{0.7, 0.1, 0.5, 0.6}
	hi := []float64{1.7, 1.1, 1.5, 1.6}
	var capacity float64
	for _, l := range lo {
		capacity += l
	}
	out := make([]float64, len(w))
	var fs fillScratch
	fairShare(capacity, w, lo, hi, hi, out, &fs)
	if !slices.Equal(out, lo) {
		t.Fatalf("got %v, want the floors %v", out, lo)
	}
}

// TestWaterLevelSweepEndingShortOfCapacityGivesTheCeilings: ceilings
// adding up to one float step above the capacity, where rounding keeps
// the sweep from crossing it after the last event, give every region its
// ceiling.
func TestWaterLevelSweepEndingShortOfCapacityGivesTheCeilings(t *testing.T) {
	w := []float64{0.4, 0.5, 1}
	lo := []float64{0, 0, 0}
	hi := []float64{35.333333333333336, 70.85714285714286, 6}
	capacity := math.Nextafter(hi[0]+hi[1]+hi[2], 0)
	out := make([]float64, len(w))
	var fs fillScratch
	waterLevel(capacity, w, lo, hi, out, &fs)
	if !slices.Equal(out, hi) {
		t.Fatalf("got %v, want the ceilings %v", out, hi)
	}
}

// TestWaterFillRejectsAShortOutput: an output slice of the wrong length
// is refused even when the demands match the regions.
func TestWaterFillRejectsAShortOutput(t *testing.T) {
	regions := []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}
	if err := WaterFill(10, regions, []float64{1, 1}, make([]float64, 1)); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("got %v, want an error wrapping quota.ErrInvalid", err)
	}
}

// TestFairShareReusesItsScratch: once the scratch holds n regions, a
// fill of n regions (through the sweep) allocates nothing.
func TestFairShareReusesItsScratch(t *testing.T) {
	w, lo, hi := []float64{1, 2, 3}, []float64{0, 1, 0}, []float64{10, 10, 10}
	demand, out := []float64{5, 9, 7}, make([]float64, 3)
	var fs fillScratch
	fairShare(12, w, lo, hi, demand, out, &fs)
	if a := testing.AllocsPerRun(20, func() { fairShare(12, w, lo, hi, demand, out, &fs) }); a != 0 {
		t.Fatalf("%v allocations per fill with a grown scratch, want 0", a)
	}
}
