package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLocalBucketCapIsAtMostTheLimit: a decision's Cap is at most the
// key's Limit (quota.Decision), the local policy's too: a FallbackLimit
// burst of 4 on a key whose limit is 3 (a region that names no rate of its
// own, so the local bucket is FallbackLimit's) is a Cap of 3.
func TestLocalBucketCapIsAtMostTheLimit(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) { o.FallbackLimit = quota.Limit{Rate: 2, Burst: 4} })
	acquire(t, tb, t0, t0, kW, 1, 0, func(g *sluicev1.Grant) {
		g.RegionRate, g.RegionBurst, g.Limit, g.RetryAfterMs = 0, 3, 3, 0
	})
	d, err := tb.Fallback(t0, kW, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Limit != 3 || !d.CapKnown || d.Cap != 3 {
		t.Fatalf("local decision on a key of limit 3 with a local burst of 4: %+v; want allowed, Limit 3, Cap 3", d)
	}
}

// TestCapCountsABurstJustBelowAWholeToken: a region burst a static share
// split into a float just below a whole number (30 − 1e-10 of a limit of
// 100) is a cap of 30 whole tokens, not 29: float error loses no token.
func TestCapCountsABurstJustBelowAWholeToken(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 5, func(g *sluicev1.Grant) { g.RegionBurst, g.Limit = 30-1e-10, 100 })
	d, _ := allow(t, tb, t0, kW, 1)
	if !d.Allowed || !d.CapKnown || d.Cap != 30 {
		t.Fatalf("a decision under a region burst of 30 − 1e-10: %+v; want allowed, Cap 30", d)
	}
}

// TestLocalRemainingCountsWholeTokens: a local decision's Remaining is
// the whole tokens the caller can spend now, below the cost on a denial
// (quota.Decision): a bucket of 2/s spent empty holds half a token 250ms
// later, which is a denial of one token with Remaining 0, not 1.
func TestLocalRemainingCountsWholeTokens(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) { o.FallbackLimit = quota.Limit{Rate: 2, Burst: 4} })
	if d, err := tb.Fallback(t0, kW, 4); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the whole local burst: %+v, %v; want allowed, Remaining 0", d, err)
	}
	d, _ := tb.Fallback(t0.Add(250*time.Millisecond), kW, 1)
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != 250*time.Millisecond {
		t.Fatalf("one token with half a token refilled: %+v; want denied, Remaining 0, RetryAfter 250ms", d)
	}
}
