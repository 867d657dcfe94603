package hierarchy

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestUnrecordedGrantAcknowledgedLaterKeepsItsFallback: a grant at a
// region's static share keeps no record once the key's block is freed, but
// the region runs it until it expires. When the key is contended again,
// the region's reports echo that grant, which the allocator cannot place
// (a pseudo record), and then acknowledge it. The region may fall back to
// its static share whenever that grant ends, whatever newer, lower grants
// were sent to it and lost: the other region must not be given the static
// share's room before a lower grant is acknowledged. Before the fix the
// pseudo record's lower expiry bound was "never": once the pseudo record
// had expired, b was counted at a lost lower grant until that grant's
// lower expiry bound (the send-time bound of b's report, which another
// key's acknowledgement had made recent, plus the validity) in every
// summary worked out then (here at config reloads that change only the
// key's partition share), and a got 77/s beside
// b's static 50/s. sim/live's drain-and-restore run found it (Σ rates
// 1.02 r, once in about 400 runs).
func TestUnrecordedGrantAcknowledgedLaterKeepsItsFallback(t *testing.T) {
	start := testStart
	al, err := NewAllocator(Options{Regions: twoRegions(), Epoch: 100 * time.Millisecond, Validity: 500 * time.Millisecond}, start)
	if err != nil {
		t.Fatal(err)
	}
	// key is the one checked; other stays contended, so that every report
	// of b acknowledges a grant answered at its previous report.
	key, other, holds := contendedPair(t, al)
	seq := map[string]uint64{}
	// report sends region's report at `at` (echoing the grants it holds,
	// and demand on key; other always at 80/s) and returns the answer's
	// grant of key. The region installs key's grant only when install is
	// set (otherwise that part of the answer is lost).
	report := func(at time.Time, region string, demand float64, install bool) Grant {
		t.Helper()
		var kds []KeyDemand
		for _, k := range []quota.Key{key, other} {
			kd := KeyDemand{Key: k, Window: 100 * time.Millisecond}
			if k == key {
				kd.SetDemandRate(demand)
			} else {
				kd.SetDemandRate(80)
			}
			holds[region][k].echo(&kd, at)
			kds = append(kds, kd)
		}
		seq[region]++
		ans, err := al.Report(at, Report{Region: region, Seq: seq[region], Keys: kds})
		if err != nil {
			t.Fatal(err)
		}
		var got Grant
		for _, g := range ans.Grants {
			if g.Key == key {
				got = g
				if !install {
					continue
				}
			}
			holds[region][g.Key] = installedGrant{g, at.Add(g.Valid)}
		}
		return got
	}
	at := start
	// Contended, equal demand: grants at the static shares.
	for range 10 {
		at = at.Add(100 * time.Millisecond)
		al.Allocate(at)
		report(at, "a", 80, true)
		report(at, "b", 80, true)
	}
	// key quiet until it keeps no fencing state; b's last grant of it, at
	// its static share, is still live.
	for quiet := 0; ; quiet++ {
		if quiet == 50 {
			t.Fatalf("the quiet key still has fencing state: %+v", al.View(at).Keys)
		}
		at = at.Add(100 * time.Millisecond)
		al.Allocate(at)
		if v := al.View(at); !v.Keys[keyIndex(t, v, key)].Active {
			break
		}
		report(at, "a", 1, true)
		report(at, "b", 1, true)
	}
	bHeld := holds["b"][key]
	if !nearStatic(bHeld.g.Rate, 50) || !bHeld.end.After(at.Add(20*time.Millisecond)) {
		t.Fatalf("b holds %+v until %v; want a grant at its 50/s share, live after %v", bHeld.g, bHeld.end.Sub(start), at.Sub(start))
	}
	// Let b's grant of key run down to its last 150ms, b reporting other
	// (and echoing key's grant) meanwhile.
	for at.Add(150 * time.Millisecond).Before(bHeld.end) {
		at = at.Add(20 * time.Millisecond)
		report(at, "b", 1, true)
	}
	// a wants it all; b, still on its old grant, asks little, and the
	// grants of key sent to b are lost.
	report(at, "a", 100, true)
	report(at.Add(5*time.Millisecond), "b", 1, false)
	report(at.Add(10*time.Millisecond), "b", 1, false)
	// b's grant ends and b runs its static 50/s from then on. Configs
	// are applied meanwhile that change only the key's partition share
	// (no region is off its static lease, so nothing either may use
	// changes), each of which works out the key's summaries afresh.
	floor := 0.0
	for at = bHeld.end; at.Before(bHeld.end.Add(time.Second)); at = at.Add(10 * time.Millisecond) {
		al.Allocate(at)
		floor = 0.5 - floor
		if err := al.SetLimit(key, KeyLimit{Rate: 100, Burst: 100, FloorShare: floor}); err != nil {
			t.Fatal(err)
		}
		if g := report(at, "a", 100, true); g.Rate+50 > 100*(1+1e-9) {
			t.Fatalf("at %v (b on its static 50/s since %v) a got %+v: %v/s in force", at.Sub(start), bHeld.end.Sub(start), g, g.Rate+50)
		}
	}
}

// keyIndex is the index of k in the view's keys.
func keyIndex(t *testing.T, v View, k quota.Key) int {
	t.Helper()
	for i, kv := range v.Keys {
		if kv.Key == k {
			return i
		}
	}
	t.Fatalf("key %v not in the view", k)
	return -1
}

// installedGrant is a grant a region installed, and when it ends on the
// region's clock.
type installedGrant struct {
	g   Grant
	end time.Time
}

// echo puts in kd what a region holding h reports at at: the grant while it
// lasts on the region's clock, nothing after.
func (h installedGrant) echo(kd *KeyDemand, at time.Time) {
	if h.end.After(at) {
		kd.HeldRate, kd.HeldBurst, kd.HeldValid = h.g.Rate, h.g.Burst, h.end.Sub(at)
	}
}

// contendedPair gives al two keys of 100/s, burst 100, t/write (the one a
// test checks) and o/write, and an empty record of the grants regions a and
// b hold.
func contendedPair(t *testing.T, al *Allocator) (key, other quota.Key, holds map[string]map[quota.Key]installedGrant) {
	t.Helper()
	key, other = quota.Key{Tenant: "t", Class: "write"}, quota.Key{Tenant: "o", Class: "write"}
	for _, k := range []quota.Key{key, other} {
		if err := al.SetLimit(k, KeyLimit{Rate: 100, Burst: 100}); err != nil {
			t.Fatal(err)
		}
	}
	return key, other, map[string]map[quota.Key]installedGrant{"a": {}, "b": {}}
}
