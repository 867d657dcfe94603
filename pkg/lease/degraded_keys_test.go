package lease

import (
	"testing"
	"time"
)

// TestDegradedUntilEveryDegradedKeyIsAnswered: degraded mode lasts until
// the region answers a call again and every key decided by its on_failure
// policy has been answered or forgotten (docs/operations.md, "Degraded
// mode"): an answer for another key ends the unanswered state but not
// the mode while a degraded key waits for its own answer.
func TestDegradedUntilEveryDegradedKeyIsAnswered(t *testing.T) {
	tb := newTestTable(t)
	if _, err := tb.Fallback(t0, kW, 1); err != nil {
		t.Fatal(err)
	}
	if !tb.Degraded() {
		t.Fatal("not degraded after a decision by the on_failure policy")
	}
	at := t0.Add(time.Second)
	acquire(t, tb, at, at, kR, 1, 1)
	if !tb.Degraded() || tb.DegradedKeys() != 1 {
		t.Fatalf("after an answer for another key: degraded %v, degraded keys %d; want still degraded, 1 key", tb.Degraded(), tb.DegradedKeys())
	}
	acquire(t, tb, at, at, kW, 1, 1)
	if tb.Degraded() || tb.DegradedKeys() != 0 {
		t.Fatalf("after an answer for the degraded key: degraded %v, degraded keys %d; want neither", tb.Degraded(), tb.DegradedKeys())
	}
}
