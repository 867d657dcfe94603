package lease

import (
	"testing"
	"time"
)

// TestDegradedOutlivesAForgottenKeyInTheCore: a key decided by its
// on_failure policy and then forgotten as idle, the region having
// answered nothing, leaves the table degraded with no degraded key (the
// unanswered state); a later degraded decision is the same episode, and
// only an answer ends the mode.
func TestDegradedOutlivesAForgottenKeyInTheCore(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) { o.IdleTimeout = 3 * time.Second })
	if _, err := tb.Fallback(t0, kW, 1); err != nil {
		t.Fatal(err)
	}
	for s := 1; s <= 10 && tb.Len() != 0; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		syncs, _ := tb.PrepareSync(now)
		for _, b := range syncs {
			tb.Failed(now, b) // the region answers nothing
		}
	}
	if tb.Len() != 0 {
		t.Fatalf("%d keys held, want the idle degraded key forgotten", tb.Len())
	}
	if !tb.Degraded() || tb.DegradedKeys() != 0 || tb.DegradedEpisodes() != 1 {
		t.Fatalf("degraded key forgotten, region silent: degraded %v, keys %d, episodes %d; want true, 0, 1",
			tb.Degraded(), tb.DegradedKeys(), tb.DegradedEpisodes())
	}
	if _, err := tb.Fallback(t0.Add(20*time.Second), kR, 1); err != nil {
		t.Fatal(err)
	}
	if tb.DegradedEpisodes() != 1 {
		t.Fatalf("episodes %d after a degraded decision within the same silence, want 1", tb.DegradedEpisodes())
	}
	tb.Answered()
	if !tb.Degraded() {
		t.Fatal("an answer for another call ended degraded mode while a held key is degraded")
	}
}
