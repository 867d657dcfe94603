package regional

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestLowClockKeepsTheClosestReadingOfItsWindow: the lower estimate of
// Redis time is the reading with the largest offset (the reply that came
// back fastest) among those less than lowWindow older than the newest,
// extrapolated on the local clock; a reading that came back slowly never
// lowers it, and one older than the window gives way to any newer one.
func TestLowClockKeepsTheClosestReadingOfItsWindow(t *testing.T) {
	c := newLowClock()
	at := func(d time.Duration) time.Time { return c.base.Add(d) }
	if _, ok := c.estimate(at(0)); ok {
		t.Fatal("an estimate before any reading")
	}
	const r0 = int64(1_700_000_000_000_000)
	// Redis read r0 at local 10ms; the reply came back at 11ms.
	c.note(r0, at(11*time.Millisecond))
	est := func(d time.Duration) int64 {
		t.Helper()
		v, ok := c.estimate(at(d))
		if !ok {
			t.Fatal("no estimate after a reading")
		}
		return v
	}
	if got, want := est(20*time.Millisecond), r0+9_000; got != want {
		t.Fatalf("estimate 9ms after the reply: %d, want %d", got, want)
	}
	// A reply that came back 50ms after Redis read its time (offset 50ms
	// lower): the closer reading stays.
	c.note(r0+100_000, at(160*time.Millisecond))
	if got, want := est(200*time.Millisecond), r0+189_000; got != want {
		t.Fatalf("a slow reply lowered the estimate: %d, want %d", got, want)
	}
	// A closer one replaces it.
	c.note(r0+300_000, at(300*time.Millisecond+500*time.Microsecond))
	if got, want := est(400*time.Millisecond), r0+399_500; got != want {
		t.Fatalf("a closer reading was not taken: %d, want %d", got, want)
	}
	// Past the window any newer reading replaces it (a Redis clock stepped
	// back by 20ms is followed).
	late := 300*time.Millisecond + 500*time.Microsecond + lowWindow
	c.note(r0+int64(late/time.Microsecond)-20_000, at(late))
	if got, want := est(late+time.Millisecond), r0+int64(late/time.Microsecond)-19_000; got != want {
		t.Fatalf("a reading past the window was not taken: %d, want %d", got, want)
	}
	// The local receive time is rounded up to the microsecond: 100ns
	// after a reply received 900ns after base, Redis time may still be the
	// microsecond it read.
	c2 := newLowClock()
	c2.note(r0, c2.base.Add(900*time.Nanosecond))
	if v, _ := c2.estimate(c2.base.Add(1000 * time.Nanosecond)); v > r0 {
		t.Fatalf("estimate %d 100ns after the reply of a reading of %d", v, r0)
	}
}

// TestLowClockTakesNothingFromAFakeClock: a server made outside a
// synctest bubble and called inside it sees local times before its
// clock's origin: it takes no reading from them and derives no deadline
// (a deadline of the fake clock's year 2000 failed every script).
func TestLowClockTakesNothingFromAFakeClock(t *testing.T) {
	c := newLowClock()
	synctest.Test(t, func(t *testing.T) {
		now := time.Now()
		if !c.foreign(now) {
			t.Fatalf("a fake clock's %v is this clock's", now)
		}
		c.note(1_700_000_000_000_000, now)
		if v, ok := c.estimate(c.base); ok {
			t.Fatalf("a reading taken on a fake clock: estimate %d", v)
		}
	})
	if c.foreign(time.Now()) {
		t.Fatal("the real clock is foreign")
	}
}
