package hierarchy

import (
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/memtest"
	"github.com/sluicehq/sluice/pkg/quota"
)

func noiseKeys(n int) []quota.Key {
	keys := make([]quota.Key, n)
	for i := range keys {
		keys[i] = quota.Key{Tenant: fmt.Sprintf("n%07d", i), Class: "w"}
	}
	return keys
}

// churn drives a: every key in busy reports demand above its static share
// from region a (so it is contended and gets fencing state) for the given
// epochs, starting at epoch from; returns the grants answered.
func churn(t *testing.T, a *Allocator, busy []quota.Key, from, epochs int) [][]Grant {
	t.Helper()
	var out [][]Grant
	for e := from; e < from+epochs; e++ {
		now := testStart.Add(time.Duration(e) * time.Second)
		for _, region := range []string{"a", "b"} {
			rep := Report{Region: region, Seq: uint64(e + 1)}
			for i, k := range busy {
				kd := KeyDemand{Key: k, Window: time.Second}
				if region == "a" {
					kd.Admitted = float64(8 + i%5)
				}
				rep.Keys = append(rep.Keys, kd)
			}
			g, err := grantsOf(a.Report(now, rep))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, g)
		}
		a.Allocate(now)
	}
	return out
}

// TestForgottenKeysGiveMemoryBack: 200,000 keys get demand, contention
// and fencing state, then are removed; the Allocator's memory is back to
// where it was. (TestCompactionChangesNoOutput takes keys through grants
// and their expiry, now advanced, before removing them.)
func TestForgottenKeysGiveMemoryBack(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	a := mustAllocator(t, twoRegions())
	base := memtest.HeapAlloc()
	keys := noiseKeys(n)
	for _, k := range keys {
		if err := a.SetLimit(k, KeyLimit{Rate: 10, Burst: 10}); err != nil {
			t.Fatal(err)
		}
	}
	rep := Report{Region: "a", Seq: 1, Keys: make([]KeyDemand, n)}
	for i, k := range keys {
		rep.Keys[i] = KeyDemand{Key: k, Admitted: 8, Window: time.Second}
	}
	now := testStart.Add(6 * time.Second)
	if _, err := a.Report(now, rep); err != nil {
		t.Fatal(err)
	}
	rep = Report{}
	a.Allocate(now)
	if len(a.active) != n {
		t.Fatalf("%d keys active after demand above the static share, want %d", len(a.active), n)
	}
	for _, k := range keys {
		a.RemoveKey(k)
	}
	keys = nil
	if len(a.keys) >= compactMin || len(a.blockKey) >= compactMin || len(a.keyIndex) != 0 {
		t.Fatalf("after removing every key: %d slots, %d blocks, %d indexed", len(a.keys), len(a.blockKey), len(a.keyIndex))
	}
	left := memtest.HeapAlloc() - base
	t.Logf("heap %+.1f MiB from the baseline", float64(left)/(1<<20))
	if left > 4<<20 {
		t.Fatalf("heap %.1f MiB above the baseline after every key was removed", float64(left)/(1<<20))
	}
	runtime.KeepAlive(a)
}

func countActive(v View) int {
	n := 0
	for _, k := range v.Keys {
		if k.Active {
			n++
		}
	}
	return n
}

// TestCompactionChangesNoOutput: two Allocators see the same calls (keys
// with demand and grants, most of them then silent past their grants'
// expiry and removed); one renumbers its slots and blocks when most keys
// are removed, the other never does. Every later answer and view is the
// same, beginning with one to a report naming none of the keys left.
func TestCompactionChangesNoOutput(t *testing.T) {
	noiseN := 3 * compactMin
	run := func(compact bool) ([][]Grant, View, int) {
		if !compact {
			old := compactMin
			compactMin = 1 << 30
			defer func() { compactMin = old }()
		}
		a := mustAllocator(t, twoRegions())
		stay := []quota.Key{{Tenant: "s1", Class: "w"}, {Tenant: "s2", Class: "w"}, {Tenant: "zz", Class: "w"}}
		noise := noiseKeys(noiseN)
		all := append(append([]quota.Key{}, stay[:2]...), noise...)
		all = append(all, stay[2])
		for _, k := range all {
			if err := a.SetLimit(k, KeyLimit{Rate: 10, Burst: 10}); err != nil {
				t.Fatal(err)
			}
		}
		churn(t, a, all, 6, 3)
		churn(t, a, stay, 9, 2)
		for _, k := range noise {
			a.RemoveKey(k)
		}
		// A report naming no key gets a grant for each contended key,
		// wherever compaction renumbered it.
		g, err := grantsOf(a.Report(testStart.Add(11*time.Second), Report{Region: "b", Seq: 12}))
		if err != nil || len(g) != len(stay) {
			t.Fatalf("b's report naming no key got %v, %v; want a grant for each of %v", g, err, stay)
		}
		out := append([][]Grant{g}, churn(t, a, stay, 12, 7)...)
		v := a.View(testStart.Add(19 * time.Second))
		return out, v, len(a.keys) + len(a.blockKey)
	}
	gotC, viewC, slotsC := run(true)
	gotN, viewN, slotsN := run(false)
	if slotsC > 2*compactMin || slotsN < 2*slotsC {
		t.Fatalf("slots and blocks %d with compaction, %d without: the test does not compare what it means to", slotsC, slotsN)
	}
	granted := 0
	for _, g := range gotC {
		granted += len(g)
	}
	if granted == 0 {
		t.Fatal("no grants after the removal: nothing to compare")
	}
	if !reflect.DeepEqual(gotC, gotN) {
		t.Fatalf("answers differ after compaction:\n%v\nwithout:\n%v", gotC, gotN)
	}
	if !reflect.DeepEqual(viewC, viewN) {
		t.Fatalf("views differ after compaction:\n%+v\nwithout:\n%+v", viewC, viewN)
	}
}

// TestCompactionThresholds: key slots and blocks are renumbered once
// fewer than a quarter of them are in use, and only when there are at
// least compactMin of them: with exactly compactMin, a quarter in use
// keeps them, one fewer renumbers; with one less than compactMin they are
// kept whatever is in use; when none is in use, none is kept.
func TestCompactionThresholds(t *testing.T) {
	setCompactMin(t, 8)
	for _, n := range []int{7, 8} {
		a, keys := contendedKeys(t, n)
		if len(a.keys) != n || len(a.blockKey) != n {
			t.Fatalf("%d keys: %d slots, %d blocks; want a slot and a block each", n, len(a.keys), len(a.blockKey))
		}
		for i, k := range keys[:n-1] {
			a.RemoveKey(k)
			live, want := n-1-i, n
			if n >= compactMin && live < n/4 {
				want = live
			}
			if len(a.keys) != want || len(a.blockKey) != want {
				t.Fatalf("%d keys, %d left: %d slots, %d blocks; want %d", n, live, len(a.keys), len(a.blockKey), want)
			}
		}
	}
	// Four slots, all freed: none is left, and a region's next report,
	// naming the keys in the order of its last, finds them unknown.
	compactMin = 4
	a, keys := contendedKeys(t, 4)
	for _, k := range keys {
		a.RemoveKey(k)
	}
	if len(a.keys) != 0 || len(a.blockKey) != 0 {
		t.Fatalf("every key removed: %d slots, %d blocks; want none", len(a.keys), len(a.blockKey))
	}
	// The answer kept for a retry loses the grants for the removed keys,
	// all of them here.
	if ans, err := a.Report(testStart.Add(7*time.Second), Report{Region: "a", Seq: 7}); err != nil || len(ans.Grants) != 0 {
		t.Fatalf("a retry of a's last report got %+v, %v; want no grant for the removed keys", ans.Grants, err)
	}
	rep := Report{Region: "a", Seq: 8}
	for _, k := range keys {
		rep.Keys = append(rep.Keys, KeyDemand{Key: k, Admitted: 8, Window: time.Second})
	}
	if ans, err := a.Report(testStart.Add(7*time.Second), rep); err != nil || len(ans.Grants) != 0 {
		t.Fatalf("a report naming the removed keys got %+v, %v; want no grant", ans.Grants, err)
	}
	if v := a.View(testStart.Add(7 * time.Second)); v.Regions[0].UnknownKeyCount != len(keys) {
		t.Fatalf("a report naming the removed keys: %d unknown, want %d", v.Regions[0].UnknownKeyCount, len(keys))
	}
}

// setCompactMin sets compactMin for the rest of test t.
func setCompactMin(t *testing.T, n int) {
	t.Helper()
	old := compactMin
	compactMin = n
	t.Cleanup(func() { compactMin = old })
}

// contendedKeys returns an allocator of two regions holding n keys (10/s,
// burst 10) that are all contended, so each has a fencing block.
func contendedKeys(t *testing.T, n int) (*Allocator, []quota.Key) {
	t.Helper()
	a := mustAllocator(t, twoRegions())
	keys := noiseKeys(n)
	for _, k := range keys {
		if err := a.SetLimit(k, KeyLimit{Rate: 10, Burst: 10}); err != nil {
			t.Fatal(err)
		}
	}
	churn(t, a, keys, 6, 1)
	return a, keys
}
