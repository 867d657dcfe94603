package lease

import (
	"testing"
	"time"
)

// TestCoreOpenBreakerPreparesNoReport: a request while the breaker is open
// and cooling down is decided by its policy without a report being built
// (none ended unsent, none left pending); once the cooldown is over one
// request probes the region and the others are decided by their policy
// until the probe ends.
func TestCoreOpenBreakerPreparesNoReport(t *testing.T) {
	c, tb, brk := newTestCore(t, 0, 50*time.Millisecond)
	for range DefaultBreakerFailures {
		brk.Failure(t0)
	}
	s := c.Slow(kW, 1)
	st := stepTo(t, "open breaker", s.Next(t0.Add(time.Millisecond)), DoDecided)
	if !st.Degraded || st.Ended != nil {
		t.Fatalf("open breaker: %+v, want degraded with no batch ended", st)
	}
	if ks := state(t, tb, kW); ks.Pending != nil || ks.InFlight {
		t.Fatalf("open breaker: report pending %v in flight %v, want none", ks.Pending, ks.InFlight)
	}

	after := t0.Add(DefaultBreakerCooldown)
	probe := c.Slow(kW, 1)
	stepTo(t, "first request after the cooldown", probe.Next(after), DoAcquire)
	other := c.Slow(kR, 1)
	st = stepTo(t, "second request while the probe is out", other.Next(after), DoDecided)
	if !st.Degraded {
		t.Fatalf("second request while the probe is out: %+v, want the policy's decision", st)
	}
}
