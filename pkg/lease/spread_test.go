package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestPeersDeniedTogetherAskAgainAtSpreadInstants: instances the region
// denies at the same instant, told the same wait, ask again (and tell
// their callers to retry) at instants spread over one refill of the tokens
// they need, never more than the wait itself, drawn apart by their start;
// a lone instance, and a key whose bucket has no room beyond the need (a
// spread would leave it full and waste refill), ask at the region's
// instant.
func TestPeersDeniedTogetherAskAgainAtSpreadInstants(t *testing.T) {
	const step = 200 * time.Millisecond // one token at 5/s
	retryAfter := func(seqBase uint64, live int64, burst float64, wait time.Duration) time.Duration {
		tb := newTestTable(t, func(o *TableOptions) { o.SeqBase = seqBase })
		acquire(t, tb, t0, t0, kW, 1, 0, func(g *sluicev1.Grant) {
			g.RegionRate, g.RegionBurst, g.LiveInstances, g.Limit, g.RetryAfterMs = 5, burst, live, 10, wait.Milliseconds()
		})
		d, act := allow(t, tb, t0, kW, 1)
		if act != ActNone || d.Allowed || d.RetryNever {
			t.Fatalf("a request after the region's denial: %+v, action %v; want denied with a wait", d, act)
		}
		return d.RetryAfter
	}
	for _, tc := range []struct {
		name   string
		live   int64
		burst  float64
		wait   time.Duration // the region's
		spread time.Duration // the draws lie in [wait, wait+spread)
	}{
		{"two peers, room for four refills", 2, 5, step, step},                // one refill of the need
		{"two peers, a wait shorter than a refill", 2, 5, step / 2, step / 2}, // at most the wait
		{"two peers, room for half a refill", 2, 1.5, step, step / 2},         // (burst - need) / rate
		{"two peers, no room beyond the need", 2, 1, step, 0},                 // a bucket of one token
		{"a lone instance", 1, 5, step, 0},                                    // races no one
	} {
		t.Run(tc.name, func(t *testing.T) {
			const draws = 64
			below := 0 // draws in the first half of the spread
			for i := range uint64(draws) {
				base := 1000*i + 7
				got := retryAfter(base, tc.live, tc.burst, tc.wait)
				if tc.spread == 0 {
					if got != tc.wait {
						t.Fatalf("seq base %d: RetryAfter %v, want the region's %v", base, got, tc.wait)
					}
					continue
				}
				if got < tc.wait || got >= tc.wait+tc.spread {
					t.Fatalf("seq base %d: RetryAfter %v, want in [%v, %v)", base, got, tc.wait, tc.wait+tc.spread)
				}
				if got < tc.wait+tc.spread/2 {
					below++
				}
			}
			if tc.spread > 0 && (below < draws/4 || below > 3*draws/4) {
				t.Errorf("%d of %d draws in the first half of the spread; want them spread over it", below, draws)
			}
		})
	}
}
