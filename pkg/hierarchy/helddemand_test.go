package hierarchy

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// heldRig is one key in two regions (eu-west, us-east) of equal weight,
// validity 10 s, epoch 1 s, for reading View.HeldDemand against the hold
// (wantHold, held): us-east reports readings, eu-west nothing.
type heldRig struct {
	t   *testing.T
	a   *Allocator
	key quota.Key
	seq map[string]uint64
}

func newHeldRig(t *testing.T, alpha float64, l KeyLimit) *heldRig {
	t.Helper()
	a, err := NewAllocator(Options{
		Regions: []Region{{Name: "eu-west", Weight: 1}, {Name: "us-east", Weight: 1}},
		Epoch:   time.Second, Validity: 10 * time.Second, DemandAlpha: alpha,
	}, testStart)
	if err != nil {
		t.Fatal(err)
	}
	r := &heldRig{t: t, a: a, key: quota.Key{Tenant: "acme", Class: "read"}, seq: map[string]uint64{}}
	if err := a.SetLimit(r.key, l); err != nil {
		t.Fatal(err)
	}
	return r
}

// read has us-east report at ms n that it saw denied requests of the key
// over window.
func (r *heldRig) read(n int, denied float64, window time.Duration) {
	r.t.Helper()
	r.report("us-east", n, KeyDemand{Key: r.key, Denied: denied, Window: window})
}

// report sends region's report of keys at ms n.
func (r *heldRig) report(region string, n int, keys ...KeyDemand) {
	r.t.Helper()
	r.seq[region]++
	if _, err := r.a.Report(ms(n), Report{Region: region, Seq: r.seq[region], Keys: keys}); err != nil {
		r.t.Fatal(err)
	}
}

// view is us-east's KeyRegionView of the key at ms n.
func (r *heldRig) view(n int) KeyRegionView {
	r.t.Helper()
	for _, kv := range r.a.View(ms(n)).Keys {
		if kv.Key == r.key {
			return kv.Regions[1]
		}
	}
	r.t.Fatalf("key %v not in the view", r.key)
	return KeyRegionView{}
}

// expect checks us-east's HeldDemand (and its plain estimate) at each ms.
// at alternates ms and the HeldDemand wanted then.
func (r *heldRig) expect(what string, demand float64, at ...float64) {
	r.t.Helper()
	for i := 0; i+1 < len(at); i += 2 {
		n, want := int(at[i]), at[i+1]
		rv := r.view(n)
		if !closeTo(rv.HeldDemand, want) || !closeTo(rv.Demand, demand) {
			r.t.Errorf("%s, at %d ms: HeldDemand %v, Demand %v; want %v and %v", what, n, rv.HeldDemand, rv.Demand, want, demand)
		}
	}
}

func closeTo(got, want float64) bool {
	d := got - want
	return d <= 1e-12*max(1, want) && -d <= 1e-12*max(1, want)
}

// TestHeldDemandFollowsTheHold pins the phases of a region that read
// demand above the unit floor (0.1% of the key's rate) and then none
// (docs/architecture.md, "Small keys"): from the last such reading at T
// it counts at that estimate until T + max(5/estimate s, unit/rate) (the
// longer one rules, either way), then just above the floor (2 × floor,
// still asking) until T + the hold max(validity, unit/rate), and from
// then on at what it reads. View.Demand stays the estimate throughout.
func TestHeldDemandFollowsTheHold(t *testing.T) {
	const T = 20_000 // ms, after learning
	t.Run("unit over rate rules", func(t *testing.T) {
		// rate 0.5/s: unit/rate 2 s beats 5/10 s; the hold is the
		// validity, 10 s.
		r := newHeldRig(t, 1, KeyLimit{Rate: 0.5, Burst: 10})
		r.read(T, 10, time.Second)
		r.read(T+500, 0, time.Second)
		floor := unitDemandFloor * 0.5
		r.expect("held at the estimate", 0, T+500, 10, T+1999, 10)
		r.expect("past unit/rate", 0, T+2000, 2*floor, T+9999, 2*floor)
		r.expect("past the hold", 0, T+10_000, 0, T+30_000, 0)
	})
	t.Run("sparse requests rule", func(t *testing.T) {
		// rate 1/s: 5/2 s = 2.5 s beats unit/rate 1 s.
		r := newHeldRig(t, 1, KeyLimit{Rate: 1, Burst: 10})
		r.read(T, 2, time.Second)
		r.read(T+1000, 0, time.Second)
		floor := unitDemandFloor * 1.0
		r.expect("held at the estimate", 0, T+1000, 2, T+2499, 2)
		r.expect("past 5/estimate", 0, T+2500, 2*floor, T+9999, 2*floor)
		r.expect("past the hold", 0, T+10_000, 0)
	})
	t.Run("the hold is unit over rate when longer than the validity", func(t *testing.T) {
		// rate 0.5/s, unit 8: unit/rate 16 s, longer than the validity;
		// 5/20 s is shorter, so the estimate holds for the whole hold.
		r := newHeldRig(t, 1, KeyLimit{Rate: 0.5, Burst: 16, Unit: 8})
		r.read(T, 20, time.Second)
		r.read(T+1000, 0, time.Second)
		r.expect("held at the estimate", 0, T+1000, 20, T+15_999, 20)
		r.expect("past the hold", 0, T+16_000, 0)
	})
	t.Run("an estimate under twice the floor is held at twice the floor", func(t *testing.T) {
		// rate 1000/s: floor 1/s; a reading of 1.5/s is above it.
		r := newHeldRig(t, 1, KeyLimit{Rate: 1000, Burst: 1000})
		r.read(T, 3, 2*time.Second)
		r.read(T+1000, 0, time.Second)
		r.expect("held", 0, T+1000, 2)
	})
	t.Run("the estimate after the reading is what is held", func(t *testing.T) {
		// alpha 0.5: readings 10, then 4 make the estimate 7, which the
		// empty readings after halve to below the floor (1e-5) while the
		// hold (unit/rate, 100 s) runs.
		r := newHeldRig(t, 0.5, KeyLimit{Rate: 0.01, Burst: 1})
		r.read(T, 10, time.Second)
		r.read(T+1000, 4, time.Second)
		n := T + 1000
		for range 25 {
			n += 1000
			r.read(n, 0, time.Second)
		}
		rv := r.view(n)
		if !closeTo(rv.HeldDemand, 7) || rv.Demand > unitDemandFloor*0.01 {
			t.Errorf("HeldDemand %v (Demand %v) after 25 empty readings; want the estimate 7 after the last reading above the floor", rv.HeldDemand, rv.Demand)
		}
	})
	t.Run("an estimate above the floor is taken as it is", func(t *testing.T) {
		// alpha 0.5: after a reading of 10, empty readings halve the
		// estimate (5, 2.5), still above the floor: no hold lifts it.
		r := newHeldRig(t, 0.5, KeyLimit{Rate: 0.5, Burst: 10})
		r.read(T, 10, time.Second)
		r.read(T+1000, 0, time.Second)
		r.expect("half", 5, T+1000, 5)
		r.read(T+2000, 0, time.Second)
		r.expect("a quarter", 2.5, T+2000, 2.5, T+9000, 2.5)
	})
	t.Run("a reading at the floor is none", func(t *testing.T) {
		// rate 1/s, floor 0.001/s: a reading of 1 request in 1000 s is
		// at the floor, so it neither starts a hold nor ends one.
		r := newHeldRig(t, 1, KeyLimit{Rate: 1, Burst: 10})
		r.read(T, 1, 1000*time.Second)
		r.read(T+1000, 0, time.Second)
		r.expect("never asked above the floor", 0, T+1000, 0)
		r.read(T+2000, 0.5, 1000*time.Second)
		r.expect("never asked above the floor", 0.0005, T+2000, 0.0005)
		r.read(T+3000, 2, time.Second)
		// The key slips out of the report (an estimate of 0), then
		// reads exactly the floor: still held at 2.
		r.report("us-east", T+4000)
		r.read(T+5000, 1, 1000*time.Second)
		r.expect("a reading at the floor", unitDemandFloor, T+5000, 2)
	})
}

// heldDemandOf is region i's HeldDemand of key at ms n.
func heldDemandOf(t *testing.T, a *Allocator, key quota.Key, i, n int) float64 {
	t.Helper()
	for _, kv := range a.View(ms(n)).Keys {
		if kv.Key == key {
			return kv.Regions[i].HeldDemand
		}
	}
	t.Fatalf("key %v not in the view", key)
	return 0
}

// TestHeldDemandBelongsToItsKeyAndRegion: the hold is remembered per key
// and region, and only for readings the Allocator saw. A key new to the
// Allocator (in a fresh slot or in a removed key's), a region new to it
// and every region after a change of leader have asked for nothing; a
// region the config keeps, and a key that compaction moves, keep their
// hold and the estimate it holds.
func TestHeldDemandBelongsToItsKeyAndRegion(t *testing.T) {
	// A reading of 10/s at T of a key of 0.5/s holds us-east at 10
	// until T + 2 s (unit/rate); every check below falls within that.
	const T = 1000 // ms: within the first hold since the Allocator began
	lim := KeyLimit{Rate: 0.5, Burst: 10}
	asked := quota.Key{Tenant: "acme", Class: "read"}
	setup := func(t *testing.T) *heldRig {
		r := newHeldRig(t, 1, lim)
		r.read(T, 10, time.Second)
		r.read(T+200, 0, time.Second)
		if got := heldDemandOf(t, r.a, asked, 1, T+300); got != 10 {
			t.Fatalf("us-east's HeldDemand %v after reading 10/s then none; want 10", got)
		}
		return r
	}
	t.Run("a new key", func(t *testing.T) {
		r := setup(t)
		fresh := quota.Key{Tenant: "acme", Class: "fresh"}
		if err := r.a.SetLimit(fresh, lim); err != nil {
			t.Fatal(err)
		}
		// eu-west's reading of none puts the key in the view.
		r.report("eu-west", T+250, KeyDemand{Key: fresh, Window: time.Second})
		for i := range 2 {
			if got := heldDemandOf(t, r.a, fresh, i, T+300); got != 0 {
				t.Errorf("region %d's HeldDemand of a key no region read %v; want 0", i, got)
			}
		}
	})
	t.Run("a key in a removed key's slot", func(t *testing.T) {
		r := setup(t)
		r.a.RemoveKey(asked)
		next := quota.Key{Tenant: "acme", Class: "next"}
		if err := r.a.SetLimit(next, lim); err != nil {
			t.Fatal(err)
		}
		r.report("eu-west", T+250, KeyDemand{Key: next, Window: time.Second})
		if got := heldDemandOf(t, r.a, next, 1, T+300); got != 0 {
			t.Errorf("us-east's HeldDemand of a key added after the one it read was removed: %v; want 0", got)
		}
	})
	t.Run("a new leader", func(t *testing.T) {
		r := setup(t)
		r.a.BecomeLeader(ms(T + 250))
		r.report("eu-west", T+250, KeyDemand{Key: asked, Window: time.Second})
		if got := heldDemandOf(t, r.a, asked, 1, T+300); got != 0 {
			t.Errorf("us-east's HeldDemand after a change of leader: %v; want 0 (the new leader saw no reading)", got)
		}
	})
	t.Run("a region change", func(t *testing.T) {
		r := setup(t)
		// ap-south is new and comes first; us-east keeps its hold.
		regions := []Region{{Name: "ap-south", Weight: 1}, {Name: "eu-west", Weight: 1}, {Name: "us-east", Weight: 1}}
		if err := r.a.SetRegions(regions); err != nil {
			t.Fatal(err)
		}
		for i, want := range []float64{0, 0, 10} {
			if got := heldDemandOf(t, r.a, asked, i, T+300); got != want {
				t.Errorf("%s's HeldDemand after the region change: %v; want %v", regions[i].Name, got, want)
			}
		}
	})
	t.Run("compaction", func(t *testing.T) {
		old := compactMin
		compactMin = 4
		t.Cleanup(func() { compactMin = old })
		r := setup(t)
		// Nine keys more, the asked one re-added after them (slot 9),
		// then all nine removed: compaction moves it to a lower slot.
		var noise []quota.Key
		for i := range 9 {
			k := quota.Key{Tenant: "noise", Class: string(rune('a' + i))}
			noise = append(noise, k)
			if i == 8 {
				r.a.RemoveKey(asked)
			}
			if err := r.a.SetLimit(k, lim); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.a.SetLimit(asked, lim); err != nil {
			t.Fatal(err)
		}
		// Past the first hold since the Allocator began (10 s): a
		// hold that compaction dropped would have ended.
		r.read(15_400, 10, time.Second)
		r.read(15_500, 0, time.Second)
		before := r.a.keyIndex[asked]
		for _, k := range noise {
			r.a.RemoveKey(k)
		}
		if after := r.a.keyIndex[asked]; after == before {
			t.Fatalf("the key stayed in slot %d; want compaction to move it", after)
		}
		if got := heldDemandOf(t, r.a, asked, 1, 15_600); got != 10 {
			t.Errorf("us-east's HeldDemand after compaction: %v; want 10", got)
		}
	})
}

// TestHeldRegionMakesTheKeyContendedAtItsReport: a region without a
// static unit of a slow key that read a request while the Allocator was
// learning, and reads none in its first report after learning, still
// counts as asking (within the hold): the key is contended from that
// report on, as one reading the request then would make it, not only
// from the next Allocate.
func TestHeldRegionMakesTheKeyContendedAtItsReport(t *testing.T) {
	r := newHeldRig(t, 1, KeyLimit{Rate: 1.0 / 60, Burst: 1})
	// Learning ends at 10 s; the unit is eu-west's static burst.
	r.read(9_000, 1, time.Second)
	if kv := r.a.View(ms(9_000)).Keys[0]; kv.Active {
		t.Fatalf("the key is active while learning: %+v", kv)
	}
	r.read(10_500, 0, time.Second)
	kv := r.a.View(ms(10_500)).Keys[0]
	if !kv.Contended || kv.Regions[1].HeldDemand <= unitDemandFloor/60 {
		t.Fatalf("after us-east's empty reading within the hold: contended %v, HeldDemand %v; want contended, us-east asking", kv.Contended, kv.Regions[1].HeldDemand)
	}
}

// TestAReadingAtTheFloorKeepsTheKeyContended: the allocation, like the
// View, takes a reading of exactly the unit floor (0.1% of the rate) as
// none: a region that asked within the hold still counts as asking, and
// the key stays contended.
func TestAReadingAtTheFloorKeepsTheKeyContended(t *testing.T) {
	// rate 1/64 per s: the floor, 1/64000 per s, is one request in
	// 64000 s to the bit.
	r := newHeldRig(t, 1, KeyLimit{Rate: 1.0 / 64, Burst: 1})
	r.read(20_000, 1, time.Second)
	r.a.Allocate(ms(21_000))
	r.report("us-east", 21_100) // the key slips out: its estimate is 0
	r.read(22_100, 1, 64000*time.Second)
	r.a.Allocate(ms(23_000))
	kv := r.a.View(ms(23_000)).Keys[0]
	if rv := kv.Regions[1]; rv.Demand != unitDemandFloor/64 {
		t.Fatalf("us-east's estimate %v, want exactly the floor %v", rv.Demand, unitDemandFloor/64)
	}
	if !kv.Contended {
		t.Fatalf("after a reading at the floor within the hold: the key is not contended; want us-east still asking")
	}
}

// TestTheHoldOfAVerySlowKeyIsCapped: a key so slow that refilling one
// unit takes longer than math.MaxInt64/8 ns (about 36.5 years) holds a
// region that asked for exactly that long, and one whose unit/rate does
// not even fit in an int64 is held as long, not cut to the validity; a
// unit/rate of exactly 2^60 ns is capped too.
func TestTheHoldOfAVerySlowKeyIsCapped(t *testing.T) {
	const T = 20_000                          // ms, after learning
	const capMS = math.MaxInt64 / 8 / 1000000 // the cap, in whole ms (its last 0.85 ms left out)
	t.Run("unit over rate above the cap", func(t *testing.T) {
		// unit/rate 5e9 s, 5e18 ns: within an int64, above the cap.
		r := newHeldRig(t, 1, KeyLimit{Rate: 2e-10, Burst: 1})
		r.read(T, 10, time.Second)
		r.read(T+500, 0, time.Second)
		r.expect("held", 0, T+500, 10, T+capMS, 10)
		r.expect("past the cap", 0, T+capMS+1, 0)
	})
	t.Run("unit over rate beyond an int64", func(t *testing.T) {
		// unit/rate 1e12 s, 1e21 ns.
		r := newHeldRig(t, 1, KeyLimit{Rate: 1e-12, Burst: 1})
		r.read(T, 10, time.Second)
		r.read(T+500, 0, time.Second)
		r.expect("held past the validity", 0, T+10_000, 10, T+capMS, 10)
		r.expect("past the cap", 0, T+capMS+1, 0)
	})
	t.Run("unit over rate exactly the cap", func(t *testing.T) {
		// unit/rate 2^60 ns exactly, one more than the cap as an int64:
		// the hold is the cap, to the nanosecond.
		r := newHeldRig(t, 1, KeyLimit{Rate: 1e9 / (1 << 30), Burst: 1 << 30, Unit: 1 << 30})
		r.read(T, 10, time.Second)
		r.read(T+500, 0, time.Second)
		end := ms(T).Add(math.MaxInt64 / 8)
		for _, c := range []struct {
			at     time.Time
			asking bool
		}{{end.Add(-1), true}, {end, false}} {
			kv := r.a.View(c.at).Keys[0].Regions[1]
			if asking := kv.HeldDemand > 0; asking != c.asking {
				t.Errorf("%v after the reading: HeldDemand %v, want asking %v (the hold ends %v after it)",
					c.at.Sub(ms(T)), kv.HeldDemand, c.asking, time.Duration(math.MaxInt64/8))
			}
		}
	})
}
