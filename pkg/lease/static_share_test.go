package lease

import (
	"math"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestNeverDescribedKeyRunsAtTheLowerOfFallbackAndStaticShare: a key the
// region never described has no region rate to divide, so its local
// policy ran at FallbackLimit (10/s, burst 10) whatever its configured
// limit. With TableOptions.StaticShare it runs at the lower of the two,
// rate and burst each: a 1/s key with burst 2 in this region admits 2,
// then one a second; a share above FallbackLimit keeps FallbackLimit; a
// share of the burst below one token still admits one. A key the hook
// does not name, or names with no usable rate, keeps FallbackLimit. The
// hook is not asked for a key the region described (its share decides),
// nor under the open and closed policies.
func TestNeverDescribedKeyRunsAtTheLowerOfFallbackAndStaticShare(t *testing.T) {
	shares := map[quota.Key]quota.Limit{
		kW:                                 {Rate: 1, Burst: 2},
		{Tenant: "big", Class: "write"}:    {Rate: 500, Burst: 1000},
		{Tenant: "nounit", Class: "write"}: {Rate: 0.5, Burst: 0},
		{Tenant: "norate", Class: "write"}: {Rate: 0, Burst: 5},
		{Tenant: "nan", Class: "write"}:    {Rate: math.NaN(), Burst: 5},
		{Tenant: "inf", Class: "write"}:    {Rate: math.Inf(1), Burst: 5},
		{Tenant: "acme", Class: "open"}:    {Rate: 1, Burst: 1},
		kExp:                               {Rate: 1, Burst: 1},
	}
	asked := map[quota.Key]int{}
	tb := newTestTable(t, func(o *TableOptions) {
		o.StaticShare = func(k quota.Key) (quota.Limit, bool) {
			asked[k]++
			l, ok := shares[k]
			return l, ok
		}
	})
	// burst then refill: the local bucket's burst, and what one second
	// later admits, from requests of one token.
	burstThenRefill := func(k quota.Key, now time.Time) (burst, refill int) {
		t.Helper()
		for range 50 {
			d, err := tb.Fallback(now, k, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Degraded {
				t.Fatalf("%s: %+v, want degraded", k, d)
			}
			if d.Allowed {
				burst++
			}
		}
		for range 50 {
			if d, _ := tb.Fallback(now.Add(time.Second), k, 1); d.Allowed {
				refill++
			}
		}
		return burst, refill
	}
	for _, tc := range []struct {
		name          string
		key           quota.Key
		burst, refill int
	}{
		{"1/s, burst 2 in this region", kW, 2, 1},
		{"a share above FallbackLimit", quota.Key{Tenant: "big", Class: "write"}, 10, 10},
		{"no whole token of burst in this region", quota.Key{Tenant: "nounit", Class: "write"}, 1, 0},
		{"a share without rate: ignored", quota.Key{Tenant: "norate", Class: "write"}, 10, 10},
		{"a share of rate NaN: ignored", quota.Key{Tenant: "nan", Class: "write"}, 10, 10},
		{"a share of rate +Inf: ignored", quota.Key{Tenant: "inf", Class: "write"}, 10, 10},
		{"a key the config does not resolve", quota.Key{Tenant: "other", Class: "write"}, 10, 10},
	} {
		if burst, refill := burstThenRefill(tc.key, t0); burst != tc.burst || refill != tc.refill {
			t.Errorf("%s: admitted %d at once and %d a second later, want %d and %d", tc.name, burst, refill, tc.burst, tc.refill)
		}
	}
	// The share of 0.5/s: a second token two seconds after the first.
	nounit := quota.Key{Tenant: "nounit", Class: "write"}
	if d, _ := tb.Fallback(t0.Add(2*time.Second), nounit, 1); !d.Allowed {
		t.Errorf("0.5/s share, 2s after its one token: %+v, want allowed", d)
	}

	// Open and closed decide without a limit: the hook is not asked.
	for _, k := range []quota.Key{{Tenant: "acme", Class: "open"}, kExp} {
		tb.Fallback(t0, k, 1)
		if asked[k] != 0 {
			t.Errorf("%s under %v: StaticShare asked %d times, want never", k, tb.opts.Classes[k.Class].OnFailure, asked[k])
		}
	}

	// A key the region described runs at the region's share (here 40/s,
	// burst 80 over 4 instances: burst 20), not the config's, and the
	// hook is not asked for it.
	learned := quota.Key{Tenant: "learned", Class: "write"}
	shares[learned] = quota.Limit{Rate: 1, Burst: 1}
	acquire(t, tb, t0, t0, learned, 1, 0, func(g *sluicev1.Grant) {
		g.RegionRate, g.RegionBurst, g.LiveInstances, g.RetryAfterMs = 40, 80, 4, 0
	})
	d, _ := tb.Fallback(t0, learned, 1)
	if d.Cap != 20 || asked[learned] != 0 {
		t.Errorf("a key the region described: Cap %d, StaticShare asked %d times; want the region's share, 20, and never", d.Cap, asked[learned])
	}

	// A key the region answered without a rate (a region on its floor
	// whose static lease lapsed) has no region share to divide: the
	// static share bounds it as if it was never described.
	floor := quota.Key{Tenant: "floor", Class: "write"}
	shares[floor] = quota.Limit{Rate: 1, Burst: 2}
	acquire(t, tb, t0, t0, floor, 1, 0, func(g *sluicev1.Grant) {
		g.RegionRate, g.RegionBurst, g.LiveInstances, g.RetryAfterMs = 0, 80, 4, 0
	})
	if burst, refill := burstThenRefill(floor, t0); burst != 2 || refill != 1 {
		t.Errorf("a key the region answered with no rate: admitted %d at once and %d a second later, want the static share's 2 and 1", burst, refill)
	}
}

// TestNeverDescribedKeyRefillsNoFasterThanFallbackLimit: the static
// share bounds a never-described key's rate and burst each on its own: a
// share of 500/s with burst 2 runs at burst 2 and FallbackLimit's 10/s, so
// a tenth of a second after its burst it admits one token, not both.
func TestNeverDescribedKeyRefillsNoFasterThanFallbackLimit(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) {
		o.StaticShare = func(quota.Key) (quota.Limit, bool) { return quota.Limit{Rate: 500, Burst: 2}, true }
	})
	admitted := func(now time.Time) (n int, refill float64) {
		t.Helper()
		for range 10 {
			d, err := tb.Fallback(now, kW, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			}
			refill = d.Refill
		}
		return n, refill
	}
	if n, refill := admitted(t0); n != 2 || refill != tb.opts.FallbackLimit.Rate {
		t.Fatalf("admitted %d at once at %v/s, want the share's burst 2 at FallbackLimit's %v/s", n, refill, tb.opts.FallbackLimit.Rate)
	}
	if n, _ := admitted(t0.Add(100 * time.Millisecond)); n != 1 {
		t.Fatalf("admitted %d a tenth of a second later, want 1 at FallbackLimit's rate", n)
	}
}

// TestCapIsTheRegionsAnswerElseTheStaticShare: Cap reports what the
// region last said of a key the table holds; for a key it does not hold
// (never answered, or forgotten), or holds without a cap the region
// said yet, the live config's static share of the
// key in this region, in whole tokens, which is the cap the region answers
// for a key it holds no grant of; nothing without a share (no hook, a key
// the hook does not name, a negative burst). The Envoy endpoint's never
// form reports it instead of the configured burst (pkg/envoyrls
// TestNeverAnswerCarriesTheRegionsCapNotTheBurst).
func TestCapIsTheRegionsAnswerElseTheStaticShare(t *testing.T) {
	neg := quota.Key{Tenant: "neg", Class: "write"}
	zero := quota.Key{Tenant: "zero", Class: "write"}
	shares := map[quota.Key]quota.Limit{kW: {Rate: 2.5, Burst: 2}, neg: {Rate: 1, Burst: -1}, zero: {Rate: 0.5, Burst: 0}}
	tb := newTestTable(t, func(o *TableOptions) {
		o.StaticShare = func(k quota.Key) (quota.Limit, bool) {
			l, ok := shares[k]
			return l, ok
		}
	})
	if c, ok := tb.Cap(kW); !ok || c != 2 {
		t.Fatalf("Cap of a key never answered: %d, %v; want its static share's burst 2", c, ok)
	}
	// A share holding no whole token is a cap, of 0.
	if c, ok := tb.Cap(zero); !ok || c != 0 {
		t.Fatalf("Cap of a key whose static share holds no token: %d, %v; want 0", c, ok)
	}
	for _, k := range []quota.Key{{Tenant: "unnamed", Class: "write"}, neg} {
		if c, ok := tb.Cap(k); ok {
			t.Errorf("Cap(%s) = %d with no usable share, want none", k, c)
		}
	}
	// A key the table holds (a request made it) that the region has not
	// answered yet: its cap is not known, so the static share still says it.
	allow(t, tb, t0, kW, 1)
	if c, ok := tb.Cap(kW); !ok || c != 2 {
		t.Fatalf("Cap of a key held but never answered: %d, %v; want its static share's burst 2", c, ok)
	}
	acquire(t, tb, t0, t0.Add(10*time.Millisecond), kW, 1, 1, func(g *sluicev1.Grant) { g.RegionBurst = 7.5; g.Limit = 10 })
	if c, ok := tb.Cap(kW); !ok || c != 7 {
		t.Fatalf("Cap of a key the region answered: %d, %v; want the region's cap in whole tokens, 7", c, ok)
	}
	if c, ok := newTestTable(t).Cap(kW); ok {
		t.Fatalf("Cap without a StaticShare hook: %d, want none", c)
	}
}
