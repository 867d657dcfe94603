package hierarchy

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestRegionLeaseDefaultAndBound: without a RegionLease the static lease
// is the longer of a minute and twice the validity, and a region lease
// shorter than the validity, by a millisecond, is refused.
func TestRegionLeaseDefaultAndBound(t *testing.T) {
	for _, tc := range []struct {
		validity, lease, want time.Duration
	}{
		{20 * time.Second, 0, time.Minute},
		{30 * time.Second, 0, time.Minute},
		{40 * time.Second, 0, 80 * time.Second},
		{5 * time.Second, 5 * time.Second, 5 * time.Second},
		{5 * time.Second, 7*time.Second + 900*time.Microsecond, 7 * time.Second},
	} {
		a, err := NewAllocator(Options{Regions: twoRegions(), Epoch: time.Second, Validity: tc.validity, RegionLease: tc.lease}, testStart)
		if err != nil {
			t.Fatalf("validity %v, region lease %v: %v", tc.validity, tc.lease, err)
		}
		if got := a.RegionLease(); got != tc.want {
			t.Errorf("validity %v, region lease %v: RegionLease() = %v, want %v", tc.validity, tc.lease, got, tc.want)
		}
	}
	_, err := NewAllocator(Options{Regions: twoRegions(), Epoch: time.Second, Validity: 5 * time.Second, RegionLease: 5*time.Second - time.Millisecond}, testStart)
	if !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("a region lease a millisecond below the validity: %v, want ErrInvalid", err)
	}
}

// TestRemoveKeyOfAnUnknownKeyChangesNothing: removing a key that has no
// limit leaves every other key, its demand and its grants as they were.
func TestRemoveKeyOfAnUnknownKeyChangesNothing(t *testing.T) {
	a1, a2 := mustAllocator(t, threeRegions()), mustAllocator(t, threeRegions())
	keys := someKeys(t, a1, 4)
	someKeys(t, a2, 4)
	drive(t, a1, 11, 8, keys)
	drive(t, a2, 11, 8, keys)
	a1.RemoveKey(quota.Key{Tenant: "never", Class: "set"})
	if v1, v2 := a1.View(ms(8000)), a2.View(ms(8000)); !viewsEqual(v1, v2) || len(v1.Keys) != len(keys) {
		t.Fatalf("removing an unknown key changed the view: %d keys, want %d", len(v1.Keys), len(keys))
	}
	for ri, r := range []string{"a", "b", "c"} {
		var kds []KeyDemand
		for i, k := range keys {
			kds = append(kds, KeyDemand{Key: k, Admitted: float64(60 * (i + ri)), Window: time.Second})
		}
		rep := Report{Region: r, Seq: 1000, Keys: kds}
		g1, err1 := grantsOf(a1.Report(ms(8100+100*ri), rep))
		g2, err2 := grantsOf(a2.Report(ms(8100+100*ri), rep))
		if err1 != nil || err2 != nil || !reflect.DeepEqual(g1, g2) {
			t.Fatalf("%s's report after removing an unknown key: %+v, %v; want %+v, %v", r, g1, err1, g2, err2)
		}
	}
	a1.Allocate(ms(9000))
	a2.Allocate(ms(9000))
	if !reflect.DeepEqual(a1.View(ms(9000)), a2.View(ms(9000))) {
		t.Fatal("after removing an unknown key the allocator diverges")
	}
}

// TestSetRegionsGivesANewRegionItsFallbackTargets: a region added while
// keys are contended has its fallback (its static share) as its target in
// every one of them until the next allocation, and the kept regions keep
// their targets.
func TestSetRegionsGivesANewRegionItsFallbackTargets(t *testing.T) {
	a := mustAllocator(t, twoRegions())
	keys := []quota.Key{{Tenant: "k1", Class: "w"}, {Tenant: "k2", Class: "w"}, {Tenant: "k3", Class: "w"}}
	for i, k := range keys {
		if err := a.SetLimit(k, KeyLimit{Rate: 100 * float64(i+1), Burst: 40 * float64(i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	a.Allocate(ms(6000))
	for ri, r := range []string{"a", "b"} {
		var kds []KeyDemand
		for i, k := range keys {
			d := 150 * float64(i+1) // a wants 1.5 times the rate, b a tenth of it
			if r == "b" {
				d = 10 * float64(i+1)
			}
			kds = append(kds, KeyDemand{Key: k, Admitted: d, Window: time.Second})
		}
		if _, err := a.Report(ms(6100+100*ri), Report{Region: r, Seq: 1, Keys: kds}); err != nil {
			t.Fatal(err)
		}
	}
	a.Allocate(ms(7000))
	before := a.View(ms(7000))
	if len(before.Keys) != len(keys) {
		t.Fatalf("%d keys in view, want %d", len(before.Keys), len(keys))
	}
	for _, kv := range before.Keys {
		if !kv.Contended || kv.Regions[0].TargetRate <= kv.Regions[0].StaticRate {
			t.Fatalf("key %v before the reload: %+v, want it contended with a above its static rate", kv.Key, kv)
		}
	}
	if err := a.SetRegions([]Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 2}}); err != nil {
		t.Fatal(err)
	}
	after := a.View(ms(7000))
	for i, kv := range after.Keys {
		for ri := 0; ri < 2; ri++ {
			was, got := before.Keys[i].Regions[ri], kv.Regions[ri]
			if got.TargetRate != was.TargetRate || got.TargetBurst != was.TargetBurst {
				t.Errorf("key %v region %d: targets %v/%v after the reload, want them kept at %v/%v", kv.Key, ri, got.TargetRate, got.TargetBurst, was.TargetRate, was.TargetBurst)
			}
		}
		c := kv.Regions[2]
		if c.StaticRate != kv.Limit.Rate/2 || c.StaticBurst <= 0 || c.TargetRate != c.StaticRate || c.TargetBurst != c.StaticBurst {
			t.Errorf("key %v new region c: targets %v/%v, static %v/%v; want its static share, half the rate", kv.Key, c.TargetRate, c.TargetBurst, c.StaticRate, c.StaticBurst)
		}
	}
}

// TestStaticSharesShortByRoundingFreeNothing: what per-region static
// shares leave of the limit is headroom a grant may use, except up to
// 1e-9 of the limit, which is float rounding and frees nothing. Region b
// never reports (frozen at its static share 0); a's grant is its static
// share plus what is freed.
func TestStaticSharesShortByRoundingFreeNothing(t *testing.T) {
	const limit = 1e9 // 1e-9 of it is exactly 1
	for _, tc := range []struct {
		name               string
		shortRate, shortBy float64
		wantRate, wantBst  float64
	}{
		{"both short by exactly 1e-9 of the limit", 1, 1, limit - 1, limit - 1},
		{"both short by half that", 0.5, 0.5, limit - 0.5, limit - 0.5},
		{"both short by twice that", 2, 2, limit, limit},
		{"rate short by twice that, burst by exactly it", 2, 1, limit, limit - 1},
		{"burst short by twice that, rate by half it", 0.5, 2, limit - 0.5, limit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := KeyLimit{Rate: limit, Burst: limit, StaticRate: []float64{limit - tc.shortRate, 0}, StaticBurst: []float64{limit - tc.shortBy, 0}}
			s := newScript(t, twoRegions(), l)
			s.a.Allocate(s.at(6000))
			g := s.report("a", 6100, 2*limit, 0)
			if g == nil || g.Rate != tc.wantRate || g.Burst != tc.wantBst {
				t.Fatalf("a's grant %+v, want rate %v and burst %v", g, tc.wantRate, tc.wantBst)
			}
		})
	}
}

// TestBurstFreedWhereTheRatesFreeNothingIsHeadroom: what the static
// bursts leave of the limit is headroom for a grant's burst even when the
// static rates add up to the whole rate (nothing freed there), one token
// of burst included. b reports no demand, so a's targets are the whole
// limit; b has not acknowledged a smaller grant, so a gets its static
// rate 50 and burst 4, plus the 1 token the static bursts 4 and 5 leave
// of 10.
func TestBurstFreedWhereTheRatesFreeNothingIsHeadroom(t *testing.T) {
	l := KeyLimit{Rate: 100, Burst: 10, StaticRate: []float64{50, 50}, StaticBurst: []float64{4, 5}}
	s := newScript(t, twoRegions(), l)
	s.a.Allocate(s.at(6000))
	s.report("b", 6050, 0, 0)
	g := s.report("a", 6100, 200, 0)
	if g == nil || g.Rate != 50 || g.Burst != 5 {
		t.Fatalf("a's grant %+v, want rate 50 and burst 5 (its static 4 and the 1 the static bursts leave)", g)
	}
}

// TestAnEpochLongWindowWeighsExactlyAlpha: a report covering exactly one
// epoch moves the demand estimate by DemandAlpha of the difference, to
// the bit (1-(1-α)^1 may round differently).
func TestAnEpochLongWindowWeighsExactlyAlpha(t *testing.T) {
	a, err := NewAllocator(Options{Regions: twoRegions(), Epoch: time.Second, Validity: 5 * time.Second, DemandAlpha: 0.3}, testStart)
	if err != nil {
		t.Fatal(err)
	}
	key := quota.Key{Tenant: "k", Class: "w"}
	if err := a.SetLimit(key, KeyLimit{Rate: 1000, Burst: 10}); err != nil {
		t.Fatal(err)
	}
	for seq, admitted := range []float64{1, 4} {
		if _, err := a.Report(ms(1000*(seq+1)), Report{Region: "a", Seq: uint64(seq + 1), Keys: []KeyDemand{{Key: key, Admitted: admitted, Window: time.Second}}}); err != nil {
			t.Fatal(err)
		}
	}
	v := a.View(ms(2000))
	if len(v.Keys) != 1 || v.Keys[0].Regions[0].Demand != 1+0.3*(4-1) {
		t.Fatalf("demand after readings 1 and 4: %+v, want exactly %v", v.Keys, 1+0.3*(4-1))
	}
}

// targetRatesFor has each region report demands[i] (tokens/s, one
// reading each) for one key limited by l, then allocates, and returns the
// key's target rates and the view of it.
func targetRatesFor(t *testing.T, regions []Region, l KeyLimit, demands []float64) ([]float64, KeyView) {
	t.Helper()
	a := mustAllocator(t, regions)
	key := quota.Key{Tenant: "k", Class: "w"}
	if err := a.SetLimit(key, l); err != nil {
		t.Fatal(err)
	}
	a.Allocate(ms(6000))
	for i, r := range regions {
		rep := Report{Region: r.Name, Seq: 1, Keys: []KeyDemand{{Key: key, Admitted: demands[i], Window: time.Second}}}
		if _, err := a.Report(ms(6100+100*i), rep); err != nil {
			t.Fatal(err)
		}
	}
	a.Allocate(ms(7000))
	v := a.View(ms(7000))
	if len(v.Keys) != 1 || !v.Keys[0].Contended {
		t.Fatalf("view %+v, want the key contended", v.Keys)
	}
	var out []float64
	for _, rv := range v.Keys[0].Regions {
		out = append(out, rv.TargetRate)
	}
	return out, v.Keys[0]
}

// TestUnitWantRaisesTheFloorToTheStaticRate pins who gets a hair above
// its static rate (so that a grant can give it a unit) and who a hair
// below (so that it can give one away): only regions with demand above
// the unit floor (0.1% of the rate) count as wanting a unit, and a
// raised floor is taken only while the floors fit in the capacity,
// exactly filling it included.
func TestUnitWantRaisesTheFloorToTheStaticRate(t *testing.T) {
	const hair = 1e-9
	for _, tc := range []struct {
		name    string
		regions []Region
		l       KeyLimit
		demands []float64
		want    []float64
	}{
		{
			// a's demand is exactly the floor: it wants no unit and gets
			// what it demands; b takes the rest.
			name:    "demand at the unit floor is no want",
			regions: twoRegions(),
			l:       KeyLimit{Rate: 1000, Burst: 2, StaticBurst: []float64{0, 2}},
			demands: []float64{1, 2000},
			want:    []float64{1, 999},
		},
		{
			// Just above the floor a is raised a hair above its static
			// rate 500.
			name:    "demand above the unit floor is a want",
			regions: twoRegions(),
			l:       KeyLimit{Rate: 1000, Burst: 2, StaticBurst: []float64{0, 2}},
			demands: []float64{2, 2000},
			want:    []float64{500 * (1 + hair), 1000 - 500*(1+hair)},
		},
		{
			// Nobody wants a unit (a's demand is at the floor, drained c's
			// below it): b, with units and no demand, is not held below
			// its static rate 1000/3; past a's demand a and b fill evenly.
			name:    "no want holds nobody below its static rate",
			regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1, Drained: true}},
			l:       KeyLimit{Rate: 1000, Burst: 2, StaticBurst: []float64{0, 2, 0}},
			demands: []float64{1, 0, 0.5},
			want:    []float64{500.5, 499.5, 0},
		},
		{
			// b's floor and a's raised floor fill the capacity exactly.
			name:    "raised floors exactly filling the capacity",
			regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1, MinShare: 0.4999999995}},
			l:       KeyLimit{Rate: 1000, Burst: 2, StaticBurst: []float64{0, 2}},
			demands: []float64{2, 2000},
			want:    []float64{500 * (1 + hair), 1000 * 0.4999999995},
		},
		{
			// a's floor 90 is raised to its static rate 300 first, then
			// b's 0 to 300: 870 of 900 in floors (c's 270 included).
			name:    "two floors raised",
			regions: []Region{{Name: "a", Weight: 1, MinShare: 0.1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1, MinShare: 0.3}},
			l:       KeyLimit{Rate: 900, Burst: 3, StaticBurst: []float64{0, 0, 3}},
			demands: []float64{2, 2, 5000},
			want:    []float64{300 * (1 + hair), 300 * (1 + hair), 900 - 600*(1+hair)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, kv := targetRatesFor(t, tc.regions, tc.l, tc.demands)
			for i := range got {
				if !near(got[i], tc.want[i]) {
					t.Fatalf("target rates %v, want %v (view %+v)", got, tc.want, kv.Regions)
				}
			}
		})
	}
}

// TestUnitsGoWhereTheDemandIs pins the burst split's units at the demand
// edges and the donor rounds: a region whose demand is exactly the unit
// floor (0.1% of the rate) is served no unit before the largest
// remainder, and keeps none from a region that wants one; a region with
// units and demand at the floor, which is none, is held a hair below its
// static rate so it can give them away; when regions gaining rate are
// left without a unit, one donor after another is held a hair below its
// static rate while the others can take the rest of the capacity.
func TestUnitsGoWhereTheDemandIs(t *testing.T) {
	const hair = 1e-9
	for _, tc := range []struct {
		name          string
		regions       []Region
		l             KeyLimit
		demands       []float64
		rates, bursts []float64
	}{
		{
			// a's demand is exactly the floor: the unit left after d's
			// first goes by remainder, to d, not to a as to a region with
			// demand and no unit.
			name:    "demand at the unit floor is served no unit",
			regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "d", Weight: 1}},
			l:       KeyLimit{Rate: 1000, Burst: 2, StaticBurst: []float64{1, 1, 0}},
			demands: []float64{1, 0, 5000},
			rates:   []float64{1, 0, 999},
			bursts:  []float64{0, 0, 2},
		},
		{
			// b's demand is exactly the floor, which is none: it is held
			// a hair below its static rate 600, and c, with room below its
			// ceiling, takes the rest; a, at its static rate 200 (its
			// ceiling), cannot receive a unit.
			name:    "demand at the unit floor gives its units away",
			regions: []Region{{Name: "a", Weight: 1, MaxShare: 0.2}, {Name: "b", Weight: 3}, {Name: "c", Weight: 1}},
			l:       KeyLimit{Rate: 1000, Burst: 2, StaticBurst: []float64{0, 2, 0}},
			demands: []float64{2, 1, 0},
			rates:   []float64{200, 600 * (1 - hair), 200 + 600*hair},
			bursts:  []float64{0, 1, 1},
		},
		{
			// Drained e frees its share: c and d gain rate past their
			// static 200 and keep their units; a and b, raised a hair
			// above theirs, have none. c is held below its static rate
			// first, then d, each giving a unit; the others' ceilings of
			// 400 still take the capacity.
			name: "two donor rounds",
			regions: []Region{{Name: "a", Weight: 1, MaxShare: 0.4}, {Name: "b", Weight: 1, MaxShare: 0.4},
				{Name: "c", Weight: 1, MaxShare: 0.4}, {Name: "d", Weight: 1, MaxShare: 0.4}, {Name: "e", Weight: 1, Drained: true}},
			l:       KeyLimit{Rate: 1000, Burst: 4, StaticBurst: []float64{0, 0, 2, 2, 0}},
			demands: []float64{2, 2, 1000, 1000, 0},
			rates:   []float64{300 + 200*hair, 300 + 200*hair, 200 * (1 - hair), 200 * (1 - hair), 0},
			bursts:  []float64{1, 1, 1, 1, 0},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, kv := targetRatesFor(t, tc.regions, tc.l, tc.demands)
			for i := range got {
				if rv := kv.Regions[i]; !near(got[i], tc.rates[i]) || rv.TargetBurst != tc.bursts[i] {
					t.Fatalf("region %d: target %v/%v, want %v/%v (view %+v)", i, got[i], rv.TargetBurst, tc.rates[i], tc.bursts[i], kv.Regions)
				}
			}
		})
	}
}

// TestUnitDonorPrefersMoreUnitsToSpare: a later region with more units
// to spare is the donor even when it gives up more rate.
func TestUnitDonorPrefersMoreUnitsToSpare(t *testing.T) {
	a := mustAllocator(t, []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}})
	l := &KeyLimit{Rate: 1000, Burst: 10, Unit: 1}
	a.role = []int8{1, 0, 1}
	a.sbs = []float64{0, 2, 3}
	a.dem = []float64{50, 0, 0}
	a.bout = []float64{0, 2, 3}
	a.lo = []float64{0, 0, 0}
	a.hi = []float64{1000, 1000, 1000}
	a.sts = []float64{100, 100, 100}
	a.out = []float64{650, 100, 250}
	if c, to := a.unitDonor(l, 3, 1000, 3000); c != 2 || to != 100*(1-1e-9) {
		t.Fatalf("donor %d capped to %v, want c (three units to spare, b two) capped to %v", c, to, 100*(1-1e-9))
	}
}

// TestAcknowledgingLessThanTheRoundingFreesNothing: an acknowledgement
// that lowers what a region is counted at by no more than 1e-9 of the
// limit frees nothing and nudges no waiting region (here c's demand
// estimate, and with it its target, fell by exactly 1 of 1e9 tokens/s,
// and its burst by one whole unit, 1 of 1e9); one that lowers it by more
// does.
func TestAcknowledgingLessThanTheRoundingFreesNothing(t *testing.T) {
	regions := []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}}
	s := newScript(t, regions, KeyLimit{Rate: 1e9, Burst: 1e9})
	s.a.Allocate(s.at(6000))
	s.report("a", 6100, 2e9, -1)
	s.report("b", 6200, 1e8, -1)
	c1 := s.report("c", 6250, 3e8, -1)
	if c1 == nil || !near(c1.Rate, 3e8) {
		t.Fatalf("c's first grant %+v, want 3e8", c1)
	}
	s.report("a", 6300, 2e9, -1)
	s.takesNudges("a is short for want of b's and c's acknowledgements", "b", "c")
	c2 := s.report("c", 6310, 3e8-2, -1)
	s.takesNudges("c acknowledged its smaller grant", "a")
	if c2 == nil || c1.Rate-c2.Rate != 1 || c1.Burst-c2.Burst != 1 {
		t.Fatalf("c's grant after its demand estimate fell by 1: %+v, want both 1 below %v/%v", c2, c1.Rate, c1.Burst)
	}
	c3 := s.report("c", 6320, 3e8-2, -1)
	if c3 == nil || c3.Rate > c2.Rate {
		t.Fatalf("c's grant %+v, want at most %v", c3, c2.Rate)
	}
	s.takesNudges("c acknowledged a grant 1 below the one before")
}

// TestEveryGrantOfAnAnswerTakesTheReportsSendTimeBound: a report's send
// time is bounded below by the answer time of any grant it acknowledges,
// whichever key it is listed under; every grant answering it expires no
// earlier than that bound plus its validity, on the region's clock, the
// grants for keys listed before the acknowledging one included.
func TestEveryGrantOfAnAnswerTakesTheReportsSendTimeBound(t *testing.T) {
	a := mustAllocator(t, twoRegions())
	x, y := quota.Key{Tenant: "x", Class: "w"}, quota.Key{Tenant: "y", Class: "w"}
	for _, k := range []quota.Key{x, y} {
		if err := a.SetLimit(k, KeyLimit{Rate: 100, Burst: 100}); err != nil {
			t.Fatal(err)
		}
	}
	a.Allocate(ms(6000))
	// y is made contended first (fencing block 0), then x.
	if _, err := a.Report(ms(6100), Report{Region: "a", Seq: 1, Keys: []KeyDemand{{Key: y, Admitted: 150, Window: time.Second}}}); err != nil {
		t.Fatal(err)
	}
	ans, err := a.Report(ms(6200), Report{Region: "a", Seq: 2, Keys: []KeyDemand{{Key: x, Admitted: 150, Window: time.Second}}})
	if err != nil || len(ans.Grants) != 2 || ans.Grants[1].Key != y {
		t.Fatalf("answer at 6.2s: %+v, %v; want grants for x and y", ans, err)
	}
	gy := ans.Grants[1]
	// x is listed first and acknowledges nothing; y acknowledges the grant
	// answered at 6.2s, 100ms before.
	ans, err = a.Report(ms(6300), Report{Region: "a", Seq: 3, Keys: []KeyDemand{
		{Key: x, Admitted: 150, Window: time.Second},
		{Key: y, Admitted: 150, Window: time.Second, HeldRate: gy.Rate, HeldBurst: gy.Burst, HeldValid: gy.Valid - 100*time.Millisecond},
	}})
	if err != nil || len(ans.Grants) != 2 || ans.Grants[0].Key != x {
		t.Fatalf("answer at 6.3s: %+v, %v; want grants for x and y", ans, err)
	}
	f := &a.fences[0][a.blockOf[a.keyIndex[x]]]
	rec := f.recs[f.n-1]
	if want := int64(6200*time.Millisecond + ans.Grants[0].Valid); rec.at != int64(6300*time.Millisecond) || rec.le != want {
		t.Fatalf("x's grant at 6.3s: answered at %v, expiry bounded below by %v; want by %v", time.Duration(rec.at), time.Duration(rec.le), time.Duration(want))
	}
}

// TestUnitDonorShortOfAUnitBeyondTheRounding: a region holding a unit
// less 1e-12 of one holds it (rounding); one holding a unit less 5e-12 of
// one is short of it and gets a donor.
func TestUnitDonorShortOfAUnitBeyondTheRounding(t *testing.T) {
	for _, tc := range []struct {
		held float64
		want int
	}{
		{1 - 1e-12, -1},
		{1 - 5e-12, 1},
	} {
		a := mustAllocator(t, []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}})
		l := &KeyLimit{Rate: 1000, Burst: 10, Unit: 1}
		a.role = []int8{1, 0, 1}
		a.sbs = []float64{0, 2, 2}
		a.dem = []float64{50, 0, 0}
		a.bout = []float64{tc.held, 2, 2}
		a.lo = []float64{0, 0, 0}
		a.hi = []float64{1000, 1000, 1000}
		a.sts = []float64{100, 100, 100}
		a.out = []float64{750, 100, 150}
		if c, _ := a.unitDonor(l, 3, 1000, 3000); c != tc.want {
			t.Errorf("a holding %v of a unit: donor %d, want %d", tc.held, c, tc.want)
		}
	}
}

// TestReportAgainIsAThirdOfATinyEpochAtLeastAMillisecond: an early
// report is asked for a third of an epoch later in whole milliseconds,
// and never sooner than a millisecond: 1ms for epochs of 1ms and 3ms, 2ms
// for one of 6ms.
func TestReportAgainIsAThirdOfATinyEpochAtLeastAMillisecond(t *testing.T) {
	for _, tc := range []struct {
		epoch, want time.Duration
	}{
		{time.Millisecond, time.Millisecond},
		{3 * time.Millisecond, time.Millisecond},
		{6 * time.Millisecond, 2 * time.Millisecond},
	} {
		e := tc.epoch
		a, err := NewAllocator(Options{Regions: twoRegions(), Epoch: e, Validity: 5 * e}, testStart)
		if err != nil {
			t.Fatal(err)
		}
		key := quota.Key{Tenant: "k", Class: "w"}
		if err := a.SetLimit(key, KeyLimit{Rate: 100000, Burst: 100000}); err != nil {
			t.Fatal(err)
		}
		at := func(epochs float64) time.Time { return testStart.Add(time.Duration(epochs * float64(e))) }
		a.Allocate(at(6))
		report := func(region string, seq uint64, when, demand float64) {
			t.Helper()
			if _, err := a.Report(at(when), Report{Region: region, Seq: seq, Keys: []KeyDemand{{Key: key, Admitted: demand * e.Seconds(), Window: e}}}); err != nil {
				t.Fatal(err)
			}
		}
		// a wants all of it, b a tenth; a's second answer falls short of
		// its target 90000 until b acknowledges its smaller grant.
		report("a", 1, 6.1, 200000)
		report("b", 1, 6.2, 10000)
		report("a", 2, 6.3, 200000)
		if got := a.ReportAgain("a"); got != tc.want {
			t.Errorf("epoch %v: ReportAgain(a) = %v, want %v", e, got, tc.want)
		}
	}
}

// TestWindowJustUnderHalfAnEpochIsNoObservation: a report whose window
// is a nanosecond short of half an epoch leaves the demand estimate as it
// was (see TestDemandEstimate for exactly half an epoch).
func TestWindowJustUnderHalfAnEpochIsNoObservation(t *testing.T) {
	a := mustAllocator(t, twoRegions()) // 1s epoch
	key := quota.Key{Tenant: "k", Class: "w"}
	if err := a.SetLimit(key, KeyLimit{Rate: 1000, Burst: 10}); err != nil {
		t.Fatal(err)
	}
	for seq, kd := range []KeyDemand{
		{Key: key, Admitted: 80, Window: time.Second},
		{Key: key, Admitted: 0, Window: 500*time.Millisecond - 1},
		{Key: key, Admitted: 0, Window: 400 * time.Millisecond},
	} {
		if _, err := a.Report(ms(1000*(seq+1)), Report{Region: "a", Seq: uint64(seq + 1), Keys: []KeyDemand{kd}}); err != nil {
			t.Fatal(err)
		}
		if v := a.View(ms(1000 * (seq + 1))); len(v.Keys) != 1 || v.Keys[0].Regions[0].Demand != 80 {
			t.Fatalf("after a window of %v: %+v, want the demand 80 unchanged", kd.Window, v.Keys)
		}
	}
}

// TestShortGrantSafeForgivesOnlyLastBits: a short grant's earlier
// fallback is safe when the static share fits the headroom there up to
// 1e-12 of it (rounding), not when it is 5e-12 of it short, for the rate
// and for the burst.
func TestShortGrantSafeForgivesOnlyLastBits(t *testing.T) {
	a := mustAllocator(t, twoRegions()) // shortest validity 1s
	const sec = int64(time.Second)
	for _, tc := range []struct {
		name       string
		rate, bst  float64 // the headroom when the grant would end, static 100 and 10
		wantSafety bool
	}{
		{"both fit", 100, 10, true},
		{"rate short by 5e-13 of it", 100 * (1 - 5e-13), 10, true},
		{"rate short by 5e-12 of it", 100 * (1 - 5e-12), 10, false},
		{"burst short by 5e-13 of it", 100, 10 * (1 - 5e-13), true},
		{"burst short by 5e-12 of it", 100, 10 * (1 - 5e-12), false},
	} {
		a.rateLane.reset(100)
		a.burstLane.reset(10)
		a.rateLane.base, a.burstLane.base = tc.rate, tc.bst
		// A 1s grant answered at 0 for a report sent at 0: the region may
		// fall back at 1s instead of 2s.
		if got := a.fallbackSafe(0, sec, 0, 2*sec, 0, 0); got != tc.wantSafety {
			t.Errorf("%s: safe %v, want %v", tc.name, got, tc.wantSafety)
		}
	}
}

// TestCompactionEdges: key slots are renumbered only from compactMin
// (1024) of them on, once fewer than a quarter are in use; fencing blocks
// once fewer than a quarter of them are (of 12 blocks: at 2 in use, not
// at 3).
func TestCompactionEdges(t *testing.T) {
	for _, n := range []int{1023, 1024} {
		a := mustAllocator(t, twoRegions())
		keys := noiseKeys(n)
		for _, k := range keys {
			if err := a.SetLimit(k, KeyLimit{Rate: 10, Burst: 10}); err != nil {
				t.Fatal(err)
			}
		}
		// A quarter in use keeps the slots; one fewer renumbers them, from
		// 1024 slots on.
		for _, k := range keys[:n-n/4] {
			a.RemoveKey(k)
		}
		if got := len(a.keys); got != n {
			t.Fatalf("%d keys, %d left: %d slots, want %d", n, n/4, got, n)
		}
		a.RemoveKey(keys[n-n/4])
		want := n
		if n >= 1024 {
			want = n/4 - 1
		}
		if got := len(a.keys); got != want {
			t.Fatalf("%d keys, %d left: %d slots, want %d", n, n/4-1, got, want)
		}
	}

	setCompactMin(t, 12)
	a, keys := contendedKeys(t, 12)
	for i, k := range keys[:11] {
		a.RemoveKey(k)
		live, want := 11-i, 12
		if live < 3 {
			want = 2 // renumbered at 2 in use, then below compactMin
		}
		if len(a.blockKey) != want {
			t.Fatalf("12 blocks, %d in use: %d blocks, want %d", live, len(a.blockKey), want)
		}
	}
}

// TestAllocateGivesFreedBlocksBack: fencing blocks that Allocate frees,
// once no region may hold a grant for their keys, are renumbered there
// and then, not at the next RemoveKey.
func TestAllocateGivesFreedBlocksBack(t *testing.T) {
	setCompactMin(t, 8)
	a, _ := contendedKeys(t, 8)
	if len(a.blockKey) != 8 {
		t.Fatalf("%d blocks, want one for each of the 8 keys", len(a.blockKey))
	}
	// Both regions fall silent; their grants expire by 12s.
	a.Allocate(ms(20000))
	if v := a.View(ms(20000)); countActive(v) != 0 || len(a.blockKey) != 0 {
		t.Fatalf("after every grant expired: %d active keys, %d blocks; want none", countActive(v), len(a.blockKey))
	}
}

// TestHoldingFallingBeyondTheRoundingFreesBurst: a region that holds more
// tokens than its new cap is counted at what it holds; when a report
// shows it holding 5 tokens fewer (of a 1e9 burst: above 1e-9 of it,
// below 1e-8), that frees burst and the waiting region is nudged, though
// its rate did not move.
func TestHoldingFallingBeyondTheRoundingFreesBurst(t *testing.T) {
	regions := []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}}
	s := newScript(t, regions, KeyLimit{Rate: 1e9, Burst: 1e9})
	s.a.Allocate(s.at(6000))
	s.report("a", 6100, 2e9, -1)
	s.report("b", 6200, 1e8, -1)
	if c1 := s.report("c", 6250, 3e8, -1); c1 == nil || !near(c1.Burst, 3e8) {
		t.Fatalf("c's first grant %+v, want a burst of 3e8", c1)
	}
	s.report("a", 6300, 2e9, -1)
	s.takesNudges("a is short for want of b's and c's acknowledgements", "b", "c")
	// c acknowledges its 3e8 cap still holding 3.2e8 tokens.
	s.report("c", 6310, 3e8, 3.2e8)
	s.takesNudges("c acknowledged its smaller grant", "a")
	s.report("c", 6320, 3e8, 3.2e8-5)
	s.takesNudges("c holds 5 tokens fewer", "a")
}

// TestReportNumbersAtTheirBounds: every count a report carries may be any
// finite number >= 0, the largest float and a negative zero included, and
// is refused a step beyond: +Inf, NaN, or the smallest negative float.
// (The key has no limit: the report is validated, then the key skipped.)
func TestReportNumbersAtTheirBounds(t *testing.T) {
	fields := []struct {
		name string
		set  func(kd *KeyDemand, v float64)
	}{
		{"admitted", func(kd *KeyDemand, v float64) { kd.Admitted = v }},
		{"denied", func(kd *KeyDemand, v float64) { kd.Denied = v }},
		{"held rate", func(kd *KeyDemand, v float64) { kd.HeldRate = v }},
		{"held burst", func(kd *KeyDemand, v float64) { kd.HeldBurst = v }},
		{"holding", func(kd *KeyDemand, v float64) { kd.Holding = v }},
	}
	for _, f := range fields {
		for _, tc := range []struct {
			v  float64
			ok bool
		}{
			{math.MaxFloat64, true},
			{math.Copysign(0, -1), true},
			{math.SmallestNonzeroFloat64, true},
			{math.Inf(1), false},
			{math.NaN(), false},
			{-math.SmallestNonzeroFloat64, false},
			{math.Inf(-1), false},
		} {
			a := mustAllocator(t, twoRegions())
			kd := KeyDemand{Key: quota.Key{Tenant: "nolimit", Class: "w"}, Window: time.Second}
			f.set(&kd, tc.v)
			_, err := a.Report(ms(100), Report{Region: "a", Seq: 1, Keys: []KeyDemand{kd}})
			if tc.ok && err != nil {
				t.Errorf("%s %v: %v, want it accepted", f.name, tc.v, err)
			}
			if !tc.ok && !errors.Is(err, quota.ErrInvalid) {
				t.Errorf("%s %v: %v, want ErrInvalid", f.name, tc.v, err)
			}
		}
	}
}

// TestReportAfterRegionsShrinkAndGrowBack: a region removed from the config
// and added back, with a report arriving between the change and the next
// allocation, is answered (the epoch at one region had left the demand
// buffer one region long, and the report read past it: a panic in the
// global leader, and in every replica that led after it).
func TestReportAfterRegionsShrinkAndGrowBack(t *testing.T) {
	a := mustAllocator(t, twoRegions())
	key := quota.Key{Tenant: "k", Class: "w"}
	if err := a.SetLimit(key, KeyLimit{Rate: 100, Burst: 100}); err != nil {
		t.Fatal(err)
	}
	report := func(at int, region string, seq uint64, demand float64) {
		t.Helper()
		if _, err := a.Report(ms(at), Report{Region: region, Seq: seq, Keys: []KeyDemand{{Key: key, Admitted: demand, Window: time.Second}}}); err != nil {
			t.Fatalf("%s's report at %dms: %v", region, at, err)
		}
	}
	a.Allocate(ms(6000))
	report(6100, "a", 1, 150)
	report(6200, "b", 1, 150)
	a.Allocate(ms(7000))
	if err := a.SetRegions([]Region{{Name: "a", Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	a.Allocate(ms(8000))
	if err := a.SetRegions(twoRegions()); err != nil {
		t.Fatal(err)
	}
	report(8100, "a", 2, 150)
	report(8200, "b", 1, 150)
	a.Allocate(ms(9000))
	report(9100, "a", 3, 150)
}

// TestReusedKeySlotStartsWithoutDemandHistory: a key added into the slot
// of a removed one inherits none of its demand history. It is not in the
// View before any region names it, and its first reading is its estimate
// as is, as for a key never seen (with DemandAlpha 0.5, a reading folded
// into a history of zero would show half of it).
func TestReusedKeySlotStartsWithoutDemandHistory(t *testing.T) {
	a, err := NewAllocator(Options{Regions: twoRegions(), Epoch: time.Second, Validity: 5 * time.Second, DemandAlpha: 0.5}, testStart)
	if err != nil {
		t.Fatal(err)
	}
	at := func(ms int) time.Time { return testStart.Add(time.Duration(ms) * time.Millisecond) }
	old, reused := quota.Key{Tenant: "acme", Class: "old"}, quota.Key{Tenant: "acme", Class: "new"}
	limit := KeyLimit{Rate: 100, Burst: 100}
	if err := a.SetLimit(old, limit); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Report(at(100), Report{Region: "a", Seq: 1, Keys: []KeyDemand{{Key: old, Admitted: 40, Window: time.Second}}}); err != nil {
		t.Fatal(err)
	}
	a.RemoveKey(old)
	if err := a.SetLimit(reused, limit); err != nil {
		t.Fatal(err)
	}
	if k := a.keyIndex[reused]; len(a.keys) != 1 || k != 0 {
		t.Fatalf("the new key took slot %d of %d, want the removed key's slot 0", k, len(a.keys))
	}
	if v := a.View(at(200)); len(v.Keys) != 0 {
		t.Fatalf("View lists %+v before any region named the new key, want nothing", v.Keys)
	}
	if _, err := a.Report(at(1100), Report{Region: "a", Seq: 2, Keys: []KeyDemand{{Key: reused, Admitted: 30, Window: time.Second}}}); err != nil {
		t.Fatal(err)
	}
	v := a.View(at(1200))
	if len(v.Keys) != 1 || v.Keys[0].Key != reused {
		t.Fatalf("View lists %+v, want the new key", v.Keys)
	}
	if got := v.Keys[0].Regions[0].Demand; got != 30 {
		t.Fatalf("a's demand for the new key %v after one reading of 30/s, want 30", got)
	}
}
