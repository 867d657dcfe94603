package lease

import (
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestCheckAnswerLearnsTheRegionsBucket: a strict check's answer that
// names the region's bucket (rate and burst both, neither negative, a rate
// or burst of 0 or below 1 included) gives even the first decision on a
// key its cap in whole tokens, at most the key's limit, and its refill; an
// answer naming only one of them, a negative one, or no limit leaves the
// cap unknown.
func TestCheckAnswerLearnsTheRegionsBucket(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name        string
		limit       int64
		rate, burst *float64
		known       bool
		cap         int64
		refill      float64
	}{
		{"rate and burst", 5, f(2), f(3), true, 3, 2},
		{"rate of 0", 5, f(0), f(3), true, 3, 0},
		{"rate below 1", 5, f(0.5), f(3), true, 3, 0.5},
		{"burst of 0", 5, f(2), f(0), true, 0, 2},
		{"burst below 1", 5, f(2), f(0.5), true, 0, 2},
		{"burst above a limit of 1", 1, f(2), f(3), true, 1, 2},
		{"negative rate", 5, f(-1), f(3), false, 0, 0},
		{"negative burst", 5, f(2), f(-1), false, 0, 0},
		{"rate alone", 5, f(2), nil, false, 0, 0},
		{"burst alone", 5, nil, f(3), false, 0, 0},
		{"no limit", 0, f(2), f(3), false, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTestTable(t)
			d, err := tb.ApplyCheck(t0, kExp, 1, &sluicev1.CheckResponse{
				Allowed: true, Limit: tc.limit, Remaining: 4, RegionRate: tc.rate, RegionBurst: tc.burst,
			})
			if err != nil {
				t.Fatal(err)
			}
			if d.CapKnown != tc.known || d.Cap != tc.cap || d.Refill != tc.refill {
				t.Fatalf("decision CapKnown %v Cap %d Refill %v; want %v, %d, %v", d.CapKnown, d.Cap, d.Refill, tc.known, tc.cap, tc.refill)
			}
			want := int64(4)
			if tc.known {
				want = min(want, tc.cap)
			}
			if d.Remaining != want {
				t.Fatalf("decision Remaining %d with 4 left in the answer; want %d", d.Remaining, want)
			}
			c, ok := tb.Cap(kExp)
			if ok != tc.known || c != tc.cap {
				t.Fatalf("Cap %d, %v; want %d, %v", c, ok, tc.cap, tc.known)
			}
		})
	}
}

// TestCapNotKnownIsZero: Cap says 0 beside false, with no StaticShare
// hook, for a key the hook has no share of, and for a share of negative
// burst.
func TestCapNotKnownIsZero(t *testing.T) {
	neg := quota.Key{Tenant: "neg", Class: "write"}
	tb := newTestTable(t, func(o *TableOptions) {
		o.StaticShare = func(k quota.Key) (quota.Limit, bool) {
			return quota.Limit{Rate: 1, Burst: -1}, k == neg
		}
	})
	for _, k := range []quota.Key{kW, neg} {
		if c, ok := tb.Cap(k); ok || c != 0 {
			t.Errorf("Cap(%s) = %d, %v; want 0, false", k, c, ok)
		}
	}
	if c, ok := newTestTable(t).Cap(kW); ok || c != 0 {
		t.Errorf("Cap without a StaticShare hook = %d, %v; want 0, false", c, ok)
	}
}
