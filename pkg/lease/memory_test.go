package lease

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/memtest"
	"github.com/sluicehq/sluice/pkg/quota"
)

func heapReturned(t *testing.T, base, slack int64, what string) {
	t.Helper()
	now := memtest.HeapAlloc()
	t.Logf("%s: heap %+.1f MiB from the baseline", what, float64(now-base)/(1<<20))
	if now-base > slack {
		t.Fatalf("%s: heap is %.1f MiB above the baseline, want at most %.1f MiB", what,
			float64(now-base)/(1<<20), float64(slack)/(1<<20))
	}
}

func memoryKeys(t *testing.T, n int) []quota.Key {
	if testing.Short() {
		n /= 10
	}
	keys := make([]quota.Key, n)
	for i := range keys {
		keys[i] = quota.Key{Tenant: fmt.Sprintf("t%07d", i), Class: "write"}
	}
	return keys
}

// syncUntilIdle runs periodic Syncs step apart, answering each with
// answer (nil: the region is unreachable), until the table is empty or
// rounds run out. It returns the final reports gathered for Release.
func syncUntilIdle(t *testing.T, tb *Table, from time.Time, step time.Duration, rounds int, answer func(*sluicev1.KeyReport) *sluicev1.Grant) (time.Time, int) {
	t.Helper()
	now, released := from, 0
	for range rounds {
		if tb.Len() == 0 {
			break
		}
		now = now.Add(step)
		syncs, release := tb.PrepareSync(now)
		for _, b := range syncs {
			if answer == nil {
				tb.Failed(now, b)
				continue
			}
			gs := make([]*sluicev1.Grant, len(b.Reports))
			for i, r := range b.Reports {
				gs[i] = answer(r)
			}
			if err := tb.Apply(now, b, gs); err != nil {
				t.Fatal(err)
			}
		}
		if release != nil {
			released += len(release.Reports)
		}
	}
	return now, released
}

// TestKeyMapGivesMemoryBack: 200,000 distinct keys are asked for once and
// never again (the region is not even asked). One Sync after IdleTimeout
// forgets them all, and the memory they took comes back.
func TestKeyMapGivesMemoryBack(t *testing.T) {
	const idle = time.Second
	tb := newTestTable(t, func(o *TableOptions) { o.IdleTimeout = idle })
	base := memtest.HeapAlloc()
	keys := memoryKeys(t, 200_000)
	for _, k := range keys {
		if _, act := allow(t, tb, t0, k, 1); act != ActAcquire {
			t.Fatalf("first request on %s: action %v, want acquire", k, act)
		}
	}
	if tb.Len() != len(keys) {
		t.Fatalf("table holds %d keys, want %d", tb.Len(), len(keys))
	}
	_, released := syncUntilIdle(t, tb, t0, idle, 2, nil)
	if tb.Len() != 0 || released != 0 {
		t.Fatalf("after idling: %d keys held, %d final reports; want none", tb.Len(), released)
	}
	keys = nil
	heapReturned(t, base, 4<<20, "table emptied")
	runtime.KeepAlive(tb)
}

// TestIdleKeysGiveMemoryBack: distinct keys each get a lease and spend
// from it, then fall idle. Every one is released with a final report once
// idle for IdleTimeout, and the memory they took comes back.
func TestIdleKeysGiveMemoryBack(t *testing.T) {
	const idle = time.Second
	tb := newTestTable(t, func(o *TableOptions) { o.IdleTimeout = idle })
	base := memtest.HeapAlloc()
	keys := memoryKeys(t, 20_000)
	for _, k := range keys {
		acquire(t, tb, t0, t0, k, 1, 2)
		if _, act := allow(t, tb, t0, k, 1); act != ActNone && act != ActRefill {
			t.Fatalf("spending from a fresh lease on %s: action %v", k, act)
		}
	}
	if tb.Len() != len(keys) {
		t.Fatalf("table holds %d keys, want %d", tb.Len(), len(keys))
	}
	_, released := syncUntilIdle(t, tb, t0, idle, 4, func(r *sluicev1.KeyReport) *sluicev1.Grant {
		return regionGrant(r, 0)
	})
	if tb.Len() != 0 || released != len(keys) {
		t.Fatalf("after idling: %d keys held, %d released; want 0 held, %d released", tb.Len(), released, len(keys))
	}
	keys = nil
	heapReturned(t, base, 4<<20, "table emptied")
	runtime.KeepAlive(tb)
}

// TestIdleKeysForgottenWhileRegionUnreachable: while the region cannot be
// reached, every key decided by its on_failure policy has a report that is
// never acknowledged. Keys without a lease at the region are still
// forgotten once idle, so an outage does not keep every key seen during it;
// a key holding a lease is kept until its report gets through.
func TestIdleKeysForgottenWhileRegionUnreachable(t *testing.T) {
	const idle = time.Second
	tb := newTestTable(t, func(o *TableOptions) { o.IdleTimeout = idle })
	acquire(t, tb, t0, t0, kR, 1, 5) // leased before the outage
	allow(t, tb, t0, kR, 1)
	base := memtest.HeapAlloc()
	keys := memoryKeys(t, 20_000)
	for _, k := range keys {
		if _, act := allow(t, tb, t0, k, 1); act != ActAcquire {
			t.Fatalf("first request on %s: action %v, want acquire", k, act)
		}
		if d, err := tb.Fallback(t0, k, 1); err != nil || !d.Degraded {
			t.Fatalf("fallback on %s: %+v, %v", k, d, err)
		}
	}
	now, released := syncUntilIdle(t, tb, t0, idle, 4, nil)
	if released != 0 {
		t.Fatalf("%d final reports for keys the region holds no lease for", released)
	}
	if tb.Len() != 1 || tb.DegradedKeys() != 0 {
		t.Fatalf("after idling through the outage: %d keys held (%d degraded), want only the leased one", tb.Len(), tb.DegradedKeys())
	}
	st := state(t, tb, kR)
	if st.Pending == nil || st.Pending.Used != 1 {
		t.Fatalf("the leased key's unacknowledged report was lost: %+v", st.Pending)
	}
	keys = nil
	heapReturned(t, base, 4<<20, "outage keys forgotten")

	// The region answers again: the leased key reports, then is released.
	_, released = syncUntilIdle(t, tb, now, idle, 4, func(r *sluicev1.KeyReport) *sluicev1.Grant {
		return regionGrant(r, 0)
	})
	if tb.Len() != 0 || released != 1 {
		t.Fatalf("after the outage: %d keys held, %d released; want 0 and 1", tb.Len(), released)
	}
}

// heldKeys is how many keys TestMemoryPerHeldKey holds: 100,000 (10,000
// under -short).
func heldKeys(t *testing.T) int {
	if testing.Short() {
		return 10_000
	}
	return 100_000
}

// maxHeldKeyBytes bounds the heap per held key: its entry (208 B), its
// published info (112 B), its share of the key index (about 30 B) and its
// name come to about 360 B (365 B at -short's 10,000 keys; 328 B before
// the entry followed the region's demand window, mirrorWindowLocked, and
// the drain's window; 511 B before the rare state moved out of the entry,
// the info's times became instants, the flags one word and the index
// stored hashes instead of keys; 911 B before the info was kept once),
// with about 10% to spare.
const maxHeldKeyBytes = 400

// TestMemoryPerHeldKey: the heap an instance spends per key it holds a
// lease on (acquired, answered, spent from), its name included, measured
// as the live-heap increase over heldKeys keys. BENCHMARKS.md ("Memory
// per key") records the figure.
func TestMemoryPerHeldKey(t *testing.T) {
	tb := newTestTable(t)
	n := heldKeys(t)
	base := memtest.HeapAlloc()
	for i := range n {
		k := quota.Key{Tenant: fmt.Sprintf("t%07d", i), Class: "write"}
		acquire(t, tb, t0, t0, k, 1, 20)
		if _, act := allow(t, tb, t0, k, 1); act != ActNone && act != ActRefill {
			t.Fatalf("spending from a fresh lease on %s: action %v", k, act)
		}
	}
	// Reads of keys the published snapshot lacks publish it: the steady
	// state, with one map.
	tb.keys.publish()
	per := float64(memtest.HeapAlloc()-base) / float64(n)
	t.Logf("%d held keys: %.1f B per held key", n, per)
	if per > maxHeldKeyBytes {
		t.Errorf("%.1f B per held key, want at most %d", per, maxHeldKeyBytes)
	}
	if tb.Len() != n {
		t.Fatalf("table holds %d keys, want %d", tb.Len(), n)
	}
	runtime.KeepAlive(tb)
}
