package hierarchy

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestGrantedKeyMissingFromReportsKeepsCounting: a region that holds a
// grant above its static share for a key and then leaves the key out of its
// reports (its Redis Cluster master failed: the region leader cannot read
// the key's state, nor install what is granted for it) is still counted at
// that grant until the grant expires, then at its static share; the other
// region, whose demand rises meanwhile, is never given what the first may
// still use. A key missing from a report is zero demand for the estimate,
// nothing more: the fence keeps its candidates (Report touches only the
// fences of the keys reported, and prunes only records surely expired).
// Checked at every millisecond: Σ usable rates ≤ r and Σ caps ≤ b, each
// region using the grant it installed while valid (on its own clock, from
// its report's send time), else its static share.
func TestGrantedKeyMissingFromReportsKeepsCounting(t *testing.T) {
	start := testStart
	const epoch, validity = 100 * time.Millisecond, 500 * time.Millisecond
	al, err := NewAllocator(Options{Regions: twoRegions(), Epoch: epoch, Validity: validity}, start)
	if err != nil {
		t.Fatal(err)
	}
	key, other, holds := contendedPair(t, al)
	seq := map[string]uint64{}
	// report sends region's report at `at` with demand on key (left out
	// when omit) and 80/s on other, echoing what it holds, and installs
	// the answer's grants (key's only when it is reported: a region that
	// cannot read a key cannot install its grant either).
	report := func(at time.Time, region string, demand float64, omit bool) {
		t.Helper()
		var kds []KeyDemand
		for _, k := range []quota.Key{key, other} {
			if k == key && omit {
				continue
			}
			kd := KeyDemand{Key: k, Window: epoch}
			kd.SetDemandRate(80)
			if k == key {
				kd.SetDemandRate(demand)
			}
			holds[region][k].echo(&kd, at)
			kds = append(kds, kd)
		}
		seq[region]++
		ans, err := al.Report(at, Report{Region: region, Seq: seq[region], Keys: kds})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range ans.Grants {
			if g.Key == key && omit {
				continue
			}
			holds[region][g.Key] = installedGrant{g, at.Add(g.Valid)}
		}
	}
	usable := func(at time.Time, region string) (rate, burst float64) {
		if h := holds[region][key]; h.end.After(at) {
			return h.g.Rate, h.g.Burst
		}
		return 50, 50
	}
	at := start
	// a wants nearly all of key, b little: a is granted above its share.
	for range 20 {
		at = at.Add(epoch)
		al.Allocate(at)
		report(at, "a", 95, false)
		report(at, "b", 5, false)
	}
	aHeld := holds["a"][key]
	if aHeld.g.Rate <= 60 || !aHeld.end.After(at.Add(epoch)) {
		t.Fatalf("a holds %+v until %v at %v; want a grant well above its 50/s share", aHeld.g, aHeld.end.Sub(start), at.Sub(start))
	}
	// From now a leaves key out of every report; b wants nearly all of it.
	// b reports every 20ms, a every epoch; checked every millisecond for
	// three validities.
	omitFrom := at
	maxB := 0.0
	for ms := 1; ms <= int(3*validity/time.Millisecond); ms++ {
		at = omitFrom.Add(time.Duration(ms) * time.Millisecond)
		if ms%int(epoch/time.Millisecond) == 0 {
			al.Allocate(at)
			report(at, "a", 0, true)
		}
		if ms%20 == 0 {
			report(at, "b", 95, false)
		}
		ar, ab := usable(at, "a")
		br, bb := usable(at, "b")
		if ar+br > 100*(1+1e-9) || ab+bb > 100*(1+1e-9) {
			t.Fatalf("at %v after a left key out (a's grant %+v ends at %v): a uses %v/s cap %v, b %v/s cap %v: above 100",
				at.Sub(omitFrom), aHeld.g, aHeld.end.Sub(omitFrom), ar, ab, br, bb)
		}
		maxB = max(maxB, br)
	}
	// Once a's grant ended a runs on its static share, which b gets the
	// rest beside: the key is not frozen.
	if maxB < 50*(1-1e-9) {
		t.Fatalf("b got at most %v/s after a's grant ended; want its 50/s share beside a's static 50/s", maxB)
	}
}
