package hierarchy

import (
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestSetReportLimitsIsSetLimitPerKey: setting a report's limits with
// SetReportLimits leaves the allocator as SetLimit on each key in report
// order does — the same answers to the reports that follow and the same
// view — whether the keys come in the previous report's order or not,
// limits change or not, and when one limit is invalid (the keys before it
// set, the error naming it).
func TestSetReportLimitsIsSetLimitPerKey(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		regions := genRegions(t, 3)
		opts := Options{Regions: regions, Epoch: time.Second, Validity: 3 * time.Second}
		one, err := NewAllocator(opts, testStart)
		if err != nil {
			t.Fatal(err)
		}
		each, err := NewAllocator(opts, testStart)
		if err != nil {
			t.Fatal(err)
		}
		keys := make([]quota.Key, 4)
		limits := make([]KeyLimit, len(keys))
		newLimit := func() KeyLimit {
			// Few distinct limits, so that keys often share one.
			l := KeyLimit{Rate: rapid.SampledFrom([]float64{10, 40}).Draw(t, "rate"), Burst: rapid.SampledFrom([]float64{10, 40}).Draw(t, "burst"),
				FloorShare: rapid.SampledFrom([]float64{0, 0.5}).Draw(t, "floorShare")}
			if rapid.IntRange(0, 3).Draw(t, "perRegion") == 0 {
				l.StaticRate = make([]float64, len(regions))
				for i := range l.StaticRate {
					l.StaticRate[i] = l.Rate / float64(len(regions)) * rapid.SampledFrom([]float64{0.5, 1}).Draw(t, "staticRate")
				}
			}
			return l
		}
		for i := range keys {
			keys[i] = quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
			limits[i] = newLimit()
		}
		seq := map[string]uint64{}
		now := testStart
		for step := range 30 {
			now = now.Add(time.Duration(rapid.IntRange(1, 700).Draw(t, "ms")) * time.Millisecond)
			if rapid.Bool().Draw(t, "allocate") {
				one.Allocate(now)
				each.Allocate(now)
			}
			for i := range limits {
				if rapid.IntRange(0, 4).Draw(t, "change") == 0 {
					limits[i] = newLimit()
				}
			}
			region := regions[rapid.IntRange(0, len(regions)-1).Draw(t, "region")].Name
			order := rapid.Permutation([]int{0, 1, 2, 3}).Draw(t, "order")
			if rapid.Bool().Draw(t, "sameOrder") {
				order = []int{0, 1, 2, 3}
			}
			order = order[:rapid.IntRange(1, len(order)).Draw(t, "n")]
			seq[region]++
			rep := Report{Region: region, Seq: seq[region]}
			ls := make([]KeyLimit, len(order))
			for j, i := range order {
				kd := KeyDemand{Key: keys[i], Window: time.Second}
				kd.SetDemandRate(rapid.Float64Range(0, 2*limits[i].Rate).Draw(t, "demand"))
				rep.Keys = append(rep.Keys, kd)
				ls[j] = limits[i]
			}
			bad := -1
			if rapid.IntRange(0, 9).Draw(t, "invalid") == 0 {
				bad = rapid.IntRange(0, len(ls)-1).Draw(t, "badAt")
				ls[bad].Rate = math.NaN()
			}
			errOne := one.SetReportLimits(rep, ls)
			var errEach error
			for j := range rep.Keys {
				if errEach = each.SetLimit(rep.Keys[j].Key, ls[j]); errEach != nil {
					errEach = fmt.Errorf("keys[%d]: %w", j, errEach)
					break
				}
			}
			if (errOne == nil) != (bad < 0) || (errEach == nil) != (bad < 0) {
				t.Fatalf("step %d: SetReportLimits: %v, SetLimit each: %v, invalid at %d", step, errOne, errEach, bad)
			}
			if errOne != nil && errOne.Error() != errEach.Error() {
				t.Fatalf("step %d: SetReportLimits: %v, SetLimit each: %v", step, errOne, errEach)
			}
			if bad >= 0 {
				if v1, v2 := one.View(now), each.View(now); !reflect.DeepEqual(v1, v2) {
					t.Fatalf("step %d: views differ after a refused limit:\n%+v\n%+v", step, v1, v2)
				}
				continue
			}
			a1, err1 := one.Report(now, rep)
			a2, err2 := each.Report(now, rep)
			if !reflect.DeepEqual(a1, a2) || (err1 == nil) != (err2 == nil) {
				t.Fatalf("step %d: answers differ: %+v (%v) and %+v (%v)", step, a1, err1, a2, err2)
			}
			if v1, v2 := one.View(now), each.View(now); !reflect.DeepEqual(v1, v2) {
				t.Fatalf("step %d: views differ:\n%+v\n%+v", step, v1, v2)
			}
		}
	})
}
