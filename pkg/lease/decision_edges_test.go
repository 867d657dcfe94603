package lease

import (
	"errors"
	"slices"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestCostAtItsBoundsIsServed: a request costing exactly the key's burst
// (1 included), or exactly quota.MaxCost, is admitted from the pool by both
// paths, and the clock-free path serves a key whose burst is not known yet;
// one token above the burst is invalid. The decision's cap is the key's
// burst when the region's is larger.
func TestCostAtItsBoundsIsServed(t *testing.T) {
	for _, tc := range []struct {
		name        string
		limit, cost int64
		wantInvalid bool
	}{
		{name: "cost equal to the burst", limit: 5, cost: 5},
		{name: "cost one above the burst", limit: 5, cost: 6, wantInvalid: true},
		{name: "cost equal to a burst of 1", limit: 1, cost: 1},
		{name: "cost one above a burst of 1", limit: 1, cost: 2, wantInvalid: true},
		{name: "burst unknown", limit: 0, cost: 5},
		{name: "cost quota.MaxCost, burst unknown", limit: 0, cost: quota.MaxCost},
		{name: "cost quota.MaxCost equal to the burst", limit: quota.MaxCost, cost: quota.MaxCost},
	} {
		for _, fast := range []bool{false, true} {
			tb := newTestTable(t)
			acquire(t, tb, t0, t0, kW, tc.cost, tc.cost, func(g *sluicev1.Grant) { g.Limit = tc.limit })
			if fast {
				_, rem, _, ok := tb.allowFast(kW, tc.cost, tb.instant(t0))
				if ok == tc.wantInvalid || (ok && rem != 0) {
					t.Errorf("%s: clock-free path ok %v remaining %d; want ok %v", tc.name, ok, rem, !tc.wantInvalid)
				}
				continue
			}
			d, act, err := tb.Allow(t0, kW, tc.cost)
			if tc.wantInvalid {
				if !errors.Is(err, quota.ErrInvalid) {
					t.Errorf("%s: err %v, want quota.ErrInvalid", tc.name, err)
				}
				continue
			}
			if err != nil || !d.Allowed || act == ActAcquire || act == ActCheck {
				t.Errorf("%s: decision %+v action %v err %v; want admitted", tc.name, d, act, err)
			}
			// The region's burst is 10000: the cap is the smaller of it and
			// the key's burst, unknown while the key's burst is.
			if wantCap := min(tc.limit, 10000); d.CapKnown != (tc.limit > 0) || d.Cap != wantCap {
				t.Errorf("%s: cap %d known %v, want %d known %v", tc.name, d.Cap, d.CapKnown, wantCap, tc.limit > 0)
			}
		}
	}
}

// TestInvalidInputOnAnUnknownKeyLeavesNothing: an invalid cost on a key
// the table does not hold yet is refused by every entry point without
// making the key, and a check answer with no response, for an invalid key
// or on a closed table is an error, never a decision.
func TestInvalidInputOnAnUnknownKeyLeavesNothing(t *testing.T) {
	okResp := &sluicev1.CheckResponse{Allowed: true, Limit: 5, Remaining: 4}
	for _, cost := range []int64{0, -1, quota.MaxCost + 1} {
		tb := newTestTable(t)
		calls := map[string]func() error{
			"Allow":      func() error { _, _, err := tb.Allow(t0, kW, cost); return err },
			"Fallback":   func() error { _, err := tb.Fallback(t0, kW, cost); return err },
			"ApplyCheck": func() error { _, err := tb.ApplyCheck(t0, kExp, cost, okResp); return err },
		}
		for name, call := range calls {
			if err := call(); !errors.Is(err, quota.ErrInvalid) {
				t.Errorf("%s cost %d: err %v, want quota.ErrInvalid", name, cost, err)
			}
		}
		if tb.Len() != 0 {
			t.Errorf("cost %d: the table holds %d keys after refusing it, want 0", cost, tb.Len())
		}
	}

	tb := newTestTable(t)
	bad := quota.Key{Tenant: "a b", Class: "write"}
	if _, err := tb.ApplyCheck(t0, kExp, 1, nil); err == nil {
		t.Error("ApplyCheck without a response: no error")
	}
	if _, err := tb.ApplyCheck(t0, bad, 1, okResp); !errors.Is(err, quota.ErrInvalid) {
		t.Errorf("ApplyCheck on an invalid key: %v, want quota.ErrInvalid", err)
	}
	if _, err := tb.Exhausted(t0, bad, 1); !errors.Is(err, quota.ErrInvalid) {
		t.Errorf("Exhausted on an invalid key: %v, want quota.ErrInvalid", err)
	}
	if tb.Len() != 0 {
		t.Fatalf("the table holds %d keys after refusing invalid keys", tb.Len())
	}
	tb.PrepareRelease(t0)
	if _, err := tb.ApplyCheck(t0, kExp, 1, okResp); !errors.Is(err, ErrClosed) {
		t.Errorf("ApplyCheck on a released table: %v, want ErrClosed", err)
	}
	if _, err := tb.Exhausted(t0, kW, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Exhausted on a released table: %v, want ErrClosed", err)
	}
}

// TestLocalPolicyDecisionFields: the local on_failure policy's decisions
// tell what its bucket holds: Limit is the key's burst once known, else
// the local bucket's; Cap is the local burst, never above the limit;
// Remaining the whole tokens left; ResetAt when the bucket is full again;
// a denial's RetryAfter when the missing tokens will have come.
func TestLocalPolicyDecisionFields(t *testing.T) {
	// Nothing learned: FallbackLimit, 2/s with burst 4.
	tb := newTestTable(t, func(o *TableOptions) { o.FallbackLimit = quota.Limit{Rate: 2, Burst: 4} })
	d, err := tb.Fallback(t0, kW, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Limit != 4 || !d.CapKnown || d.Cap != 4 || d.Remaining != 3 || !d.ResetAt.Equal(t0.Add(500*time.Millisecond)) {
		t.Fatalf("first of a burst of 4 at 2/s: %+v; want allowed, Limit 4, Cap 4, Remaining 3, full again in 500ms", d)
	}
	tb.Fallback(t0, kW, 2)
	// One token left, two asked: the second one comes in 500ms.
	d, _ = tb.Fallback(t0, kW, 2)
	if d.Allowed || d.Remaining != 1 || d.RetryAfter != 500*time.Millisecond || !d.ResetAt.Equal(t0.Add(1500*time.Millisecond)) {
		t.Fatalf("cost 2 with 1 token left: %+v; want denied, Remaining 1, RetryAfter 500ms, full again in 1.5s", d)
	}

	// Learned: burst 10000, region 40/s with burst 80 over 4 instances:
	// the local bucket is 10/s with burst 20, below the key's burst.
	acquire(t, tb, t0, t0, kR, 1, 0, func(g *sluicev1.Grant) {
		g.RegionRate, g.RegionBurst, g.LiveInstances, g.RetryAfterMs = 40, 80, 4, 0
	})
	d, _ = tb.Fallback(t0, kR, 1)
	if !d.Allowed || d.Limit != 10000 || d.Cap != 20 || d.Remaining != 19 {
		t.Fatalf("learned key: %+v; want allowed, Limit 10000 (the key's), Cap 20 (the local burst), Remaining 19", d)
	}
}

// TestLocalPolicyFollowsTheRegionsShare: the local bucket follows the
// region's latest rate and burst; a region that names no rate or no burst
// leaves it at FallbackLimit.
func TestLocalPolicyFollowsTheRegionsShare(t *testing.T) {
	fallback := quota.Limit{Rate: 2, Burst: 4}
	region := func(rate, burst float64, live int64) func(*sluicev1.Grant) {
		return func(g *sluicev1.Grant) {
			g.RegionRate, g.RegionBurst, g.LiveInstances, g.RetryAfterMs = rate, burst, live, 0
		}
	}
	for _, tc := range []struct {
		name          string
		rate, burst   float64
		live          int64
		wantCap       int64
		wantRetryNext time.Duration // after the burst is spent
	}{
		{name: "region share", rate: 40, burst: 80, live: 4, wantCap: 20, wantRetryNext: 100 * time.Millisecond},
		{name: "region share of 1/s", rate: 4, burst: 8, live: 4, wantCap: 2, wantRetryNext: time.Second},
		{name: "lone instance", rate: 10, burst: 20, live: 1, wantCap: 20, wantRetryNext: 100 * time.Millisecond},
		{name: "region of 1/s and one token", rate: 1, burst: 1, live: 1, wantCap: 1, wantRetryNext: time.Second},
		{name: "instances not said: as if alone", rate: 10, burst: 20, live: 0, wantCap: 20, wantRetryNext: 100 * time.Millisecond},
		{name: "share of the burst below a token", rate: 40, burst: 2, live: 4, wantCap: 1, wantRetryNext: 100 * time.Millisecond},
		{name: "no region rate", rate: 0, burst: 80, live: 4, wantCap: 4, wantRetryNext: 500 * time.Millisecond},
		{name: "no region burst", rate: 40, burst: 0, live: 4, wantCap: 4, wantRetryNext: 500 * time.Millisecond},
	} {
		tb := newTestTable(t, func(o *TableOptions) { o.FallbackLimit = fallback })
		acquire(t, tb, t0, t0, kW, 1, 0, region(tc.rate, tc.burst, tc.live))
		d, _ := tb.Fallback(t0, kW, 1)
		if d.Cap != tc.wantCap {
			t.Errorf("%s: Cap %d, want %d", tc.name, d.Cap, tc.wantCap)
		}
		d = spendLocalBucket(t, tb, t0, d)
		if d.RetryAfter != tc.wantRetryNext || d.Remaining != 0 {
			t.Errorf("%s: retry after %v, remaining %d once the burst is spent; want %v and 0", tc.name, d.RetryAfter, d.Remaining, tc.wantRetryNext)
		}
	}

	// The region's share changes: rate 80/s, burst 40 over 4 instances.
	tb := newTestTable(t, func(o *TableOptions) { o.FallbackLimit = fallback })
	acquire(t, tb, t0, t0, kW, 1, 0, region(40, 80, 4))
	tb.Fallback(t0, kW, 1)
	acquire(t, tb, t0.Add(time.Second), t0.Add(time.Second), kW, 1, 0, region(80, 40, 4))
	d, _ := tb.Fallback(t0.Add(time.Second), kW, 1)
	if d.Cap != 10 {
		t.Fatalf("after the region's burst fell to 40: Cap %d, want 10", d.Cap)
	}
	d = spendLocalBucket(t, tb, t0.Add(time.Second), d)
	if d.RetryAfter != 50*time.Millisecond {
		t.Fatalf("after the region's rate rose to 80/s: retry after %v, want 50ms (20/s here)", d.RetryAfter)
	}
}

// spendLocalBucket decides requests of one token on kW with the local
// policy at now, from d on, until one is denied, which it returns.
func spendLocalBucket(t *testing.T, tb *Table, now time.Time, d quota.Decision) quota.Decision {
	t.Helper()
	for range 1000 {
		if !d.Allowed {
			return d
		}
		d, _ = tb.Fallback(now, kW, 1)
	}
	t.Fatalf("the local bucket admitted 1000 requests at one instant: %+v", d)
	return d
}

// TestDegradedDenialsAreCountedAsSuch: decisions of the on_failure policy
// are counted as degraded with their own result: denied, or shadow-denied.
func TestDegradedDenialsAreCountedAsSuch(t *testing.T) {
	tb := newTestTable(t)
	tb.Fallback(t0, kExp, 1) // closed
	acquire(t, tb, t0, t0, kW, 1, 0, func(g *sluicev1.Grant) { g.OnFailure, g.Shadow, g.RetryAfterMs = "closed", true, 0 })
	if d, _ := tb.Fallback(t0, kW, 1); !d.Allowed || !d.WouldDeny {
		t.Fatalf("closed policy in shadow: %+v, want admitted with WouldDeny", d)
	}
	want := []DecisionCount{
		{Class: "export", Tier: "unknown", Result: ResultDenied, Degraded: true, N: 1},
		{Class: "write", Tier: "pro", Result: ResultShadowDenied, Degraded: true, N: 1},
	}
	got := tb.Counts()
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("counts %+v, want %+v", got, want)
	}
}

// TestLeasePathDenialIsNotDegraded: a denial on the lease path (the
// region answered, the pool is empty) is counted as denied, or for a
// shadow class admitted and counted as shadow-denied, never as a
// degraded decision.
func TestLeasePathDenialIsNotDegraded(t *testing.T) {
	for _, tc := range []struct {
		shadow bool
		want   Result
	}{{false, ResultDenied}, {true, ResultShadowDenied}} {
		tb := newTestTable(t)
		acquire(t, tb, t0, t0, kW, 1, 0, func(g *sluicev1.Grant) { g.Shadow = tc.shadow })
		d, err := tb.Exhausted(t0, kW, 1)
		if err != nil || d.Allowed != tc.shadow || !d.WouldDeny {
			t.Fatalf("shadow %v: exhausted %+v, %v; want WouldDeny, admitted only in shadow", tc.shadow, d, err)
		}
		want := DecisionCount{Class: "write", Tier: "pro", Result: tc.want, N: 1}
		if got := tb.Counts(); len(got) != 1 || got[0] != want {
			t.Fatalf("shadow %v: counts %+v, want %+v", tc.shadow, got, want)
		}
	}
}

// TestStrictAnswersAreNotDegraded: a strict check the region answered is
// counted with its result, denied included, never as a degraded decision.
func TestStrictAnswersAreNotDegraded(t *testing.T) {
	tb := newTestTable(t)
	for _, resp := range []*sluicev1.CheckResponse{
		{Allowed: true, Limit: 5, Remaining: 4},
		{Limit: 5, RetryAfterMs: 250},
		{Limit: 5, Shadow: true},
	} {
		if _, err := tb.ApplyCheck(t0, kExp, 1, resp); err != nil {
			t.Fatal(err)
		}
	}
	want := []DecisionCount{
		{Class: "export", Tier: "unknown", Result: ResultAllowed, N: 1},
		{Class: "export", Tier: "unknown", Result: ResultDenied, N: 1},
		{Class: "export", Tier: "unknown", Result: ResultShadowDenied, N: 1},
	}
	if got := tb.Counts(); !slices.Equal(got, want) {
		t.Fatalf("counts %+v, want %+v", got, want)
	}
	if tb.Degraded() || tb.DegradedKeys() != 0 {
		t.Fatalf("after answered checks: Degraded %v with %d keys, want neither", tb.Degraded(), tb.DegradedKeys())
	}
}

// TestDemandCountsEveryPathsTokens: a key's measured demand is the tokens
// asked of every path: the lease's denials, the on_failure policy, strict
// checks.
func TestDemandCountsEveryPathsTokens(t *testing.T) {
	tb := newTestTable(t)
	tb.Exhausted(t0, kW, 2)
	for range 3 {
		tb.Fallback(t0, kW, 1)
	}
	tb.ApplyCheck(t0, kW, 4, &sluicev1.CheckResponse{Allowed: true, Limit: 100, Remaining: 50})
	tb.PrepareSync(t0.Add(time.Second))
	if got := state(t, tb, kW).Rate; got != 9 {
		t.Fatalf("2 denied, 3 degraded and 4 checked tokens in 1s: demand %v/s, want 9", got)
	}
}

// TestCheckAnswerFields: a strict check's decision carries the answer's
// reset time, caps Remaining at the key's cap and, on a denial, below the
// cost; a wait of 0 is no "never"; a limit of 0 (not said) keeps the one
// learned; and what the answer said is what later lease-path decisions on
// the key expect.
func TestCheckAnswerFields(t *testing.T) {
	tb := newTestTable(t)
	d, err := tb.ApplyCheck(t0, kExp, 1, &sluicev1.CheckResponse{Allowed: true, Limit: 5, Remaining: 4, ResetMs: 1500})
	if err != nil {
		t.Fatal(err)
	}
	if !d.ResetAt.Equal(t0.Add(1500 * time.Millisecond)) {
		t.Errorf("check decision ResetAt %v after, want 1.5s", d.ResetAt.Sub(t0))
	}
	// The region's bucket held 4 and fills in 1.5s: a lease-path denial
	// says so.
	if d, _ := tb.Exhausted(t0, kExp, 5); d.Remaining != 4 || !d.ResetAt.Equal(t0.Add(1500*time.Millisecond)) {
		t.Errorf("denial after the check: Remaining %d ResetAt %v after; want 4 and 1.5s", d.Remaining, d.ResetAt.Sub(t0))
	}
	// Denied with more than the cost left in the answer: Remaining is
	// below the cost; a wait of 0 is not "never".
	d, _ = tb.ApplyCheck(t0, kExp, 3, &sluicev1.CheckResponse{Limit: 5, Remaining: 5})
	if d.Allowed || d.RetryNever || d.Remaining != 2 {
		t.Errorf("denied cost 3 with 5 left, no wait: %+v; want denied, Remaining 2, no RetryNever", d)
	}
	// An answer that names no limit keeps the learned one.
	tb.ApplyCheck(t0, kExp, 1, &sluicev1.CheckResponse{Allowed: true, Remaining: 3})
	if _, _, err := tb.Allow(t0, kExp, 6); !errors.Is(err, quota.ErrInvalid) {
		t.Errorf("cost 6 after an answer without a limit: %v, want quota.ErrInvalid (burst 5)", err)
	}
	if st := state(t, tb, kExp); st.Limit != 5 {
		t.Errorf("limit %d after an answer without one, want 5", st.Limit)
	}

	// A leased key with a known cap (10000) whose limit a check lowers to 5:
	// the cap follows, and Remaining is capped by it.
	acquire(t, tb, t0, t0, kW, 1, 1)
	d, _ = tb.ApplyCheck(t0, kW, 1, &sluicev1.CheckResponse{Allowed: true, Limit: 5, Remaining: 40})
	if !d.CapKnown || d.Cap != 5 || d.Remaining != 5 {
		t.Errorf("check lowering the limit to 5: %+v; want Cap 5 and Remaining 5", d)
	}
}

// TestRoundTripIsSmoothed: the table's round trip is the first applied
// RPC's, then moves a fifth of the way to each new one (a zero one too);
// an answer applied before it was sent (a clock step) is not a round trip.
func TestRoundTripIsSmoothed(t *testing.T) {
	tb := newTestTable(t)
	for i, tc := range []struct {
		rtt, want time.Duration
	}{
		{10 * time.Millisecond, 10 * time.Millisecond},
		{20 * time.Millisecond, 12 * time.Millisecond},
		{0, 9600 * time.Microsecond},
		{-10 * time.Millisecond, 9600 * time.Microsecond},
	} {
		key := quota.Key{Tenant: "t" + string(rune('a'+i)), Class: "write"}
		sent := t0.Add(time.Duration(i) * time.Second)
		acquire(t, tb, sent, sent.Add(tc.rtt), key, 1, 1)
		if got := tb.RTT(); got != tc.want {
			t.Fatalf("after a round trip of %v: RTT %v, want %v", tc.rtt, got, tc.want)
		}
	}
}

// TestHeldTokensSumsThePools: HeldTokens is the sum of every key's pool.
func TestHeldTokensSumsThePools(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 3, 3)
	acquire(t, tb, t0, t0, kR, 4, 4)
	if got := tb.HeldTokens(); got != 7 {
		t.Fatalf("pools of 3 and 4: HeldTokens %d, want 7", got)
	}
}

// TestNeverCountsThePoolTowardsTheNeed: after the region answered "never"
// for the tokens a request needed beyond the pool, a request needing as
// many beyond the pool is denied with RetryNever, and one needing fewer
// beyond the pool asks the region instead.
func TestNeverCountsThePoolTowardsTheNeed(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 2, 2)
	if _, act := allow(t, tb, t0, kW, 5); act != ActAcquire {
		t.Fatalf("cost 5 on a pool of 2: action %v, want acquire", act)
	}
	b, _ := tb.PrepareAcquire(t0, kW, 5)
	r := b.Reports[0]
	// Never from an unleased region whose cap (4) is below the cost: no
	// wait brings the tokens.
	never := func(g *sluicev1.Grant) { g.RetryAfterMs, g.Unleased, g.RegionBurst = -1, true, 4 }
	if err := tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(r, 0, never)}); err != nil {
		t.Fatal(err)
	}
	if r.Min != 3 {
		t.Fatalf("acquire for cost 5 on a pool of 2 needs %d, want 3", r.Min)
	}
	if d, _ := allow(t, tb, t0, kW, 5); !d.RetryNever {
		t.Errorf("cost 5 (3 beyond the pool): %+v, want RetryNever", d)
	}
	if d, act := allow(t, tb, t0, kW, 4); act != ActAcquire || d.WouldDeny {
		t.Errorf("cost 4 (2 beyond the pool): %+v, action %v; want no decision, acquire", d, act)
	}
}

// TestWaitForFewerTokensIsNoAnswerForMore: the region's wait is the time
// until its bucket holds the tokens the report needed. A request needing
// as many beyond the pool is denied with the rest of that wait; one
// needing fewer with the rest less the time the region's rate (10/s here)
// refills the difference, and once that has passed it asks the region
// (denied for the whole wait, a request of 1 token waited as long as one
// of 3: a large request denied made small ones wait past their tokens);
// one needing more asks the region, whose wait for it is longer (a retry
// at the shorter wait would be denied again).
func TestWaitForFewerTokensIsNoAnswerForMore(t *testing.T) {
	tb := newTestTable(t)
	rate := func(g *sluicev1.Grant) { g.RegionRate = 10 }
	acquire(t, tb, t0, t0, kW, 2, 2, rate)
	allow(t, tb, t0, kW, 2)
	if _, act := allow(t, tb, t0, kW, 3); act != ActAcquire {
		t.Fatalf("cost 3 on an empty pool: action %v, want acquire", act)
	}
	b, _ := tb.PrepareAcquire(t0, kW, 3)
	if err := tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 0, rate, func(g *sluicev1.Grant) { g.RetryAfterMs = 300 })}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cost int64
		want time.Duration
	}{{3, 200 * time.Millisecond}, {2, 100 * time.Millisecond}} {
		if d, act := allow(t, tb, t0.Add(100*time.Millisecond), kW, tc.cost); act != ActNone || d.Allowed || d.RetryNever || d.RetryAfter != tc.want {
			t.Errorf("cost %d after a wait of 300ms for 3: %+v, action %v; want denied with RetryAfter %v", tc.cost, d, act, tc.want)
		}
	}
	for _, at := range []time.Duration{100 * time.Millisecond, 150 * time.Millisecond} {
		if d, act := allow(t, tb, t0.Add(at), kW, 1); act != ActAcquire || d.WouldDeny {
			t.Errorf("cost 1 at %v after a wait of 300ms for 3 (2 tokens refill in 200ms): %+v, action %v; want no decision, acquire", at, d, act)
		}
	}
	if d, act := allow(t, tb, t0.Add(99*time.Millisecond), kW, 1); act != ActNone || d.RetryAfter != time.Millisecond {
		t.Errorf("cost 1 at 99ms after a wait of 300ms for 3: %+v, action %v; want denied with RetryAfter 1ms", d, act)
	}
	if d, act := allow(t, tb, t0.Add(100*time.Millisecond), kW, 8); act != ActAcquire || d.WouldDeny {
		t.Errorf("cost 8 after a wait of 300ms for 3: %+v, action %v; want no decision, acquire", d, act)
	}
	// The region's answer for 8 is what the next requests of 8 get.
	b, _ = tb.PrepareAcquire(t0.Add(100*time.Millisecond), kW, 8)
	if b == nil || b.Reports[0].Min != 8 {
		t.Fatalf("acquire for cost 8: batch %v, want one report with min 8", b)
	}
	if err := tb.Apply(t0.Add(100*time.Millisecond), b, []*sluicev1.Grant{regionGrant(b.Reports[0], 0, rate, func(g *sluicev1.Grant) { g.RetryAfterMs = 1400 })}); err != nil {
		t.Fatal(err)
	}
	if d, act := allow(t, tb, t0.Add(200*time.Millisecond), kW, 8); act != ActNone || d.Allowed || d.RetryAfter != 1300*time.Millisecond {
		t.Errorf("cost 8 after a wait of 1400ms for 8: %+v, action %v; want denied with RetryAfter 1300ms", d, act)
	}
}

// TestWaitForMoreTokensAtARateNearZero: at a region rate so small that
// the difference would take longer than any Duration to refill, a request
// needing fewer tokens than the wait was named for asks the region (its
// tokens may be there already: the difference says nothing), and one
// needing as many is denied with the rest of the wait.
func TestWaitForMoreTokensAtARateNearZero(t *testing.T) {
	tb := newTestTable(t)
	rate := func(g *sluicev1.Grant) { g.RegionRate = 1e-15 }
	acquire(t, tb, t0, t0, kW, 1, 1, rate)
	allow(t, tb, t0, kW, 1)
	b, _ := tb.PrepareAcquire(t0, kW, 3)
	if err := tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 0, rate, func(g *sluicev1.Grant) { g.RetryAfterMs = 300 })}); err != nil {
		t.Fatal(err)
	}
	if d, act := allow(t, tb, t0, kW, 3); act != ActNone || d.RetryAfter != 300*time.Millisecond {
		t.Errorf("cost 3 after a wait of 300ms for 3: %+v, action %v; want denied with RetryAfter 300ms", d, act)
	}
	if d, act := allow(t, tb, t0, kW, 2); act != ActAcquire || d.WouldDeny {
		t.Errorf("cost 2 after a wait of 300ms for 3 at 1e-15/s: %+v, action %v; want no decision, acquire", d, act)
	}
}

// TestPoolTakeReportsCrossingOnce: a spend reports crossing the low-water
// mark only when it takes the pool from above the mark to at or below it.
func TestPoolTakeReportsCrossingOnce(t *testing.T) {
	for _, tc := range []struct {
		have, cost, low int64
		rem             int64
		crossed, ok     bool
	}{
		{have: 6, cost: 1, low: 5, rem: 5, crossed: true, ok: true},
		{have: 5, cost: 1, low: 5, rem: 4, ok: true},
		{have: 7, cost: 1, low: 5, rem: 6, ok: true},
		{have: 9, cost: 5, low: 5, rem: 4, crossed: true, ok: true},
		{have: 5, cost: 5, low: 0, rem: 0, crossed: true, ok: true},
		{have: 4, cost: 5, low: 0, rem: 4},
	} {
		e := newKeyEntry(kW)
		e.word.Store(uint64(tc.have))
		rem, crossed, ok := e.take(tc.cost, tc.low)
		if rem != tc.rem || crossed != tc.crossed || ok != tc.ok {
			t.Errorf("pool %d, mark %d, take %d: remaining %d crossed %v ok %v; want %d %v %v",
				tc.have, tc.low, tc.cost, rem, crossed, ok, tc.rem, tc.crossed, tc.ok)
		}
	}
}

// TestCheckAnswerAtItsSmallest: a check denied with nothing left, no wait
// and no reset time, for a key whose burst is 1, says so: Remaining 0, no
// RetryAfter, ResetAt now, Limit 1 learned. A check admitted with nothing
// left says Remaining 0, and a later lease-path denial expects nothing from
// the region either.
func TestCheckAnswerAtItsSmallest(t *testing.T) {
	tb := newTestTable(t)
	d, err := tb.ApplyCheck(t0, kExp, 1, &sluicev1.CheckResponse{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != 0 || d.RetryNever || !d.ResetAt.Equal(t0) || d.Limit != 1 {
		t.Fatalf("check answered with zeros and Limit 1: %+v; want denied, Remaining 0, no wait, ResetAt now, Limit 1", d)
	}
	if st := state(t, tb, kExp); st.Limit != 1 {
		t.Fatalf("limit %d learned from a check saying 1", st.Limit)
	}
	d, _ = tb.ApplyCheck(t0, kExp, 1, &sluicev1.CheckResponse{Allowed: true, Limit: 2})
	if !d.Allowed || d.Remaining != 0 {
		t.Fatalf("check admitted with nothing left: %+v; want allowed, Remaining 0", d)
	}
	if d, _ := tb.Exhausted(t0, kExp, 2); d.Remaining != 0 || !d.ResetAt.Equal(t0) {
		t.Fatalf("denial after the check: Remaining %d ResetAt %v after; want 0 and now", d.Remaining, d.ResetAt.Sub(t0))
	}
}

// TestNoResetTimeBeforeTheRegionAnswers: a denial on a key the region has
// not answered for yet (Exhausted before any grant) names no reset time:
// the table knows nothing of the region's bucket, so Decision.ResetAt is
// zero rather than an instant the table made up. After an answer it is
// the answer's reset, measured from when the answer was applied.
func TestNoResetTimeBeforeTheRegionAnswers(t *testing.T) {
	tb := newTestTable(t)
	tb.instant(t0.Add(-time.Second)) // the table's zero before the key's first instant
	d, err := tb.Exhausted(t0, kW, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !d.ResetAt.IsZero() {
		t.Fatalf("reset at %v before any answer, want none", d.ResetAt)
	}
	acquire(t, tb, t0, t0, kW, 1, 1, func(g *sluicev1.Grant) { g.ResetMs = 1500 })
	d, err = tb.Exhausted(t0, kW, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(1500 * time.Millisecond); !d.ResetAt.Equal(want) {
		t.Fatalf("reset at %v after an answer of 1.5 s, want %v", d.ResetAt, want)
	}
}
