package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestSyncReturnsOnlyAPoolAboveTwiceItsTarget: a periodic Sync gives back
// the excess of a pool only when it holds more than twice its target (here
// 1 token: no demand measured), and then keeps exactly the target; a pool
// of up to twice the target is kept whole and asks for nothing, and an
// empty one asks for the target.
func TestSyncReturnsOnlyAPoolAboveTwiceItsTarget(t *testing.T) {
	for _, tc := range []struct {
		pool                   int64
		wantWant, wantReturned int64
		wantTokens             int64
	}{
		{pool: 0, wantWant: 1},
		{pool: 1, wantTokens: 1},
		{pool: 2, wantTokens: 2}, // exactly twice the target: kept
		{pool: 3, wantReturned: 2, wantTokens: 1},
		{pool: 6, wantReturned: 5, wantTokens: 1},
	} {
		tb := newTestTable(t)
		acquire(t, tb, t0, t0, kW, 1, tc.pool)
		syncs, _ := tb.PrepareSync(t0.Add(time.Second))
		if len(syncs) != 1 || len(syncs[0].Reports) != 1 {
			t.Fatalf("pool %d: syncs %v, want one report", tc.pool, syncs)
		}
		r := syncs[0].Reports[0]
		st := state(t, tb, kW)
		if r.Want != tc.wantWant || r.Returned != tc.wantReturned || st.Tokens != tc.wantTokens {
			t.Errorf("pool %d: want %d returned %d, pool left %d; want %d, %d, %d",
				tc.pool, r.Want, r.Returned, st.Tokens, tc.wantWant, tc.wantReturned, tc.wantTokens)
		}
	}
}

// TestGrantAnsweredAtItsDeadlineOpensNoLease: a grant whose lease
// (send time + TTL) ends at or before the time it is applied opens no
// lease; its tokens go back to the region instead of into the pool.
func TestGrantAnsweredAtItsDeadlineOpensNoLease(t *testing.T) {
	for _, tc := range []struct {
		recv      time.Duration
		wantLease bool
	}{
		{recv: testTTL - time.Millisecond, wantLease: true},
		{recv: testTTL},
		{recv: testTTL + time.Millisecond},
	} {
		tb := newTestTable(t)
		acquire(t, tb, t0, t0.Add(tc.recv), kW, 3, 3)
		st := state(t, tb, kW)
		wantTokens, wantReturn := int64(0), int64(3)
		if tc.wantLease {
			wantTokens, wantReturn = 3, 0
		}
		if st.HasLease != tc.wantLease || st.Tokens != wantTokens || st.ToReturn != wantReturn {
			t.Errorf("answered at send+%v: lease %v, pool %d, to return %d; want %v, %d, %d",
				tc.recv, st.HasLease, st.Tokens, st.ToReturn, tc.wantLease, wantTokens, wantReturn)
		}
	}
}

// TestGrantSetsCheckClockWithinHalfTheTTL: a lease applied with at most
// half its TTL left (the guard) is served only with the clock compared to
// its deadline; with more than half left the clock-free path serves it.
func TestGrantSetsCheckClockWithinHalfTheTTL(t *testing.T) {
	for _, tc := range []struct {
		recv      time.Duration
		wantCheck bool
	}{
		{recv: testTTL/2 - 100*time.Millisecond},
		{recv: testTTL / 2},
		{recv: testTTL/2 + time.Millisecond, wantCheck: true},
	} {
		tb := newTestTable(t)
		acquire(t, tb, t0, t0.Add(tc.recv), kW, 3, 3)
		if st := state(t, tb, kW); !st.HasLease || st.CheckClock != tc.wantCheck {
			t.Errorf("answered at send+%v: lease %v, check clock %v; want true, %v", tc.recv, st.HasLease, st.CheckClock, tc.wantCheck)
		}
	}
}

// TestRefillWaitsUntilTheRegionsRetryTime: a key the region told to wait
// (nothing granted, retry after 200ms) gets no early report before that
// time and gets one from that time on.
func TestRefillWaitsUntilTheRegionsRetryTime(t *testing.T) {
	for _, tc := range []struct {
		at     time.Duration
		wantRe bool
	}{
		{at: 199 * time.Millisecond},
		{at: 200 * time.Millisecond, wantRe: true},
	} {
		tb := newTestTable(t)
		acquire(t, tb, t0, t0, kW, 1, 0, func(g *sluicev1.Grant) { g.RetryAfterMs = 200 })
		if st := state(t, tb, kW); !st.HasLease || st.Tokens != 0 || !st.NegUntil.Equal(t0.Add(200*time.Millisecond)) {
			t.Fatalf("after the wait answer: lease %v, pool %d, wait until %v", st.HasLease, st.Tokens, st.NegUntil.Sub(t0))
		}
		if b := tb.PrepareRefill(t0.Add(tc.at)); (b != nil) != tc.wantRe {
			t.Errorf("at %v: early report %v, want %v", tc.at, b != nil, tc.wantRe)
		}
	}
}

// TestAcquireNotNeededWhenThePoolCoversTheCost: a leased pool holding
// exactly the request's cost needs no acquire; one token more does.
func TestAcquireNotNeededWhenThePoolCoversTheCost(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 3, 3)
	if b, wait := tb.PrepareAcquire(t0, kW, 3); b != nil || wait != nil {
		t.Errorf("cost 3 from a pool of 3: batch %v wait %v, want neither", b, wait)
	}
	if b, wait := tb.PrepareAcquire(t0, kW, 4); b == nil || wait != nil {
		t.Errorf("cost 4 from a pool of 3: batch %v wait %v, want a batch", b, wait)
	}
}

// TestWaitAnswerToAReportWantingNothingSetsNoWait: a retry time on the
// answer to a report that asked for no tokens does not hold back the key's
// next acquire.
func TestWaitAnswerToAReportWantingNothingSetsNoWait(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 1)
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	r := syncs[0].Reports[0]
	if r.Want != 0 {
		t.Fatalf("sync report wants %d, want 0", r.Want)
	}
	g := regionGrant(r, 0, func(g *sluicev1.Grant) { g.RetryAfterMs = 500 })
	if err := tb.Apply(t0.Add(time.Second), syncs[0], []*sluicev1.Grant{g}); err != nil {
		t.Fatal(err)
	}
	if _, act := allow(t, tb, t0.Add(time.Second), kW, 2); act != ActAcquire {
		t.Errorf("cost 2 from a pool of 1 after the answer: action %v, want acquire", act)
	}
}

// TestNeverAnswerToAReportWithoutMinDeniesOneToken: a "never" answer to a
// report that named no minimum counts as never for a need of one token, so
// the next request is denied with RetryNever rather than a retry time.
func TestNeverAnswerToAReportWithoutMinDeniesOneToken(t *testing.T) {
	tb := newTestTable(t)
	allow(t, tb, t0, kW, 1)
	b, _ := tb.PrepareAcquire(t0, kW, 0)
	if b == nil || b.Reports[0].Min != 0 || b.Reports[0].Want <= 0 {
		t.Fatalf("acquire for cost 0: batch %v, want one report with min 0 and want > 0", b)
	}
	g := regionGrant(b.Reports[0], 0, func(g *sluicev1.Grant) { g.RetryAfterMs = -1 })
	if err := tb.Apply(t0, b, []*sluicev1.Grant{g}); err != nil {
		t.Fatal(err)
	}
	if d, act := allow(t, tb, t0, kW, 1); d.Allowed || !d.RetryNever || act != ActNone {
		t.Errorf("cost 1 after never: allowed %v, retry never %v, action %v; want denied, never, none", d.Allowed, d.RetryNever, act)
	}
}
