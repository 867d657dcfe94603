package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestLeaseNeverDenial: when the region answers a lease request "never"
// (retry_after_ms -1: what was asked exceeds what its bucket can ever hold
// at its cap), the lease path's denials carry RetryNever and no RetryAfter,
// instead of promising the next refresh; a request needing less than what
// was refused asks the region (the "never" says nothing of it: the bucket
// may hold what it needs now). After the refresh the key asks again, in
// case the region's cap grew.
func TestLeaseNeverDenial(t *testing.T) {
	never := func(g *sluicev1.Grant) { g.RetryAfterMs = -1 }
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
	acquire(t, tb, t0, t0.Add(10*time.Millisecond), kW, 1, 0, func(g *sluicev1.Grant) { g.RetryAfterMs, g.Shadow = -1, true })
	if d, _ := allow(t, tb, t0.Add(100*time.Millisecond), kW, 1); !d.Allowed || !d.WouldDeny || d.RetryNever {
		t.Errorf("shadow never: %+v, want allowed, WouldDeny, no RetryNever", d)
	}
}
