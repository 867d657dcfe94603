package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestBatchCapOfAFractionalBurstIsOneToken: a static share can split a
// small burst into less than one token for a region (see WaitCures); a
// lone instance's batch cap is then one token, not zero, so the single token the region grants is the pool at its cap:
// neither the grant nor the periodic Sync gives it back.
func TestBatchCapOfAFractionalBurstIsOneToken(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 1, peerGrant(0.5, 1))
	if tb.giveBackDue.Load() {
		t.Fatal("give-back due after a grant of 1 on a region burst of 0.5; want none (the cap is 1)")
	}
	if b := tb.PrepareRefill(t0); b != nil {
		t.Fatalf("early refill after a grant of 1 on a burst of 0.5: %v, want none", b.Reports)
	}
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	if len(syncs) != 1 {
		t.Fatalf("syncs %v, want one", syncs)
	}
	if r := syncs[0].Reports[0]; r.Returned != 0 || state(t, tb, kW).Tokens != 1 {
		t.Fatalf("Sync of a pool of 1 at a cap of 1: returned %d, pool %d; want the token kept", r.Returned, state(t, tb, kW).Tokens)
	}
}

// TestAPeerOnASmallBurstLeavesEachInstanceOneToken: with n live instances
// the batch cap is floor(burst/2n) but at least one token, so when a peer
// joins a key of burst 3 (floor(3/4) = 0), a pool of one token is at the
// cap and nothing is given back early; a pool of two gives one back.
func TestAPeerOnASmallBurstLeavesEachInstanceOneToken(t *testing.T) {
	for _, tc := range []struct {
		pool     int64
		giveBack bool
	}{
		{pool: 1, giveBack: false},
		{pool: 2, giveBack: true},
	} {
		// A slow key (3 an hour): the lone instance's demand (a token
		// spent) drains the region, so its batch cap is the whole burst
		// until the peer joins.
		slow := func(live int64) func(*sluicev1.Grant) {
			return func(g *sluicev1.Grant) { peerGrant(3, live)(g); g.RegionRate = 3.0 / 3600 }
		}
		tb := newTestTable(t)
		acquire(t, tb, t0, t0, kW, tc.pool+1, tc.pool+1, slow(1))
		if d, _ := allow(t, tb, t0, kW, 1); !d.Allowed {
			t.Fatalf("spending one of the pool: %+v", d)
		}
		tb.giveBackDue.Store(false)
		syncAnswered(t, tb, t0.Add(time.Second), slow(2))
		if due := tb.giveBackDue.Load(); due != tc.giveBack {
			t.Errorf("pool %d when a peer joins a key of burst 3: give-back due %v, want %v", tc.pool, due, tc.giveBack)
		}
	}
}
