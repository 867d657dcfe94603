package hierarchy

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

var testStart = time.Unix(1_700_000_000, 0)

func ms(n int) time.Time { return testStart.Add(time.Duration(n) * time.Millisecond) }

func twoRegions() []Region { return []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}} }

func mustAllocator(t *testing.T, regions []Region) *Allocator {
	t.Helper()
	a, err := NewAllocator(Options{Regions: regions, Epoch: time.Second, Validity: 5 * time.Second}, testStart)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestNewAllocatorValidatesOptions(t *testing.T) {
	good := Options{Regions: twoRegions(), Epoch: time.Second, Validity: 5 * time.Second}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no regions", func(o *Options) { o.Regions = nil }, "no regions"},
		{"zero epoch", func(o *Options) { o.Epoch = 0 }, "epoch"},
		{"validity below epoch", func(o *Options) { o.Validity = 500 * time.Millisecond }, "validity"},
		{"negative silence", func(o *Options) { o.SilenceTimeout = -time.Second }, "silence"},
		{"alpha above one", func(o *Options) { o.DemandAlpha = 1.5 }, "alpha"},
		{"NaN alpha", func(o *Options) { o.DemandAlpha = math.NaN() }, "alpha"},
		{"bad region weight", func(o *Options) { o.Regions = []Region{{Name: "a", Weight: -1}} }, "weight"},
		{"negative prior validity", func(o *Options) { o.PriorValidity = -time.Millisecond }, "prior validity"},
		{"prior validity of -1ns", func(o *Options) { o.PriorValidity = -1 }, "prior validity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.edit(&o)
			_, err := NewAllocator(o, testStart)
			if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

func TestSetLimitValidates(t *testing.T) {
	a := mustAllocator(t, twoRegions())
	for _, tc := range []struct {
		key quota.Key
		l   KeyLimit
	}{
		{quota.Key{Tenant: "", Class: "w"}, KeyLimit{Rate: 1, Burst: 1}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: 0, Burst: 1}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: math.Inf(1), Burst: 1}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: 1, Burst: math.NaN()}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: 1, Burst: 0}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: 1, Burst: 1, Unit: -1}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: 1, Burst: 1, FloorShare: -0.1}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: 1, Burst: 1, FloorShare: 1.5}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: 1, Burst: 1, FloorShare: math.NaN()}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: 1, Burst: 1, StaticRate: []float64{1}}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: 1, Burst: 1, FloorBurst: []float64{1, -1}}},
		{quota.Key{Tenant: "t", Class: "w"}, KeyLimit{Rate: 1, Burst: 1, StaticBurst: []float64{1, math.Inf(1)}}},
	} {
		if err := a.SetLimit(tc.key, tc.l); !errors.Is(err, quota.ErrInvalid) {
			t.Errorf("SetLimit(%v, %+v) = %v, want ErrInvalid", tc.key, tc.l, err)
		}
	}
	if v := a.View(ms(0)); len(v.Keys) != 0 {
		t.Fatalf("rejected limits left keys behind: %+v", v.Keys)
	}
	// The bounds themselves are valid: a floor share of 0 and 1, static
	// and floor shares of 0.
	for _, l := range []KeyLimit{
		{Rate: 1, Burst: 1, FloorShare: 1},
		{Rate: 1, Burst: 1, StaticRate: []float64{0, 1}, StaticBurst: []float64{1, 0}, FloorRate: []float64{0, 0}, FloorBurst: []float64{0, 0}},
	} {
		if err := a.SetLimit(quota.Key{Tenant: "t", Class: "w"}, l); err != nil {
			t.Errorf("SetLimit(%+v) = %v, want it accepted", l, err)
		}
	}
}

// TestNewAllocatorAcceptsTheBounds: an epoch of exactly 1ms, a validity
// of exactly one epoch, a region lease of exactly the validity and a
// demand alpha of exactly 1 are valid.
func TestNewAllocatorAcceptsTheBounds(t *testing.T) {
	a, err := NewAllocator(Options{Regions: twoRegions(), Epoch: time.Millisecond, Validity: time.Millisecond, RegionLease: time.Millisecond, DemandAlpha: 1}, testStart)
	if err != nil {
		t.Fatalf("NewAllocator at the bounds: %v", err)
	}
	if a.RegionLease() != time.Millisecond || a.Learning(testStart.Add(time.Millisecond)) {
		t.Fatalf("region lease %v, learning after 1ms %v; want 1ms, false", a.RegionLease(), a.Learning(testStart.Add(time.Millisecond)))
	}
}

// drive runs a pseudo-random but seeded workload and returns every answer
// and the final view.
func drive(t *testing.T, a *Allocator, seed uint64, epochs int, keys []quota.Key) ([][]Grant, View) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	regions := []string{"a", "b", "c"}
	seq := map[string]uint64{}
	held := map[string]map[quota.Key]Grant{}
	heldAt := map[string]map[quota.Key]time.Time{}
	var answers [][]Grant
	for e := 0; e < epochs; e++ {
		now := ms(1000 * e)
		a.Allocate(now)
		for ri, r := range regions {
			if rng.IntN(6) == 0 {
				continue // silent this epoch
			}
			sent := now.Add(time.Duration(10*(ri+1)) * time.Millisecond)
			rep := Report{Region: r, Seq: seq[r] + 1}
			seq[r]++
			for _, k := range keys {
				kd := KeyDemand{Key: k, Admitted: float64(rng.IntN(120)), Denied: float64(rng.IntN(40)), Window: time.Second, Holding: float64(rng.IntN(30))}
				if g, ok := held[r][k]; ok {
					if left := heldAt[r][k].Add(g.Valid).Sub(sent); left > 0 {
						kd.HeldRate, kd.HeldBurst, kd.HeldValid = g.Rate, g.Burst, left.Truncate(time.Millisecond)
					}
				}
				rep.Keys = append(rep.Keys, kd)
			}
			grants, err := grantsOf(a.Report(sent, rep))
			if err != nil {
				t.Fatalf("report: %v", err)
			}
			answers = append(answers, append([]Grant(nil), grants...))
			if rng.IntN(5) == 0 {
				continue // answer lost
			}
			if held[r] == nil {
				held[r], heldAt[r] = map[quota.Key]Grant{}, map[quota.Key]time.Time{}
			}
			for _, g := range grants {
				held[r][g.Key], heldAt[r][g.Key] = g, sent
			}
		}
	}
	return answers, a.View(ms(1000 * epochs))
}

func threeRegions() []Region {
	return []Region{{Name: "a", Weight: 2}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1, MinShare: 0.1}}
}

func someKeys(t *testing.T, a *Allocator, n int) []quota.Key {
	t.Helper()
	var keys []quota.Key
	for i := 0; i < n; i++ {
		k := quota.Key{Tenant: fmt.Sprintf("t%02d", (i*7)%n), Class: "write"}
		keys = append(keys, k)
		if err := a.SetLimit(k, KeyLimit{Rate: 100 + float64(i), Burst: 50}); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func TestDeterministic(t *testing.T) {
	run := func() ([][]Grant, View) {
		a := mustAllocator(t, threeRegions())
		return drive(t, a, 42, 40, someKeys(t, a, 20))
	}
	ans1, v1 := run()
	ans2, v2 := run()
	if !reflect.DeepEqual(ans1, ans2) || !reflect.DeepEqual(v1, v2) {
		t.Fatal("two runs of the same calls gave different results")
	}
	grants := 0
	for _, a := range ans1 {
		grants += len(a)
	}
	if grants == 0 {
		t.Fatal("the workload never produced a grant; the test would prove nothing")
	}
	for i := 1; i < len(v1.Keys); i++ {
		p, k := v1.Keys[i-1].Key, v1.Keys[i].Key
		if p.Tenant > k.Tenant || (p.Tenant == k.Tenant && p.Class >= k.Class) {
			t.Fatalf("view keys not sorted: %v before %v", p, k)
		}
	}
}

func TestBadReportChangesNothing(t *testing.T) {
	key := quota.Key{Tenant: "t00", Class: "write"}
	bad := []struct {
		name string
		rep  Report
		want error
	}{
		{"unknown region", Report{Region: "zz", Seq: 100, Keys: []KeyDemand{{Key: key, Window: time.Second}}}, quota.ErrInvalid},
		{"negative admitted", Report{Region: "a", Seq: 100, Keys: []KeyDemand{{Key: key, Admitted: -1, Window: time.Second}}}, quota.ErrInvalid},
		{"NaN denied", Report{Region: "a", Seq: 100, Keys: []KeyDemand{{Key: key, Denied: math.NaN(), Window: time.Second}}}, quota.ErrInvalid},
		{"zero window", Report{Region: "a", Seq: 100, Keys: []KeyDemand{{Key: key}}}, quota.ErrInvalid},
		{"negative held rate", Report{Region: "a", Seq: 100, Keys: []KeyDemand{{Key: key, Window: time.Second, HeldRate: -1}}}, quota.ErrInvalid},
		{"infinite held burst", Report{Region: "a", Seq: 100, Keys: []KeyDemand{{Key: key, Window: time.Second, HeldBurst: math.Inf(1)}}}, quota.ErrInvalid},
		{"negative held valid", Report{Region: "a", Seq: 100, Keys: []KeyDemand{{Key: key, Window: time.Second, HeldValid: -time.Second}}}, quota.ErrInvalid},
		{"NaN holding", Report{Region: "a", Seq: 100, Keys: []KeyDemand{{Key: key, Window: time.Second, Holding: math.NaN()}}}, quota.ErrInvalid},
		{"bad key", Report{Region: "a", Seq: 100, Keys: []KeyDemand{{Key: key, Window: time.Second}, {Key: quota.Key{Tenant: "x y", Class: "w"}, Window: time.Second}}}, quota.ErrInvalid},
		{"duplicate key", Report{Region: "a", Seq: 100, Keys: []KeyDemand{{Key: key, Window: time.Second, Admitted: 5}, {Key: key, Window: time.Second}}}, quota.ErrInvalid},
		{"duplicate unknown key", Report{Region: "a", Seq: 100, Keys: []KeyDemand{{Key: quota.Key{Tenant: "nobody", Class: "w"}, Window: time.Second}, {Key: quota.Key{Tenant: "nobody", Class: "w"}, Window: time.Second}}}, quota.ErrInvalid},
		{"stale seq", Report{Region: "a", Seq: 1, Keys: []KeyDemand{{Key: key, Window: time.Second}}}, ErrStaleReport},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			// Two allocators see the same history; one also gets the bad
			// report. They must stay indistinguishable.
			a1, a2 := mustAllocator(t, threeRegions()), mustAllocator(t, threeRegions())
			k1, _ := someKeys(t, a1, 10), someKeys(t, a2, 10)
			drive(t, a1, 7, 12, k1)
			drive(t, a2, 7, 12, k1)
			before := a1.View(ms(12_500))
			if _, err := a1.Report(ms(12_500), tc.rep); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			} else if !strings.Contains(err.Error(), "hierarchy") {
				t.Fatalf("error %q lacks context", err)
			}
			if !reflect.DeepEqual(before, a1.View(ms(12_500))) {
				t.Fatal("the refused report changed the view")
			}
			// Same future on both.
			good := Report{Region: "a", Seq: 1000, Keys: []KeyDemand{{Key: key, Admitted: 300, Window: time.Second}}}
			g1, err1 := grantsOf(a1.Report(ms(12_600), good))
			g2, err2 := grantsOf(a2.Report(ms(12_600), good))
			if err1 != nil || err2 != nil || !reflect.DeepEqual(g1, g2) {
				t.Fatalf("after a refused report the allocator answers differently: %v %v / %v %v", g1, err1, g2, err2)
			}
			a1.Allocate(ms(13_000))
			a2.Allocate(ms(13_000))
			if !reflect.DeepEqual(a1.View(ms(13_000)), a2.View(ms(13_000))) {
				t.Fatal("after a refused report the allocator diverges")
			}
		})
	}
}

func TestUnknownKeysAreSkippedAndShown(t *testing.T) {
	a := mustAllocator(t, twoRegions())
	known := quota.Key{Tenant: "known", Class: "read"}
	if err := a.SetLimit(known, KeyLimit{Rate: 10, Burst: 10}); err != nil {
		t.Fatal(err)
	}
	var kds []KeyDemand
	for i := 0; i < maxUnknownShown+4; i++ {
		// Classes run the other way from tenants: the order is by tenant
		// first.
		kds = append(kds, KeyDemand{Key: quota.Key{Tenant: fmt.Sprintf("u%02d", 30-i), Class: fmt.Sprintf("c%02d", i)}, Admitted: 1, Window: time.Second})
	}
	kds = append(kds, KeyDemand{Key: known, Admitted: 4, Window: time.Second})
	if _, err := a.Report(ms(100), Report{Region: "a", Seq: 1, Keys: kds}); err != nil {
		t.Fatal(err)
	}
	v := a.View(ms(100))
	ra := v.Regions[0]
	if ra.UnknownKeyCount != maxUnknownShown+4 || len(ra.UnknownKeys) != maxUnknownShown {
		t.Fatalf("unknown keys: count %d, shown %d", ra.UnknownKeyCount, len(ra.UnknownKeys))
	}
	// The first maxUnknownShown by tenant, then class: u11 to u26.
	for i, k := range ra.UnknownKeys {
		if want := (quota.Key{Tenant: fmt.Sprintf("u%02d", 11+i), Class: fmt.Sprintf("c%02d", 19-i)}); k != want {
			t.Fatalf("unknown keys shown %v: [%d] is %v, want %v", ra.UnknownKeys, i, k, want)
		}
	}
	if len(v.Keys) != 1 || v.Keys[0].Key != known || !near(v.Keys[0].Regions[0].Demand, 4) {
		t.Fatalf("known key's demand not recorded: %+v", v.Keys)
	}
	// One tenant's keys are shown by class: c00 to c15 of the twenty,
	// reported the other way round.
	kds = kds[:0]
	for i := maxUnknownShown + 3; i >= 0; i-- {
		kds = append(kds, KeyDemand{Key: quota.Key{Tenant: "one", Class: fmt.Sprintf("c%02d", i)}, Admitted: 1, Window: time.Second})
	}
	if _, err := a.Report(ms(100), Report{Region: "b", Seq: 1, Keys: kds}); err != nil {
		t.Fatal(err)
	}
	for i, k := range a.View(ms(100)).Regions[1].UnknownKeys {
		if want := (quota.Key{Tenant: "one", Class: fmt.Sprintf("c%02d", i)}); k != want {
			t.Fatalf("one tenant's unknown keys shown out of class order: [%d] is %v, want %v", i, k, want)
		}
	}
}

func TestDemandEstimate(t *testing.T) {
	a, err := NewAllocator(Options{Regions: twoRegions(), Epoch: time.Second, Validity: 5 * time.Second, DemandAlpha: 0.5}, testStart)
	if err != nil {
		t.Fatal(err)
	}
	k1, k2 := quota.Key{Tenant: "one", Class: "w"}, quota.Key{Tenant: "two", Class: "w"}
	for _, k := range []quota.Key{k1, k2} {
		if err := a.SetLimit(k, KeyLimit{Rate: 1000, Burst: 10}); err != nil {
			t.Fatal(err)
		}
	}
	demandOf := func(k quota.Key) float64 {
		for _, kv := range a.View(ms(0)).Keys {
			if kv.Key == k {
				return kv.Regions[0].Demand
			}
		}
		return 0
	}
	report := func(seq uint64, keys ...KeyDemand) {
		if _, err := a.Report(ms(int(seq)*1000), Report{Region: "a", Seq: seq, Keys: keys}); err != nil {
			t.Fatal(err)
		}
	}
	// The first observation is taken as is; admitted and denied both count.
	report(1, KeyDemand{Key: k1, Admitted: 60, Denied: 20, Window: time.Second}, KeyDemand{Key: k2, Admitted: 100, Window: time.Second})
	if d := demandOf(k1); !near(d, 80) {
		t.Fatalf("first estimate %v, want 80", d)
	}
	// A zero report halves it (alpha 0.5); a report that leaves the key
	// out counts as zero too.
	report(2, KeyDemand{Key: k1, Window: time.Second}, KeyDemand{Key: k2, Admitted: 100, Window: time.Second})
	if d := demandOf(k1); !near(d, 40) {
		t.Fatalf("after a zero report %v, want 40", d)
	}
	report(3, KeyDemand{Key: k2, Admitted: 100, Window: time.Second})
	if d := demandOf(k1); !near(d, 20) {
		t.Fatalf("after a report without the key %v, want 20", d)
	}
	// A two-epoch window weighs like two epochs: 1-(1-0.5)^2 = 0.75.
	report(4, KeyDemand{Key: k1, Admitted: 200, Window: 2 * time.Second})
	if d := demandOf(k1); !near(d, 20+0.75*(100-20)) {
		t.Fatalf("after a two-second window %v, want 80", d)
	}
	if d := demandOf(k2); !near(d, 50) {
		t.Fatalf("k2 left out once: %v, want 50", d)
	}
	// A window under half an epoch is no observation: the estimate stays,
	// and the next real one is not decayed for the short report.
	report(5, KeyDemand{Key: k1, Admitted: 50, Window: 100 * time.Millisecond}, KeyDemand{Key: k2, Admitted: 100, Window: time.Second})
	if d := demandOf(k1); !near(d, 80) {
		t.Fatalf("after a 100ms window %v, want 80 unchanged", d)
	}
	report(6, KeyDemand{Key: k1, Window: time.Second}, KeyDemand{Key: k2, Admitted: 100, Window: time.Second})
	if d := demandOf(k1); !near(d, 40) {
		t.Fatalf("after a zero report following a short one %v, want 40", d)
	}
	// A window of exactly half an epoch is an observation, weighing
	// 1-(1-0.5)^0.5.
	report(7, KeyDemand{Key: k1, Admitted: 50, Window: 500 * time.Millisecond})
	if d, want := demandOf(k1), 40+(1-math.Sqrt(0.5))*(100-40); !near(d, want) {
		t.Fatalf("after a half-epoch window %v, want %v", d, want)
	}
}

func TestRemoveKeyAndSetRegions(t *testing.T) {
	a := mustAllocator(t, threeRegions())
	keys := someKeys(t, a, 10)
	drive(t, a, 3, 15, keys)
	a.RemoveKey(keys[0])
	a.RemoveKey(quota.Key{Tenant: "never", Class: "set"}) // unknown: ignored
	v := a.View(ms(15_000))
	for _, kv := range v.Keys {
		if kv.Key == keys[0] {
			t.Fatal("removed key still in view")
		}
	}
	rep := Report{Region: "a", Seq: 1000, Keys: []KeyDemand{{Key: keys[0], Admitted: 500, Window: time.Second}}}
	grants, err := grantsOf(a.Report(ms(15_100), rep))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range grants {
		if g.Key == keys[0] {
			t.Fatal("removed key got a grant")
		}
	}
	if v := a.View(ms(15_100)); v.Regions[0].UnknownKeyCount != 1 {
		t.Fatalf("removed key should now be unknown, view says %d unknown", v.Regions[0].UnknownKeyCount)
	}

	// Reweight, drop c, add d.
	if err := a.SetRegions([]Region{{Name: "d", Weight: 1}, {Name: "a", Weight: 1}, {Name: "b", Weight: 2}}); err != nil {
		t.Fatal(err)
	}
	if err := a.SetRegions([]Region{{Name: "a", Weight: 0}}); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("bad regions accepted: %v", err)
	}
	v = a.View(ms(15_200))
	if len(v.Regions) != 3 || v.Regions[0].Name != "d" || v.Regions[1].Name != "a" || !v.Regions[1].Reported || v.Regions[0].Reported {
		t.Fatalf("regions after reload: %+v", v.Regions)
	}
	kv := v.Keys[0]
	if want := kv.Limit.Rate / 4; !near(kv.Regions[0].StaticRate, want) || !near(kv.Regions[2].StaticRate, 2*want) {
		t.Fatalf("static shares after reload: %+v", kv.Regions)
	}
	if _, err := a.Report(ms(15_300), Report{Region: "c", Seq: 1}); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("removed region's report accepted: %v", err)
	}
	// The allocator keeps working with the new regions.
	a.Allocate(ms(16_000))
	if _, err := a.Report(ms(16_100), Report{Region: "d", Seq: 1, Keys: []KeyDemand{{Key: keys[1], Admitted: 1, Window: time.Second}}}); err != nil {
		t.Fatal(err)
	}
}

func TestBecomeLeaderForgetsGrants(t *testing.T) {
	a := mustAllocator(t, threeRegions())
	keys := someKeys(t, a, 10)
	drive(t, a, 5, 15, keys)
	a.BecomeLeader(ms(15_000))
	v := a.View(ms(15_000))
	if !v.Learning || !v.LearningUntil.Equal(ms(20_000)) {
		t.Fatalf("learning: %v until %v", v.Learning, v.LearningUntil)
	}
	// Learning ends at that instant: a nanosecond before it still learns.
	for _, at := range []time.Time{ms(20_000).Add(-time.Nanosecond), ms(20_000)} {
		want := at.Before(ms(20_000))
		if got, vl := a.Learning(at), a.View(at).Learning; got != want || vl != want {
			t.Fatalf("at %v: Learning %v, View.Learning %v, want %v", at.Sub(ms(15_000)), got, vl, want)
		}
	}
	for _, kv := range v.Keys {
		t.Fatalf("key %v kept state across BecomeLeader", kv.Key)
	}
	for _, r := range v.Regions {
		if r.Reported {
			t.Fatalf("region %s kept its reports", r.Name)
		}
	}
	// Regions may continue with any seq.
	if _, err := a.Report(ms(15_100), Report{Region: "a", Seq: 1}); err != nil {
		t.Fatal(err)
	}
}

// grantsOf is the grants of a Report answer.
func grantsOf(ans Answer, err error) ([]Grant, error) { return ans.Grants, err }

// TestDemandAtTheStaticShareNeedsNoGrant: a key is contended only when a
// region's demand exceeds its static share, or it has demand and its
// static burst holds no whole unit. Demand exactly at the static rate, with
// exactly one unit of static burst, gets no grant epoch after epoch.
func TestDemandAtTheStaticShareNeedsNoGrant(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 2})
	for ms := 6000; ms < 12000; ms += 1000 {
		s.a.Allocate(s.at(ms))
		if ga, gb := s.report("a", ms+100, 50, 0), s.report("b", ms+200, 1, 0); ga != nil || gb != nil {
			t.Fatalf("at %dms demand at the static rate 50 (and 1) with one unit of static burst each got grants %+v %+v", ms, ga, gb)
		}
	}
	if v := s.a.View(s.at(12000)); len(v.Keys) != 1 || v.Keys[0].Contended || v.Keys[0].Active {
		t.Fatalf("view: %+v", v.Keys)
	}
}

// TestDemandAtTheUnitFloorNeedsNoGrant: a region whose static burst holds
// no whole unit makes a key contended only with demand above 0.1% of the
// rate (a decaying estimate never reaches zero); at exactly that it gets
// no grant.
func TestDemandAtTheUnitFloorNeedsNoGrant(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 1000, Burst: 1}) // static bursts 1 and 0
	for ms := 6000; ms < 10000; ms += 1000 {
		s.a.Allocate(s.at(ms))
		if ga, gb := s.report("a", ms+100, 0, 0), s.report("b", ms+200, 1, 0); ga != nil || gb != nil {
			t.Fatalf("at %dms b's demand of exactly 0.1%% of the rate got grants %+v %+v", ms, ga, gb)
		}
	}
}

// TestUnitDonorGivesUpTheLeastRate: among regions that could each spare
// as many units to a region left without one, the donor held a hair below
// its static rate is the one that loses the least rate by it (the first
// of equals); demand at exactly the unit floor (0.1% of the rate) keeps no
// unit for itself and asks for none. Each case edits the same start: a
// (gaining rate, no static unit) wants a unit, b and c (at and above their
// static rate 100) have two static units each and no demand.
func TestUnitDonorGivesUpTheLeastRate(t *testing.T) {
	capTo := 100 * (1 - 1e-9)
	for _, tc := range []struct {
		name      string
		edit      func(a *Allocator, capacity *float64)
		want      int
		wantCapTo float64
	}{
		{"b loses the least rate", func(*Allocator, *float64) {}, 1, capTo},
		{"b's demand at the floor is none, c is below its static rate", func(a *Allocator, _ *float64) {
			a.role[2], a.dem[1], a.sbs[1] = -1, 1, 1
		}, 1, capTo},
		{"a's demand at the floor wants no unit", func(a *Allocator, _ *float64) { a.dem[0] = 1 }, -1, 0},
		{"a holds a unit within the rounding", func(a *Allocator, _ *float64) { a.bout[0] = 1 - 1e-12 }, -1, 0},
		{"a keeps its own static unit", func(a *Allocator, _ *float64) { a.role[0], a.sbs[0] = 0, 1 }, 1, capTo},
		{"b's floor is its static rate", func(a *Allocator, _ *float64) { a.lo[1] = 100 }, 2, capTo},
		{"one static unit each to spare", func(a *Allocator, _ *float64) { a.sbs[1], a.sbs[2] = 1, 1 }, 1, capTo},
		{"the others take exactly the capacity without the donor", func(a *Allocator, capacity *float64) {
			*capacity = 3000 - (a.hi[1] - capTo)
		}, 1, capTo},
		{"equal losses: the first", func(a *Allocator, _ *float64) { a.out[2] = 100 }, 1, capTo},
		{"a at its static rate without a static unit cannot receive one", func(a *Allocator, _ *float64) { a.role[0] = 0 }, -1, 0},
		{"the most units to spare go first, whatever the loss", func(a *Allocator, _ *float64) {
			a.sbs[1], a.out[1], a.out[2] = 3, 150, 100
		}, 1, capTo},
		{"the first region is the donor", func(a *Allocator, _ *float64) {
			a.role = []int8{0, 0, 1}
			a.sbs = []float64{2, 2, 0}
			a.dem = []float64{0, 0, 50}
			a.bout = []float64{2, 2, 0}
			a.out = []float64{100, 150, 750}
		}, 0, capTo},
	} {
		a := mustAllocator(t, []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}})
		l := &KeyLimit{Rate: 1000, Burst: 10, Unit: 1}
		a.role = []int8{1, 0, 1}
		a.sbs = []float64{0, 2, 2}
		a.dem = []float64{50, 0, 0}
		a.bout = []float64{0, 2, 2}
		a.lo = []float64{0, 0, 0}
		a.hi = []float64{1000, 1000, 1000}
		a.sts = []float64{100, 100, 100}
		a.out = []float64{750, 100, 150}
		capacity := 1000.0
		tc.edit(a, &capacity)
		if c, to := a.unitDonor(l, 3, capacity, 3000); c != tc.want || to != tc.wantCapTo {
			t.Errorf("%s: donor %d capped to %v, want %d capped to %v", tc.name, c, to, tc.want, tc.wantCapTo)
		}
	}
}

// TestLearningReissuesNothingWithLessThanAMillisecondLeft: a new leader
// re-issues an above-share grant only with its own expiry in whole
// milliseconds, so one with less than a millisecond left is not re-issued
// at all (a grant valid for 0 would be no grant).
func TestLearningReissuesNothingWithLessThanAMillisecondLeft(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 100})
	kd := KeyDemand{Key: s.key, Admitted: 150, Window: time.Second, HeldRate: 80, HeldBurst: 80, HeldValid: 500 * time.Microsecond}
	ans, err := s.a.Report(s.at(1000), Report{Region: "a", Seq: 1, Keys: []KeyDemand{kd}})
	if err != nil || len(ans.Grants) != 0 {
		t.Fatalf("a holding 80 (above its share 50) for 0.5ms more got %+v, %v; want no grant", ans.Grants, err)
	}
	kd.HeldValid = time.Millisecond + 500*time.Microsecond
	ans, err = s.a.Report(s.at(1000), Report{Region: "a", Seq: 2, Keys: []KeyDemand{kd}})
	if err != nil || len(ans.Grants) != 1 || ans.Grants[0].Valid != time.Millisecond || ans.Grants[0].Rate > 80 || !near(ans.Grants[0].Rate, 80) {
		t.Fatalf("a holding 80 for 1.5ms more got %+v, %v; want 80 for 1ms", ans.Grants, err)
	}
}

// TestLearningReissuesAboveStaticWithItsOwnExpiry: an allocator built
// after a config change shortened the validity (5s to 2s, PriorValidity
// 5s) re-issues a held grant above the static shares with the validity it
// has left, not cut to the new 2s, up to the prior validity; without a
// prior validity the new one bounds it. A grant at or below the static
// shares gets the longer of the new full validity and what it has left,
// up to the prior validity: what it leaves below its share may pay for
// another region's re-issued grant until then.
func TestLearningReissuesAboveStaticWithItsOwnExpiry(t *testing.T) {
	regions := []Region{{Name: "ap", Weight: 2}, {Name: "eu", Weight: 1}, {Name: "us", Weight: 1}}
	for _, tc := range []struct {
		name      string
		prior     time.Duration
		rate      float64
		heldValid time.Duration
		want      time.Duration
	}{
		{"above static, prior validity covers what is left", 5 * time.Second, 227, 3*time.Second + 400*time.Microsecond, 3 * time.Second},
		{"above static, more left than the prior validity", 5 * time.Second, 227, 7 * time.Second, 5 * time.Second},
		{"above static, no prior validity", 0, 227, 3 * time.Second, 2 * time.Second},
		{"prior validity shorter than the new one", time.Second, 227, 3 * time.Second, 2 * time.Second},
		{"below static, prior validity", 5 * time.Second, 60, 3 * time.Second, 3 * time.Second},
		{"below static, a nanosecond over 3s left", 5 * time.Second, 60, 3*time.Second + time.Nanosecond, 3*time.Second + time.Millisecond},
		{"below static, more left than the prior validity", 5 * time.Second, 60, 7 * time.Second, 5 * time.Second},
		{"below static, less left than the new validity", 5 * time.Second, 60, time.Second, 2 * time.Second},
		{"below static, no prior validity", 0, 60, 3 * time.Second, 2 * time.Second},
		{"below static, a nanosecond left", 5 * time.Second, 60, time.Nanosecond, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewAllocator(Options{Regions: regions, Epoch: 500 * time.Millisecond, Validity: 2 * time.Second, PriorValidity: tc.prior}, testStart)
			if err != nil {
				t.Fatal(err)
			}
			key := quota.Key{Tenant: "acme", Class: "write"}
			if err := a.SetLimit(key, KeyLimit{Rate: 400, Burst: 400}); err != nil {
				t.Fatal(err)
			}
			region := "ap"
			if tc.rate < 100 {
				region = "us"
			}
			kd := KeyDemand{Key: key, Admitted: tc.rate / 2, Window: 500 * time.Millisecond, HeldRate: tc.rate, HeldBurst: tc.rate, HeldValid: tc.heldValid, Holding: 10}
			ans, err := a.Report(ms(1), Report{Region: region, Seq: 1, Keys: []KeyDemand{kd}})
			if err != nil || len(ans.Grants) != 1 {
				t.Fatalf("%s holding %v for %v more: %+v, %v; want one grant", region, tc.rate, tc.heldValid, ans.Grants, err)
			}
			if g := ans.Grants[0]; g.Valid != tc.want || g.Rate > tc.rate || g.Burst > tc.rate || !near(g.Rate, tc.rate) {
				t.Fatalf("%s holding %v for %v more got %v for %v; want %v for %v", region, tc.rate, tc.heldValid, g.Rate, g.Valid, tc.rate, tc.want)
			}
		})
	}
}

// TestGrantAfterLearningKeepsALongerReissuedFallback: after a config
// change shortened the validity (10s to 5s, PriorValidity 10s), an
// earlier leader's grants run until 14s: a's 90/20 (above its static
// rate, below its static burst) and b's 10/80, which pay for each other.
// Both are re-issued with their own expiry, and once a acknowledges its
// grant it runs below its static burst until at least 13.9s. a's next
// report, sent at 4.6s and received at 5.2s, is answered after learning:
// a grant for the new full validity would end at 9.6s on a's clock, after
// which a refills up to its static 50 beside b's 80. Such a grant moves
// the fallback earlier like a short one, so the static share must fit
// from there on; here it does not, and a keeps the grant it holds.
func TestGrantAfterLearningKeepsALongerReissuedFallback(t *testing.T) {
	a, err := NewAllocator(Options{Regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}},
		Epoch: time.Second, Validity: 5 * time.Second, PriorValidity: 10 * time.Second}, testStart)
	if err != nil {
		t.Fatal(err)
	}
	key := quota.Key{Tenant: "acme", Class: "write"}
	if err := a.SetLimit(key, KeyLimit{Rate: 100, Burst: 100}); err != nil {
		t.Fatal(err)
	}
	// held is what each region applied: the newest grant and its expiry on
	// the region's clock (sent + Valid), in ms; without one it runs on
	// 50/50. No answer after a's last report arrives.
	type applied struct {
		g   Grant
		end int
	}
	held := map[string]applied{
		"a": {Grant{Key: key, Rate: 90, Burst: 20}, 14_000},
		"b": {Grant{Key: key, Rate: 10, Burst: 80}, 14_000},
	}
	seq := map[string]uint64{}
	report := func(region string, sent, recv int, demand float64) {
		t.Helper()
		kd := KeyDemand{Key: key, Admitted: demand, Window: time.Second, Holding: 10}
		if h := held[region]; h.end > sent {
			kd.HeldRate, kd.HeldBurst, kd.HeldValid = h.g.Rate, h.g.Burst, time.Duration(h.end-sent)*time.Millisecond
		}
		seq[region]++
		grants, err := grantsOf(a.Report(ms(recv), Report{Region: region, Seq: seq[region], Keys: []KeyDemand{kd}}))
		if err != nil {
			t.Fatalf("%s's report received at %dms: %v", region, recv, err)
		}
		if len(grants) == 1 {
			held[region] = applied{grants[0], sent + int(grants[0].Valid/time.Millisecond)}
		}
	}
	report("a", 4000, 4000, 10)
	report("b", 4100, 4100, 200)
	report("a", 4500, 4500, 10) // acknowledged: below its static burst until 13.5s
	for region, h := range held {
		if h.end != 14_000 {
			t.Fatalf("%s's grant re-issued until %dms, want its own 14s", region, h.end)
		}
	}
	a.Allocate(ms(5000))
	report("a", 4600, 5200, 10)
	at := func(region string, ms int) (float64, float64) {
		if h := held[region]; ms < h.end {
			return h.g.Rate, h.g.Burst
		}
		return 50, 50
	}
	for now := 5200; now <= 15_000; now++ {
		ar, ab := at("a", now)
		br, bb := at("b", now)
		if ar+br > 100+1e-9 || ab+bb > 100+1e-9 {
			t.Fatalf("at %dms a may refill at %v up to %v (%+v until %dms) and b at %v up to %v (%+v until %dms): over 100",
				now, ar, ab, held["a"].g, held["a"].end, br, bb, held["b"].g, held["b"].end)
		}
	}
}

// TestRaisePendingOnlyAboveTheShortfall: an answer short of its target
// asks for an early report only when the shortfall exceeds 5% of the rate
// and a demand reading's noise (three standard deviations of one epoch's
// Poisson count: short² > 9·target per epoch); exactly either waits for
// the next epoch.
func TestRaisePendingOnlyAboveTheShortfall(t *testing.T) {
	for _, tc := range []struct {
		rate, bDemand float64
		want          time.Duration
	}{
		{100000, 45000, 0},                      // a's target 55000, granted its static 50000: short by exactly 5%
		{100000, 44000, 333 * time.Millisecond}, // short by 6%
		{140, 40, 0},                            // target 100, granted 70: short by 30, and 30² = 9·100
		{140, 39, 333 * time.Millisecond},       // target 101, short by 31: 31² > 9·101
	} {
		s := newScript(t, twoRegions(), KeyLimit{Rate: tc.rate, Burst: tc.rate})
		s.a.Allocate(s.at(6000))
		s.report("a", 6100, 2*tc.rate, -1)
		s.report("b", 6200, tc.bDemand, -1)
		if g := s.report("a", 6300, 2*tc.rate, -1); g == nil || !near(g.Rate, tc.rate/2) {
			t.Fatalf("rate %v, b demands %v: a got %+v before b acknowledged, want its static %v", tc.rate, tc.bDemand, g, tc.rate/2)
		}
		if got := s.a.ReportAgain("a"); got != tc.want {
			t.Fatalf("rate %v, b demands %v: ReportAgain(a) = %v, want %v", tc.rate, tc.bDemand, got, tc.want)
		}
	}
}

// TestReportStampWraps: the per-report stamp that finds duplicate keys
// wraps around after 2³² reports; the report that wraps it forgets every
// older stamp, so a key no report named before is no duplicate, and a key
// named twice still is.
func TestReportStampWraps(t *testing.T) {
	a := mustAllocator(t, twoRegions())
	keys := []quota.Key{{Tenant: "k1", Class: "w"}, {Tenant: "k2", Class: "w"}, {Tenant: "k3", Class: "w"}}
	for _, k := range keys {
		if err := a.SetLimit(k, KeyLimit{Rate: 10, Burst: 10}); err != nil {
			t.Fatal(err)
		}
	}
	a.stamp = math.MaxUint32 - 1
	kd := func(k quota.Key) KeyDemand { return KeyDemand{Key: k, Admitted: 1, Window: time.Second} }
	if _, err := a.Report(ms(100), Report{Region: "a", Seq: 1, Keys: []KeyDemand{kd(keys[0]), kd(keys[1])}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Report(ms(200), Report{Region: "a", Seq: 2, Keys: []KeyDemand{kd(keys[2]), kd(keys[0])}}); err != nil || a.stamp != 1 {
		t.Fatalf("the report wrapping the stamp: %v, stamp %d; want no error, stamp 1", err, a.stamp)
	}
	if _, err := a.Report(ms(300), Report{Region: "a", Seq: 3, Keys: []KeyDemand{kd(keys[1]), kd(keys[1])}}); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("a key named twice after the wrap: %v, want ErrInvalid", err)
	}
}

// TestBadNumberIsNotFiniteOrNonNegative: Report's one-comparison test of
// a reading refuses exactly what !finite(x) || x < 0 refuses, at every
// float edge (negative zero passes, NaN and both infinities do not).
func TestBadNumberIsNotFiniteOrNonNegative(t *testing.T) {
	for _, x := range []float64{
		0, math.Copysign(0, -1), math.SmallestNonzeroFloat64, -math.SmallestNonzeroFloat64,
		1, -1, math.MaxFloat64, -math.MaxFloat64, math.Inf(1), math.Inf(-1), math.NaN(),
	} {
		if got, want := badNumber(x), !finite(x) || x < 0; got != want {
			t.Errorf("badNumber(%v) = %v, want %v", x, got, want)
		}
	}
}

// TestAppendGrantIsAppend: the answer's field-by-field append gives what
// append gives, with room in the slice and without (it grows then).
func TestAppendGrantIsAppend(t *testing.T) {
	g := Grant{Key: quota.Key{Tenant: "t", Class: "c"}, Rate: 1.5, Burst: 2.5, Valid: 3 * time.Second}
	prev := Grant{Key: quota.Key{Tenant: "p", Class: "q"}, Rate: 1, Burst: 2, Valid: time.Second}
	for _, room := range []int{0, 1, 4} {
		answer := make([]Grant, 1, 1+room)
		answer[0] = prev
		got := appendGrant(answer, &g)
		if want := []Grant{prev, g}; !reflect.DeepEqual(got, want) {
			t.Errorf("room %d: appendGrant = %+v, want %+v", room, got, want)
		}
		if room > 0 && &got[0] != &answer[0] {
			t.Errorf("room %d: appendGrant moved the answer instead of using its room", room)
		}
	}
}
