package lease

import (
	"math"
	"slices"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
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
		// A Sync that asks for tokens needs at least one; one that asks
		// for none needs none.
		if r.Want != tc.wantWant || r.Min != min(tc.wantWant, 1) || r.Returned != tc.wantReturned || st.Tokens != tc.wantTokens {
			t.Errorf("pool %d: want %d min %d returned %d, pool left %d; want %d, %d, %d, %d",
				tc.pool, r.Want, r.Min, r.Returned, st.Tokens, tc.wantWant, min(tc.wantWant, 1), tc.wantReturned, tc.wantTokens)
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

// TestPeriodicSyncAsksNothingWhileTheRegionsWaitRuns: a key the region
// told to wait until an instant asks for no tokens in a periodic Sync
// before it (its refill asks at it); asked, the region answered a wait
// from then, which the round trip and the rounding to a millisecond put
// after the instant the instance's callers were told, and a caller
// retrying at its RetryAfter was denied by the instance's own wait (3 of
// 40 retries on a real region). At the instant it asks again.
func TestPeriodicSyncAsksNothingWhileTheRegionsWaitRuns(t *testing.T) {
	for _, tc := range []struct {
		at       time.Duration
		wantsAny bool
	}{
		{at: 199 * time.Millisecond},
		{at: 200 * time.Millisecond, wantsAny: true},
	} {
		tb := newTestTable(t)
		acquire(t, tb, t0, t0, kW, 1, 0, func(g *sluicev1.Grant) { g.RetryAfterMs = 200 })
		syncs, _ := tb.PrepareSync(t0.Add(tc.at))
		if len(syncs) != 1 || len(syncs[0].Reports) != 1 {
			t.Fatalf("at %v: syncs %v, want one report", tc.at, syncs)
		}
		if r := syncs[0].Reports[0]; (r.Want > 0) != tc.wantsAny {
			t.Errorf("at %v: the periodic report wants %d, want tokens asked for: %v", tc.at, r.Want, tc.wantsAny)
		}
	}
}

// TestAcquireNotNeededWhenThePoolCoversTheCost: a leased pool holding
// exactly the request's cost needs no acquire; one token more does, and
// asks for what the pool lacks.
func TestAcquireNotNeededWhenThePoolCoversTheCost(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 3, 3)
	if b, wait := tb.PrepareAcquire(t0, kW, 3); b != nil || wait != nil {
		t.Errorf("cost 3 from a pool of 3: batch %v wait %v, want neither", b, wait)
	}
	// The acquire asks for the larger of what the request lacks (1) and
	// what tops the pool up to its target (1 with no demand measured: less
	// than the pool), and needs the 1 the request lacks.
	if b, wait := tb.PrepareAcquire(t0, kW, 4); b == nil || wait != nil {
		t.Errorf("cost 4 from a pool of 3: batch %v wait %v, want a batch", b, wait)
	} else if r := b.Reports[0]; r.Want != 1 || r.Min != 1 {
		t.Errorf("cost 4 from a pool of 3: want %d min %d, want 1 and 1", r.Want, r.Min)
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
	// From an unleased region whose static share of the key holds no
	// whole token: no wait brings the token.
	g := regionGrant(b.Reports[0], 0, func(g *sluicev1.Grant) { g.RetryAfterMs, g.Unleased, g.RegionBurst = -1, true, 0.5 })
	if err := tb.Apply(t0, b, []*sluicev1.Grant{g}); err != nil {
		t.Fatal(err)
	}
	if d, act := allow(t, tb, t0, kW, 1); d.Allowed || !d.RetryNever || act != ActNone {
		t.Errorf("cost 1 after never: allowed %v, retry never %v, action %v; want denied, never, none", d.Allowed, d.RetryNever, act)
	}
}

// TestWaitAnswerToAReportWithoutMinIsAboutOneToken: a wait named in the
// answer to a report that named no minimum (but wanted tokens) is about a
// need of one token: a request needing one is denied until then, one
// needing two asks the region.
func TestWaitAnswerToAReportWithoutMinIsAboutOneToken(t *testing.T) {
	tb := newTestTable(t)
	allow(t, tb, t0, kW, 1)
	b, _ := tb.PrepareAcquire(t0, kW, 0)
	if b == nil || b.Reports[0].Min != 0 || b.Reports[0].Want <= 0 {
		t.Fatalf("acquire for cost 0: batch %v, want one report with min 0 and want > 0", b)
	}
	g := regionGrant(b.Reports[0], 0, func(g *sluicev1.Grant) { g.RetryAfterMs = 500 })
	if err := tb.Apply(t0, b, []*sluicev1.Grant{g}); err != nil {
		t.Fatal(err)
	}
	if d, act := allow(t, tb, t0, kW, 1); d.Allowed || d.RetryNever || d.RetryAfter != 500*time.Millisecond || act != ActNone {
		t.Errorf("cost 1 after a wait of 500ms: allowed %v, retry never %v, after %v, action %v; want denied for 500ms, none", d.Allowed, d.RetryNever, d.RetryAfter, act)
	}
	if _, act := allow(t, tb, t0, kW, 2); act != ActAcquire {
		t.Errorf("cost 2 after a wait about one token: action %v, want acquire", act)
	}
}

// TestGrantEndsTheWaitOfAnEarlierAnswer: tokens granted after an answer
// that named a wait end that wait: a request the pool then cannot cover
// asks the region rather than being denied until the old retry time.
func TestGrantEndsTheWaitOfAnEarlierAnswer(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 0, func(g *sluicev1.Grant) { g.RetryAfterMs = 1000 })
	at := t0.Add(100 * time.Millisecond)
	if d, act := allow(t, tb, at, kW, 1); d.Allowed || act != ActNone {
		t.Fatalf("cost 1 during the wait: allowed %v, action %v; want denied, none", d.Allowed, act)
	}
	b, _ := tb.PrepareAcquire(at, kW, 1)
	if b == nil {
		t.Fatal("PrepareAcquire during the wait: no batch")
	}
	if err := tb.Apply(at, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1)}); err != nil {
		t.Fatal(err)
	}
	if _, act := allow(t, tb, at, kW, 2); act != ActAcquire {
		t.Errorf("cost 2 from a pool of 1 granted after the wait was named: action %v, want acquire", act)
	}
	if d, act := allow(t, tb, at, kW, 1); !d.Allowed || act == ActAcquire {
		t.Errorf("cost 1 from a pool of 1: allowed %v, action %v; want admitted from the pool", d.Allowed, act)
	}
}

// TestAcquireLeavesReturnsForTheNextSync: an acquire carries no returned
// tokens (Acquire has no field for them), so a key whose lease expired
// with tokens in its pool acquires without them, as an Acquire; the next
// Sync returns them, and an acquire resending that report, returning even
// a single token, goes out as a Sync.
func TestAcquireLeavesReturnsForTheNextSync(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 1)
	if _, act := allow(t, tb, t0.Add(testTTL), kW, 1); act != ActAcquire {
		t.Fatalf("at the deadline: action %v, want acquire", act)
	}
	b, _ := tb.PrepareAcquire(t0.Add(testTTL), kW, 1)
	if b == nil || b.UseSync() || b.Reports[0].Returned != 0 {
		t.Fatalf("acquire after expiry: batch %v, want an Acquire returning nothing", b)
	}
	if st := state(t, tb, kW); st.ToReturn != 1 {
		t.Fatalf("to return %d while the acquire is in flight, want 1", st.ToReturn)
	}
	if err := tb.Apply(t0.Add(testTTL), b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1)}); err != nil {
		t.Fatal(err)
	}
	syncs, _ := tb.PrepareSync(t0.Add(testTTL + time.Second))
	if len(syncs) != 1 || syncs[0].Reports[0].Returned != 1 {
		t.Fatalf("next Sync %v, want one report returning the expired token", syncs)
	}
	// That Sync is lost: the acquire that resends its report carries the
	// one returned token, so it goes out as a Sync.
	tb.Failed(t0.Add(testTTL+time.Second), syncs[0])
	allow(t, tb, t0.Add(testTTL+2*time.Second), kW, 5)
	b, _ = tb.PrepareAcquire(t0.Add(testTTL+2*time.Second), kW, 5)
	if b == nil || !b.UseSync() || b.Reports[0].Returned != 1 {
		t.Fatalf("acquire resending the report returning 1 token: batch %v, want it sent as a Sync", b)
	}
}

// TestRefillBatchIsCapped: an early refill carries at most
// MaxReportsPerSync reports; the keys left out go in the next one.
func TestRefillBatchIsCapped(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) { o.MaxReportsPerSync = 2 })
	for _, k := range []quota.Key{kW, kR, {Tenant: "acme", Class: "open"}} {
		// Leased with an empty pool and no demand: at its low-water mark 0.
		acquire(t, tb, t0, t0, k, 1, 0)
	}
	var sizes []int
	for range 3 {
		if b := tb.PrepareRefill(t0); b != nil {
			sizes = append(sizes, len(b.Reports))
		}
	}
	if len(sizes) != 2 || sizes[0] != 2 || sizes[1] != 1 {
		t.Fatalf("refill batch sizes %v, want [2 1]", sizes)
	}
}

// TestReportsNameTheLeaseByItsFirstSeq: a lease is named by the seq of
// its first report; every later report of the lease carries that name
// under a higher seq of its own, and a new lease (after a rebase) takes
// the seq of its own first report.
func TestReportsNameTheLeaseByItsFirstSeq(t *testing.T) {
	tb := newTestTable(t)
	first := acquire(t, tb, t0, t0, kW, 1, 1)
	if first.Lease != first.Seq {
		t.Fatalf("first report: lease %d seq %d, want the lease named by its seq", first.Lease, first.Seq)
	}
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	r := syncs[0].Reports[0]
	if r.Lease != first.Seq || r.Seq <= first.Seq {
		t.Fatalf("next report: lease %d seq %d, want lease %d under a higher seq", r.Lease, r.Seq, first.Seq)
	}
	if err := tb.Apply(t0.Add(time.Second), syncs[0], []*sluicev1.Grant{regionGrant(r, 0)}); err != nil {
		t.Fatal(err)
	}
	final := tb.PrepareRebase(t0.Add(time.Second))
	if final == nil || final.Reports[0].Lease != first.Seq {
		t.Fatalf("final report of the old lease %v, want it named %d", final, first.Seq)
	}
	again := acquire(t, tb, t0.Add(2*time.Second), t0.Add(2*time.Second), kW, 1, 1)
	if again.Lease != again.Seq || again.Seq <= final.Reports[0].Seq {
		t.Fatalf("new lease's first report: lease %d seq %d, want a new lease named by its seq above %d", again.Lease, again.Seq, final.Reports[0].Seq)
	}
}

// TestGrantWithAStrictAnswerGoesBack: tokens granted by an answer that
// says the class is strict are not credited (a strict class opens no
// lease) and go back in the key's next report, a strict one asking for
// nothing.
func TestGrantWithAStrictAnswerGoesBack(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 2, 2, func(g *sluicev1.Grant) { g.Mode = "strict" })
	if st := state(t, tb, kW); st.Tokens != 0 || st.HasLease || st.ToReturn != 2 {
		t.Fatalf("after a strict answer granting 2: pool %d lease %v to return %d; want 0, none, 2", st.Tokens, st.HasLease, st.ToReturn)
	}
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	if len(syncs) != 1 || syncs[0].Reports[0].Returned != 2 || syncs[0].Reports[0].Want != 0 {
		t.Fatalf("next Sync %v, want one report returning 2 and asking for nothing", syncs)
	}
}

// TestAnswerFactsAtTheirBounds: what an answer says about the region is
// kept within bounds. The reset time counts from the answer's arrival and
// is never before it; a live-instance count above the int32 range is the
// largest int32; a negative remaining (not said) adds nothing to what a
// decision says the caller can expect (its pool plus the region's bucket,
// at most the region's cap); the cap is known once the answer says the
// limit and the region's rate and burst, 0 included, and unknown while
// the limit is not said.
func TestAnswerFactsAtTheirBounds(t *testing.T) {
	const recv = 10 * time.Millisecond
	const reset = recv + 100*time.Millisecond
	for _, tc := range []struct {
		name                    string
		mod                     func(*sluicev1.Grant)
		wantReset               time.Duration
		wantLive, wantRemaining int64
		wantCapKnown            bool
		wantCap                 int64
	}{
		{"as said", nil, reset, 3, 2 + 5, true, 10000},
		{"reset in the past", func(g *sluicev1.Grant) { g.ResetMs = -50 }, recv, 3, 2 + 5, true, 10000},
		{"more live instances than int32 holds", func(g *sluicev1.Grant) { g.LiveInstances = 1<<32 + 5 }, reset, math.MaxInt32, 2 + 5, true, 10000},
		{"remaining not said", func(g *sluicev1.Grant) { g.Remaining = -1 }, reset, 3, 2, true, 10000},
		{"limit not said", func(g *sluicev1.Grant) { g.Limit = 0 }, reset, 3, 2 + 5, false, 0},
		{"region rate 0", func(g *sluicev1.Grant) { g.RegionRate = 0 }, reset, 3, 2 + 5, true, 10000},
		{"region burst 0", func(g *sluicev1.Grant) { g.RegionBurst = 0 }, reset, 3, 0, true, 0},
	} {
		tb := newTestTable(t)
		acquire(t, tb, t0, t0.Add(recv), kW, 3, 3, func(g *sluicev1.Grant) {
			g.ResetMs, g.LiveInstances, g.Remaining = 100, 3, 5
			if tc.mod != nil {
				tc.mod(g)
			}
		})
		d, _ := allow(t, tb, t0.Add(recv), kW, 1)
		if !d.Allowed || !d.ResetAt.Equal(t0.Add(tc.wantReset)) || d.Remaining != tc.wantRemaining || d.CapKnown != tc.wantCapKnown || d.Cap != tc.wantCap {
			t.Errorf("%s: decision %+v; want allowed, reset at %v, remaining %d, cap known %v, cap %d",
				tc.name, d, tc.wantReset, tc.wantRemaining, tc.wantCapKnown, tc.wantCap)
		}
		if st := state(t, tb, kW); st.Live != tc.wantLive {
			t.Errorf("%s: %d live instances, want %d", tc.name, st.Live, tc.wantLive)
		}
	}
}

// TestForgetDropsOnlyKeysTheRegionHoldsNothingFor: Forget (after the region
// refused a request) drops a key that never got a lease and has no report
// in flight; it keeps a key with a report in flight and one the region
// granted a lease, even with its pool spent.
func TestForgetDropsOnlyKeysTheRegionHoldsNothingFor(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*Table)
		kept  bool
	}{
		{"never leased", func(tb *Table) { allow(t, tb, t0, kW, 1) }, false},
		{"report in flight", func(tb *Table) {
			allow(t, tb, t0, kW, 1)
			if b, _ := tb.PrepareAcquire(t0, kW, 1); b == nil {
				t.Fatal("no acquire batch")
			}
		}, true},
		{"leased, pool spent", func(tb *Table) {
			acquire(t, tb, t0, t0, kW, 1, 1)
			allow(t, tb, t0, kW, 1)
		}, true},
	} {
		tb := newTestTable(t)
		tc.setup(tb)
		tb.Forget(kW)
		if _, kept := tb.State(kW); kept != tc.kept {
			t.Errorf("%s: kept %v after Forget, want %v", tc.name, kept, tc.kept)
		}
	}
}

// TestGrantAboveTheLargestPoolIsReturned: a key's pool holds at most
// 2^31−1 tokens; what a grant brings above that goes back in the next
// report instead of being credited.
func TestGrantAboveTheLargestPoolIsReturned(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1<<30, 1<<30)
	b, _ := tb.PrepareAcquire(t0, kW, 1<<31)
	if b == nil || b.Reports[0].Want != 1<<30 {
		t.Fatalf("acquire for 2^31 from a pool of 2^30: batch %v, want one asking for 2^30", b)
	}
	if err := tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1<<30)}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, tb, kW); st.Tokens != math.MaxInt32 || st.ToReturn != 1 {
		t.Fatalf("pool %d, to return %d; want 2^31−1 and the 1 token above it", st.Tokens, st.ToReturn)
	}
}

// TestReleaseChunksAreCutAtTheBound: a Release batch goes out in calls of
// at most n reports, in order, each with the batch's send time and kind;
// a batch of a multiple of n reports makes exactly that many full calls,
// with no empty one after them.
func TestReleaseChunksAreCutAtTheBound(t *testing.T) {
	for _, tc := range []struct {
		reports, n int
		want       []int
	}{
		{1, 2, []int{1}},
		{2, 2, []int{2}},
		{3, 2, []int{2, 1}},
		{4, 2, []int{2, 2}},
		{5, 2, []int{2, 2, 1}},
		{3, 1, []int{1, 1, 1}},
	} {
		b := &Batch{sentAt: t0, useSync: true, entries: make([]*entry, tc.reports)}
		for i := range tc.reports {
			b.Reports = append(b.Reports, &sluicev1.KeyReport{Seq: uint64(i + 1)})
		}
		var sizes []int
		seq := uint64(0)
		for _, part := range b.chunks(tc.n) {
			sizes = append(sizes, len(part.Reports))
			if !part.SentAt().Equal(t0) || !part.UseSync() || len(part.entries) != len(part.Reports) {
				t.Errorf("%d reports by %d: a part sent at %v, sync %v, %d entries for %d reports; want the batch's time and kind, one entry a report",
					tc.reports, tc.n, part.SentAt(), part.UseSync(), len(part.entries), len(part.Reports))
			}
			for _, r := range part.Reports {
				if r.Seq != seq+1 {
					t.Errorf("%d reports by %d: report %d after %d; want them in order", tc.reports, tc.n, r.Seq, seq)
				}
				seq = r.Seq
			}
		}
		if !slices.Equal(sizes, tc.want) {
			t.Errorf("%d reports by %d: parts of %v reports, want %v", tc.reports, tc.n, sizes, tc.want)
		}
	}
}

// TestPeriodicSyncAsksAfterANeverAnswer: a key the region told "never"
// (no wait brings its need while its cap and the leases out stay as they
// are) asks again in the next periodic Sync, however soon, in case the cap
// grew or leases came back: the wait that holds back a Sync's ask is only
// the region's named one.
func TestPeriodicSyncAsksAfterANeverAnswer(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 0, func(g *sluicev1.Grant) { g.RetryAfterMs = -1 })
	if st := state(t, tb, kW); st.Tokens != 0 || !st.NegUntil.After(t0.Add(100*time.Millisecond)) {
		t.Fatalf("after the never answer: pool %d, asks again at %v; want an empty pool and a later ask", st.Tokens, st.NegUntil.Sub(t0))
	}
	syncs, _ := tb.PrepareSync(t0.Add(100 * time.Millisecond))
	if len(syncs) != 1 || len(syncs[0].Reports) != 1 {
		t.Fatalf("syncs %v, want one report", syncs)
	}
	if r := syncs[0].Reports[0]; r.Want <= 0 {
		t.Errorf("the periodic report 100ms after a never answer wants %d tokens; want it to ask", r.Want)
	}
}
