package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// peerGrant: a region of burst burst (rate 1000/s) counting live leases.
func peerGrant(burst float64, live int64) func(*sluicev1.Grant) {
	return func(g *sluicev1.Grant) { g.RegionBurst, g.LiveInstances = burst, live }
}

// syncAnswered sends kW's periodic Sync at at and applies the region's
// answer (nothing granted) with mod; it returns the report sent.
func syncAnswered(t *testing.T, tb *Table, at time.Time, mod ...func(*sluicev1.Grant)) *sluicev1.KeyReport {
	t.Helper()
	syncs, _ := tb.PrepareSync(at)
	if len(syncs) != 1 || len(syncs[0].Reports) != 1 {
		t.Fatalf("Sync at %v: %v, want one report", at.Sub(t0), syncs)
	}
	r := syncs[0].Reports[0]
	if err := tb.Apply(at, syncs[0], []*sluicev1.Grant{regionGrant(r, 0, mod...)}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return r
}

// TestGrantTellingOfAPeerGivesBackAtOnce: a grant that tells of more live
// instances than the one before, while the pool lies above the batch cap
// of the new count (max(1, floor(burst/2n))), makes the next early refill
// report the key at once and give the excess back (docs/architecture.md,
// "A peer of a lone holder"); that report's answer ends it: a pool at the
// cap is no reason for another early report. A pool exactly at the new
// cap, or a count that did not rise, gives nothing back early.
func TestGrantTellingOfAPeerGivesBackAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name          string
		burst         float64 // the burst the Sync's answer tells
		before, after int64   // live instances told by the acquire, then the Sync
		giveBack      bool
	}{
		// A pool of 2 (twice the target of 1: the Sync keeps it).
		{"a peer joins, cap floor(7/4)=1 below the pool", 7, 1, 2, true},
		{"a peer joins, cap floor(8/4)=2 equal to the pool", 8, 1, 2, false},
		{"no peer joins, cap 1 below the pool", 7, 2, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTestTable(t)
			acquire(t, tb, t0, t0, kW, 2, 2, peerGrant(8, tc.before))
			tb.giveBackDue.Store(false)
			at := t0.Add(time.Second)
			if r := syncAnswered(t, tb, at, peerGrant(tc.burst, tc.after)); r.Returned != 0 || r.Want != 0 {
				t.Fatalf("the Sync's report: returned %d, want %d; expected a pool of 2 kept whole, nothing asked", r.Returned, r.Want)
			}
			if due := tb.giveBackDue.Load(); due != tc.giveBack {
				t.Errorf("give-back due %v after the Sync's answer, want %v", due, tc.giveBack)
			}
			b := tb.PrepareRefill(at)
			if !tc.giveBack {
				if b != nil {
					t.Fatalf("early refill with a pool of 2: %v, want none", b.Reports)
				}
				return
			}
			if b == nil || len(b.Reports) != 1 || b.Reports[0].Returned != 1 || state(t, tb, kW).Tokens != 1 {
				t.Fatalf("early refill: %v, pool %d; want one report giving back 1, keeping the cap 1", b, state(t, tb, kW).Tokens)
			}
			if err := tb.Apply(at, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 0, peerGrant(tc.burst, tc.after))}); err != nil {
				t.Fatal(err)
			}
			if b := tb.PrepareRefill(at.Add(time.Millisecond)); b != nil {
				t.Errorf("early refill after the give-back was answered: %v, want none (the pool is at its cap)", b.Reports)
			}
		})
	}
}

// TestGrantTellingOfAPeerCountsItsOwnTokens: the pool judged against the
// new batch cap is the one the grant leaves, its own tokens included: a
// pool at the cap (1 of burst 7 over two instances) that the grant
// telling of the peer fills above it gives the excess back at once.
func TestGrantTellingOfAPeerCountsItsOwnTokens(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 1, peerGrant(8, 1))
	at := t0.Add(100 * time.Millisecond)
	if _, act := allow(t, tb, at, kW, 2); act != ActAcquire {
		t.Fatalf("a request of 2 on a pool of 1: action %v, want acquire", act)
	}
	b, _ := tb.PrepareAcquire(at, kW, 2)
	if b == nil {
		t.Fatal("no acquire for a request of 2 on a pool of 1")
	}
	r := b.Reports[0]
	tb.giveBackDue.Store(false)
	if err := tb.Apply(at, b, []*sluicev1.Grant{regionGrant(r, r.Want, peerGrant(7, 2))}); err != nil {
		t.Fatal(err)
	}
	pool := state(t, tb, kW).Tokens
	if pool != 1+r.Want || !tb.giveBackDue.Load() {
		t.Fatalf("after a grant of %d on a pool of 1 that tells of a peer: pool %d, give-back due %v; want %d and due", r.Want, pool, tb.giveBackDue.Load(), 1+r.Want)
	}
	if b := tb.PrepareRefill(at); b == nil || b.Reports[0].Returned != pool-1 {
		t.Fatalf("early refill: %v; want one report giving back %d, down to the cap 1", b, pool-1)
	}
}

// TestSyncKeepsAPoolAtTheBatchCap: a periodic Sync gives back a pool
// above the batch cap (docs/architecture.md, "Batches of a key several
// instances share"), not one at it: a pool of 2 at a cap of floor(8/4) = 2 (and within twice its
// target) is kept whole.
func TestSyncKeepsAPoolAtTheBatchCap(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 2, 2, peerGrant(8, 2))
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	if len(syncs) != 1 {
		t.Fatalf("syncs %v, want one", syncs)
	}
	if r := syncs[0].Reports[0]; r.Returned != 0 || r.Want != 0 || state(t, tb, kW).Tokens != 2 {
		t.Fatalf("Sync of a pool of 2 at a cap of 2: returned %d, want %d, pool %d; expected the pool kept whole, nothing asked", r.Returned, r.Want, state(t, tb, kW).Tokens)
	}
}
