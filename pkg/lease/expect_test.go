package lease

import (
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestDecisionSaysWhatTheCallerCanExpect: a region holding 2.5 of a key's
// burst of 5 (a static share split by weight) grants 1 token and keeps 1.
// Decisions carry the policy (Limit 5), the region's whole-token cap
// (Cap 2) and, as Remaining, the instance's pool plus the region's bucket
// at its answer, never above the cap and below the cost on a denial.
func TestDecisionSaysWhatTheCallerCanExpect(t *testing.T) {
	tb := newTestTable(t)
	key := quota.Key{Tenant: "newcomer", Class: "write"}
	region := func(g *sluicev1.Grant) { g.Limit, g.RegionBurst, g.RegionRate, g.Remaining = 5, 2.5, 1, 1 }
	acquire(t, tb, t0, t0, key, 1, 1, region)

	d, _ := allow(t, tb, t0, key, 1)
	if !d.Allowed || d.Limit != 5 || !d.CapKnown || d.Cap != 2 || d.Remaining != 1 {
		t.Fatalf("first decision %+v: want allowed, Limit 5 (policy), Cap 2 (region), Remaining 1 (0 held + 1 in the region)", d)
	}
	// The pool is empty: the next request acquires; the region has 1 left.
	acquire(t, tb, t0, t0, key, 1, 1, func(g *sluicev1.Grant) { region(g); g.Remaining = 0 })
	if d, _ := allow(t, tb, t0, key, 1); !d.Allowed || d.Remaining != 0 || d.Cap != 2 {
		t.Fatalf("second decision %+v: want allowed with nothing left of the cap 2", d)
	}
	// A region that reports more than its cap (a stale answer) is capped.
	acquire(t, tb, t0, t0, key, 1, 1, func(g *sluicev1.Grant) { region(g); g.Remaining = 40 })
	if d, _ := allow(t, tb, t0, key, 1); d.Remaining != 2 {
		t.Fatalf("decision %+v: Remaining must not exceed the cap 2", d)
	}
	// A denial says fewer than the cost remain.
	d = tb.deny(tb.keys.load(key), tb.keys.load(key).info.Load(), 2, 0)
	if d.Allowed || d.Remaining >= 2 {
		t.Fatalf("denial %+v: want Remaining below the cost 2", d)
	}
}

// TestCheckCarriesTheRegionsBucket: a check's answer naming the region's
// rate and burst makes the cap known from the first decision (the whole
// burst when it is fractional, never above the limit); one naming a
// negative figure (never sent), only one of the two, or no limit teaches
// nothing.
func TestCheckCarriesTheRegionsBucket(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name          string
		rate, burst   *float64
		limit, remain int64
		wantKnown     bool
		wantCap       int64
		wantRemaining int64
	}{
		{"the region's half", f(2), f(5), 10, 4, true, 5, 4},
		{"a fractional share", f(0.5), f(2.5), 10, 9, true, 2, 2},
		{"above the limit", f(2), f(40), 10, 9, true, 10, 9},
		{"an empty region", f(0), f(0), 10, 0, true, 0, 0},
		{"a negative burst", f(2), f(-1), 10, 4, false, 0, 4},
		{"a negative rate", f(-2), f(5), 10, 4, false, 0, 4},
		{"the burst alone", nil, f(5), 10, 4, false, 0, 4},
		{"the rate alone", f(2), nil, 10, 4, false, 0, 4},
		{"a rate just below zero", f(-0.5), f(5), 10, 4, false, 0, 4},
		{"a burst just below zero", f(2), f(-0.5), 10, 4, false, 0, 4},
		{"a limit of one", f(2), f(5), 1, 1, true, 1, 1},
		{"no limit named", f(2), f(5), 0, 4, false, 0, 4},
	} {
		tb := newTestTable(t)
		key := quota.Key{Tenant: "acme", Class: "export"}
		d, err := tb.ApplyCheck(t0, key, 1, &sluicev1.CheckResponse{Allowed: true, Limit: tc.limit, Remaining: tc.remain, ResetMs: 1000,
			RegionRate: tc.rate, RegionBurst: tc.burst})
		if err != nil {
			t.Fatal(err)
		}
		if d.CapKnown != tc.wantKnown || d.Cap != tc.wantCap || d.Remaining != tc.wantRemaining || d.Limit != tc.limit {
			t.Errorf("%s: decision %+v; want cap %d known %v, Remaining %d, Limit %d", tc.name, d, tc.wantCap, tc.wantKnown, tc.wantRemaining, tc.limit)
		}
	}
}

// TestStrictCheckWithoutAGrantKnowsNoCap: a strict class configured up
// front never gets a grant, so the region's burst is unknown; its checks
// must not claim a cap of 0 (X-RateLimit-Limit would say nothing can be
// had while requests are admitted): Cap is not known and Limit is shown.
func TestStrictCheckWithoutAGrantKnowsNoCap(t *testing.T) {
	tb := newTestTable(t)
	key := quota.Key{Tenant: "acme", Class: "export"}
	d, err := tb.ApplyCheck(t0, key, 1, &sluicev1.CheckResponse{Allowed: true, Limit: 3, Remaining: 2, ResetMs: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.CapKnown || d.Limit != 3 || d.Remaining != 2 {
		t.Fatalf("decision %+v: want allowed, Limit 3, Remaining 2, no cap known", d)
	}
	d, err = tb.ApplyCheck(t0, key, 3, &sluicev1.CheckResponse{Limit: 3, Remaining: 2, RetryAfterMs: 500})
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Remaining != 2 || d.RetryAfter <= 0 {
		t.Fatalf("denial %+v: want Remaining 2 (below the cost 3) and a retry time", d)
	}
}
