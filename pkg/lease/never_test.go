package lease

import (
	"math"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLeaseNeverDenial: when the region answers a lease request "never"
// (retry_after_ms -1: what was asked exceeds what its bucket can ever hold
// at its cap) and no wait can cure it, the lease path's denials carry
// RetryNever and no RetryAfter, instead of promising the next refresh; a
// request needing less than what was refused asks the region (the "never"
// says nothing of it: the bucket may hold what it needs now). After the
// refresh the key asks again, in case the region's cap grew.
func TestLeaseNeverDenial(t *testing.T) {
	// An unleased region whose static share of the key holds no whole
	// token (a burst of 1 split over regions lives in one of them): its
	// cap never grows, so no wait brings any token (a "never" that a wait
	// can cure is a wait: TestNeverWithinTheCapIsAWait).
	never := func(g *sluicev1.Grant) { g.RetryAfterMs, g.Unleased, g.RegionBurst = -1, true, 0 }
	tb := newTestTable(t)
	acquire(t, tb, t0, t0.Add(10*time.Millisecond), kW, 1, 0, never)
	d, act := allow(t, tb, t0.Add(100*time.Millisecond), kW, 1)
	if act != ActNone || d.Allowed || !d.WouldDeny || !d.RetryNever || d.RetryAfter != 0 {
		t.Fatalf("after a never answer: decision %+v action %v; want denied, RetryNever, no RetryAfter", d, act)
	}
	if _, act := allow(t, tb, t0.Add(10*time.Millisecond+time.Second), kW, 1); act != ActAcquire {
		t.Fatalf("after the refresh: action %v, want acquire", act)
	}

	// Refused for a need of 3: a request needing 1 asks the region.
	tb = newTestTable(t)
	acquire(t, tb, t0, t0.Add(10*time.Millisecond), kW, 3, 0, never)
	if d, _ := allow(t, tb, t0.Add(100*time.Millisecond), kW, 3); !d.RetryNever {
		t.Errorf("cost 3 after never for 3: %+v, want RetryNever", d)
	}
	if d, act := allow(t, tb, t0.Add(100*time.Millisecond), kW, 1); act != ActAcquire || d.WouldDeny {
		t.Errorf("cost 1 after never for 3: %+v, action %v; want no decision, acquire", d, act)
	}

	// A wait named by the region clears the never.
	acquire(t, tb, t0.Add(2*time.Second), t0.Add(2010*time.Millisecond), kW, 3, 0, func(g *sluicev1.Grant) { g.RetryAfterMs = 300 })
	if d, _ := allow(t, tb, t0.Add(2100*time.Millisecond), kW, 3); d.RetryNever || d.RetryAfter != 210*time.Millisecond {
		t.Errorf("after a wait of 300ms: %+v, want RetryAfter 210ms and no RetryNever", d)
	}

	// Shadow: served, so no RetryNever.
	tb = newTestTable(t)
	acquire(t, tb, t0, t0.Add(10*time.Millisecond), kW, 1, 0, func(g *sluicev1.Grant) { never(g); g.Shadow = true })
	if d, _ := allow(t, tb, t0.Add(100*time.Millisecond), kW, 1); !d.Allowed || !d.WouldDeny || d.RetryNever {
		t.Errorf("shadow never: %+v, want allowed, WouldDeny, no RetryNever", d)
	}
}

// TestNeverWithinTheCapIsAWait: the region answers "never" when its
// bucket's cap less the tokens out in leases cannot hold what was asked,
// or its rate is zero. Tokens out in leases come back (released,
// expired), the allocator grants a region with a global tier more of the
// burst, and gives a region on its floor (a zero rate: partition_share 0
// while its static lease lapsed or it is drained) its rate back, so a cost
// within the key's configured burst is denied with a wait, even above the
// region's current cap or at a zero rate: on the lease path until the key
// asks the region again (its next refresh after the answer), on the strict
// path a refresh. RetryNever is kept for a cost above the configured
// burst, and, for an unleased region (no global tier: its cap and rate
// are its static share for good), for a cost above its cap or a zero rate.
func TestNeverWithinTheCapIsAWait(t *testing.T) {
	const capTokens = 4 // region burst 4.5, limit 10: a cap of 4 whole tokens
	burst, rate, zero := 4.5, 2.0, 0.0
	for _, tc := range []struct {
		name      string
		strict    bool
		unleased  bool
		cost      int64
		rate      *float64
		noCap     bool // the answer names no rate or burst: neither is known
		wantNever bool
	}{
		{name: "lease: one token", cost: 1, rate: &rate},
		{name: "lease: the whole cap", cost: capTokens, rate: &rate},
		{name: "lease: above the cap, within the burst", cost: capTokens + 1, rate: &rate},
		{name: "lease: the whole burst", cost: 10, rate: &rate},
		{name: "lease: zero rate", cost: 1, rate: &zero},
		{name: "lease, unleased: the whole cap", unleased: true, cost: capTokens, rate: &rate},
		{name: "lease, unleased: above the cap", unleased: true, cost: capTokens + 1, rate: &rate, wantNever: true},
		{name: "lease, unleased: zero rate", unleased: true, cost: 1, rate: &zero, wantNever: true},
		{name: "strict: one token", strict: true, cost: 1, rate: &rate},
		{name: "strict: the whole cap", strict: true, cost: capTokens, rate: &rate},
		{name: "strict: above the cap, within the burst", strict: true, cost: capTokens + 1, rate: &rate},
		{name: "strict: above the burst", strict: true, cost: 11, rate: &rate, wantNever: true},
		{name: "strict: zero rate", strict: true, cost: 1, rate: &zero},
		{name: "strict: no rate known", strict: true, cost: 1, rate: &rate, noCap: true},
		{name: "strict, unleased: the whole cap", strict: true, unleased: true, cost: capTokens, rate: &rate},
		{name: "strict, unleased: above the cap", strict: true, unleased: true, cost: capTokens + 1, rate: &rate, wantNever: true},
		{name: "strict, unleased: zero rate", strict: true, unleased: true, cost: 1, rate: &zero, wantNever: true},
		{name: "strict, unleased: no cap known", strict: true, unleased: true, cost: 1, rate: &rate, noCap: true, wantNever: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTestTable(t)
			answered := t0.Add(10 * time.Millisecond)
			now := t0.Add(100 * time.Millisecond)
			var d quota.Decision
			if tc.strict {
				resp := &sluicev1.CheckResponse{Limit: 10, RetryAfterMs: -1, RegionRate: tc.rate, RegionBurst: &burst, Unleased: tc.unleased}
				if tc.noCap {
					resp.RegionRate, resp.RegionBurst = nil, nil
				}
				var err error
				if d, err = tb.ApplyCheck(now, kExp, tc.cost, resp); err != nil {
					t.Fatal(err)
				}
			} else {
				acquire(t, tb, t0, answered, kW, tc.cost, 0, func(g *sluicev1.Grant) {
					g.RetryAfterMs, g.RegionRate, g.RegionBurst, g.Limit, g.LiveInstances = -1, *tc.rate, burst, 10, 4
					g.Unleased = tc.unleased
				})
				var act Action
				if d, act = allow(t, tb, now, kW, tc.cost); act != ActNone {
					t.Fatalf("after the never answer: action %v, want a decision", act)
				}
			}
			if d.Allowed || !d.WouldDeny {
				t.Fatalf("decision %+v, want denied", d)
			}
			wantRetry := time.Duration(0)
			switch {
			case tc.wantNever:
			case tc.strict:
				wantRetry = tb.Options().Refresh
			default:
				wantRetry = answered.Add(tb.Options().Refresh).Sub(now) // until the key asks again
			}
			if d.RetryNever != tc.wantNever || d.RetryAfter != wantRetry {
				t.Fatalf("decision %+v; want RetryNever %v, RetryAfter %v", d, tc.wantNever, wantRetry)
			}
		})
	}
}

// TestAZeroedRateAsksAgainSoon: a grant that zeroes the region's rate for
// a key (a grant of nothing carries a rate of a few times the smallest
// float64) most often comes before the global tier heard this region's
// demand for it, and the region's share comes back within a few of the
// global tier's answers. So the first "never" after the rate fell to zero,
// or the cap below the request, holds the key's requests for a quarter of
// a refresh, not a whole one; a rate or cap that stays so is asked about
// once a refresh; an unleased region's rate is its static share for good.
func TestAZeroedRateAsksAgainSoon(t *testing.T) {
	zeroed := func(g *sluicev1.Grant) {
		g.RetryAfterMs, g.RegionRate, g.RegionBurst = -1, math.SmallestNonzeroFloat64, 0
	}
	// spend takes the pool's tokens at at, so the next request asks.
	spend := func(tb *Table, at time.Time, n int) {
		for range n {
			if d, _ := allow(t, tb, at, kW, 1); !d.Allowed {
				t.Fatalf("spending the pool: %+v", d)
			}
		}
	}
	// A grant that gives the rate back with a cap below the request (the
	// donors' instances still hold the tokens of their larger caps) is a
	// zeroed share too; a never while the cap still holds the request
	// (tokens out in other leases) is not: a refresh.
	capped := func(g *sluicev1.Grant) { g.RetryAfterMs, g.RegionRate, g.RegionBurst = -1, 134, 0 }
	capOfOne := func(g *sluicev1.Grant) { g.RegionBurst = 1 }
	neverAtOne := func(g *sluicev1.Grant) { g.RetryAfterMs, g.RegionBurst = -1, 1 }
	for _, tc := range []struct {
		share         string
		before, grant func(*sluicev1.Grant)
		first         time.Duration
	}{
		{"rate zeroed", capOfOne, zeroed, 150 * time.Millisecond},
		{"cap below the request", capOfOne, capped, 150 * time.Millisecond},
		{"cap still holding the request", capOfOne, neverAtOne, 900 * time.Millisecond},
	} {
		tb := newTestTable(t)
		acquire(t, tb, t0, t0.Add(10*time.Millisecond), kW, 1, 1, tc.before)
		spend(tb, t0.Add(20*time.Millisecond), 1)
		at := t0.Add(100 * time.Millisecond)
		acquire(t, tb, at, at.Add(10*time.Millisecond), kW, 1, 0, tc.grant)
		if d, act := allow(t, tb, at.Add(110*time.Millisecond), kW, 1); act != ActNone || d.Allowed || d.RetryNever || d.RetryAfter != tc.first {
			t.Fatalf("%s by a grant: %+v, action %v; want denied, RetryAfter %v", tc.share, d, act, tc.first)
		}
		at = at.Add(tc.first + 160*time.Millisecond) // past the first never
		acquire(t, tb, at, at.Add(10*time.Millisecond), kW, 1, 0, tc.grant)
		if d, act := allow(t, tb, at.Add(510*time.Millisecond), kW, 1); act != ActNone || d.RetryAfter != 500*time.Millisecond {
			t.Fatalf("%s, and it stayed so: %+v, action %v; want denied, RetryAfter 500ms (a refresh from the answer)", tc.share, d, act)
		}
	}

	tb := newTestTable(t)
	unleased := func(g *sluicev1.Grant) { g.Unleased = true }
	acquire(t, tb, t0, t0.Add(10*time.Millisecond), kW, 1, 2, unleased)
	spend(tb, t0.Add(20*time.Millisecond), 2)
	at := t0.Add(360 * time.Millisecond)
	acquire(t, tb, at, at.Add(10*time.Millisecond), kW, 1, 0, zeroed, unleased)
	if d, act := allow(t, tb, at.Add(510*time.Millisecond), kW, 1); act != ActNone || !d.RetryNever {
		t.Fatalf("an unleased region's zero rate: %+v, action %v; want denied with RetryNever until a refresh from the answer", d, act)
	}
}
