package hierarchy

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestCheckReportKeysRefusesWhatReportRefuses: CheckReportKeys refuses a
// report exactly when it names a key twice, naming the second place and
// the first, and Report refuses the same reports; it changes nothing (the
// view and the next answers are those of an allocator never asked). Keys
// come with and without limits, in the region's previous order or not,
// from a region that reported before or not.
func TestCheckReportKeysRefusesWhatReportRefuses(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		regions := genRegions(t, 3)
		opts := Options{Regions: regions, Epoch: time.Second, Validity: 3 * time.Second}
		checked, err := NewAllocator(opts, testStart)
		if err != nil {
			t.Fatal(err)
		}
		plain, err := NewAllocator(opts, testStart)
		if err != nil {
			t.Fatal(err)
		}
		keys := make([]quota.Key, 5)
		for i := range keys {
			keys[i] = quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
			if i < 3 { // t3 and t4 have no limit
				for _, a := range []*Allocator{checked, plain} {
					if err := a.SetLimit(keys[i], KeyLimit{Rate: 30, Burst: 30}); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		seq := map[string]uint64{}
		now := testStart
		for step := range 20 {
			now = now.Add(time.Duration(rapid.IntRange(1, 700).Draw(t, "ms")) * time.Millisecond)
			region := regions[rapid.IntRange(0, len(regions)-1).Draw(t, "region")].Name
			picks := rapid.SliceOfN(rapid.IntRange(0, len(keys)-1), 1, 6).Draw(t, "keys")
			seq[region]++
			rep := Report{Region: region, Seq: seq[region]}
			first, dupAt, dupOf := map[int]int{}, -1, -1
			for j, i := range picks {
				kd := KeyDemand{Key: keys[i], Window: time.Second}
				kd.SetDemandRate(rapid.Float64Range(0, 40).Draw(t, "demand"))
				rep.Keys = append(rep.Keys, kd)
				if f, ok := first[i]; ok && dupAt < 0 {
					dupAt, dupOf = j, f
				} else if !ok {
					first[i] = j
				}
			}
			err := checked.CheckReportKeys(rep)
			if dupAt < 0 {
				if err != nil {
					t.Fatalf("step %d: %v refused: %v", step, picks, err)
				}
			} else {
				want := fmt.Sprintf("keys[%d].key %s duplicates keys[%d]", dupAt, rep.Keys[dupAt].Key, dupOf)
				if !errors.Is(err, quota.ErrInvalid) || err.Error() != "invalid argument: "+want {
					t.Fatalf("step %d: %v: %v, want ErrInvalid: %s", step, picks, err, want)
				}
			}
			if v1, v2 := checked.View(now), plain.View(now); !reflect.DeepEqual(v1, v2) {
				t.Fatalf("step %d: the check changed the view:\n%+v\n%+v", step, v1, v2)
			}
			a1, err1 := checked.Report(now, rep)
			a2, err2 := plain.Report(now, rep)
			if (err1 == nil) != (dupAt < 0) || (err2 == nil) != (dupAt < 0) {
				t.Fatalf("step %d: %v: Report refused with %v and %v, duplicate at %d", step, picks, err1, err2, dupAt)
			}
			if !reflect.DeepEqual(a1, a2) {
				t.Fatalf("step %d: answers differ: %+v and %+v", step, a1, a2)
			}
			if rapid.Bool().Draw(t, "allocate") {
				checked.Allocate(now)
				plain.Allocate(now)
			}
		}
	})
}

// TestForgetIdleForgetsByLastNamed: a key is named when it gets its limit
// (at the latest time the allocator saw), when a report names it and when
// an answer carries a grant for it, also an answer to a retry and a grant
// for a key the answered region did not report; ForgetIdle removes the
// keys unnamed for longer than ForgetHorizon, not before the learning
// floor, and nothing else.
func TestForgetIdleForgetsByLastNamed(t *testing.T) {
	a := mustAllocator(t, twoRegions())
	horizon := ForgetHorizon(time.Second, 5*time.Second)
	hot, quiet, unreported := quota.Key{Tenant: "hot", Class: "w"}, quota.Key{Tenant: "quiet", Class: "w"}, quota.Key{Tenant: "never", Class: "w"}
	for _, k := range []quota.Key{hot, quiet, unreported} {
		if err := a.SetLimit(k, KeyLimit{Rate: 100, Burst: 100}); err != nil {
			t.Fatal(err)
		}
	}
	named := func(k quota.Key) time.Time {
		t.Helper()
		at, ok := a.LastNamed(k)
		if !ok {
			t.Fatalf("%s is not held", k)
		}
		return at
	}
	if got := named(unreported); !got.Equal(testStart) {
		t.Fatalf("a key set before anything was seen: named at %v, want the allocator's start", got)
	}
	demand := func(k quota.Key, rate float64) KeyDemand {
		kd := KeyDemand{Key: k, Window: time.Second}
		kd.SetDemandRate(rate)
		return kd
	}
	// Past learning: a's demand above its static share makes hot
	// contended, and b, which reports only quiet, gets a grant for hot.
	at := testStart.Add(6 * time.Second)
	a.Allocate(at)
	if _, err := a.Report(at, Report{Region: "a", Seq: 1, Keys: []KeyDemand{demand(hot, 90), demand(quiet, 1)}}); err != nil {
		t.Fatal(err)
	}
	a.Allocate(at.Add(time.Second))
	bAt := at.Add(time.Second + time.Millisecond)
	ans, err := a.Report(bAt, Report{Region: "b", Seq: 1, Keys: []KeyDemand{demand(quiet, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	granted := false
	for _, g := range ans.Grants {
		granted = granted || g.Key == hot
	}
	if !granted {
		t.Fatalf("b's answer %+v has no grant for %s", ans.Grants, hot)
	}
	if got := named(hot); !got.Equal(bAt) {
		t.Fatalf("%s granted to b at %v: named at %v", hot, bAt, got)
	}
	if got := named(quiet); !got.Equal(bAt) {
		t.Fatalf("%s reported by b at %v: named at %v", quiet, bAt, got)
	}
	retryAt := bAt.Add(time.Second)
	if _, err := a.Report(retryAt, Report{Region: "b", Seq: 1, Keys: []KeyDemand{demand(quiet, 1)}}); err != nil {
		t.Fatal(err)
	}
	if got := named(hot); !got.Equal(retryAt) {
		t.Fatalf("%s granted again in a retry at %v: named at %v", hot, retryAt, got)
	}
	late := quota.Key{Tenant: "late", Class: "w"}
	if err := a.SetLimit(late, KeyLimit{Rate: 100, Burst: 100}); err != nil {
		t.Fatal(err)
	}
	if got := named(late); !got.Equal(retryAt) {
		t.Fatalf("a key set after %v: named at %v, want the latest time seen", retryAt, got)
	}

	if n := a.ForgetIdle(testStart.Add(horizon), time.Time{}); n != 0 {
		t.Fatalf("at the horizon of the first key's naming: %d forgotten, want 0", n)
	}
	if n := a.ForgetIdle(testStart.Add(horizon+time.Nanosecond), testStart.Add(horizon+time.Second)); n != 0 {
		t.Fatalf("before the learning floor: %d forgotten, want 0", n)
	}
	if n := a.ForgetIdle(testStart.Add(horizon+time.Nanosecond), time.Time{}); n != 1 {
		t.Fatalf("past the horizon of %s: %d forgotten, want 1", unreported, n)
	}
	if _, ok := a.LastNamed(unreported); ok {
		t.Fatalf("%s still held", unreported)
	}
	if n := a.ForgetIdle(bAt.Add(horizon+time.Nanosecond), time.Time{}); n != 1 {
		t.Fatalf("past the horizon of %s: %d forgotten, want 1", quiet, n)
	}
	if got := a.Keys(); len(got) != 2 || a.NumKeys() != 2 {
		t.Fatalf("keys %v (%d), want %s and %s", got, a.NumKeys(), hot, late)
	}
	if n := a.ForgetIdle(retryAt.Add(horizon+time.Nanosecond), time.Time{}); n != 2 || a.NumKeys() != 0 || len(a.View(retryAt.Add(horizon+time.Nanosecond)).Keys) != 0 {
		t.Fatalf("past every horizon: %d forgotten, %d keys held", n, a.NumKeys())
	}
}

// TestTopViewIsTheTopOfView: with 300 keys (150 tenants, two classes)
// whose demands often tie,
// TopView's keys are View's ranked by pressure (then tenant, class) and
// cut at n, for n below, at and above the keys shown; the rest of the view
// is View's.
func TestTopViewIsTheTopOfView(t *testing.T) {
	a := mustAllocator(t, twoRegions())
	rng := []float64{0, 5, 20, 60, 120}
	var reps [2]Report
	for i := range 300 {
		j := (i * 37) % 300 // each tenant with both classes
		k := quota.Key{Tenant: fmt.Sprintf("t%03d", j/2), Class: []string{"r", "w"}[j%2]}
		// A tenant's two keys tie, but where one region is left out.
		if err := a.SetLimit(k, KeyLimit{Rate: []float64{50, 100}[j/2%3%2], Burst: 100}); err != nil {
			t.Fatal(err)
		}
		for r := range reps {
			if i%7 == 3 && r == 1 {
				continue // shown, but with one region's demand only
			}
			kd := KeyDemand{Key: k, Window: time.Second}
			kd.SetDemandRate(rng[(j/2*(r+3))%len(rng)])
			reps[r].Keys = append(reps[r].Keys, kd)
		}
	}
	now := testStart.Add(6 * time.Second)
	a.Allocate(now)
	for r, name := range []string{"a", "b"} {
		reps[r].Region, reps[r].Seq = name, 1
		if _, err := a.Report(now, reps[r]); err != nil {
			t.Fatal(err)
		}
	}
	a.Allocate(now.Add(time.Second))
	at := now.Add(time.Second)
	v := a.View(at)
	ranked := rankedByPressure(v.Keys)
	contended := 0
	for _, kv := range v.Keys {
		if kv.Contended {
			contended++
		}
	}
	if len(ranked) != 300 || contended == 0 || contended == len(ranked) {
		t.Fatalf("%d keys shown, %d contended: want all 300, some contended", len(ranked), contended)
	}
	for _, n := range []int{1, 10, 299, 300, 1000} {
		tv, c := a.TopView(at, n)
		want := v
		want.Keys = ranked[:min(n, len(ranked))]
		if !reflect.DeepEqual(tv, want) || c != contended {
			t.Fatalf("TopView(%d): %d keys, %d contended; want the first %d of View ranked, %d contended", n, len(tv.Keys), c, len(want.Keys), contended)
		}
	}
}

// rankedByPressure is keys ranked as TopView ranks them (its reference):
// the sum of the regions' demand estimates over the key's rate, highest
// first, ties by tenant then class.
func rankedByPressure(keys []KeyView) []KeyView {
	pressure := func(kv KeyView) float64 {
		var d float64
		for _, r := range kv.Regions {
			d += r.Demand
		}
		return d / kv.Limit.Rate
	}
	ranked := slices.Clone(keys)
	slices.SortFunc(ranked, func(x, y KeyView) int {
		if c := cmp.Compare(pressure(y), pressure(x)); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Key.Tenant, y.Key.Tenant); c != 0 {
			return c
		}
		return cmp.Compare(x.Key.Class, y.Key.Class)
	})
	return ranked
}
