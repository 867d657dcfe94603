package stallmeter

import (
	"testing"
	"time"
)

// TestSinceCountsOnlyWhatFollowsFrom: a stall counts in full when it
// began after from, by its part after from when from fell inside it, and
// not at all when it ended before from.
func TestSinceCountsOnlyWhatFollowsFrom(t *testing.T) {
	m := Start(t)
	m.Stop()
	t0 := time.Now()
	m.note(t0.Add(100*time.Millisecond), 40*time.Millisecond) // lost (60ms, 100ms]
	m.note(t0.Add(300*time.Millisecond), 50*time.Millisecond) // lost (250ms, 300ms]
	for _, c := range []struct {
		from time.Duration
		want time.Duration
	}{
		{0, 90 * time.Millisecond},
		{80 * time.Millisecond, 70 * time.Millisecond},
		{100 * time.Millisecond, 50 * time.Millisecond},
		{270 * time.Millisecond, 30 * time.Millisecond},
		{300 * time.Millisecond, 0},
	} {
		if got := m.Since(t0.Add(c.from)); got != c.want {
			t.Errorf("Since(t0+%v) = %v, want %v", c.from, got, c.want)
		}
	}
	if got := m.Total(); got < 90*time.Millisecond {
		t.Errorf("Total %v, want at least the 90ms noted", got)
	}
}

// TestStopEndsTheMeter: Stop ends the meter's goroutine, may be called
// again, and the meter measures nothing after it.
func TestStopEndsTheMeter(t *testing.T) {
	m := Start(t)
	first := m.Stop()
	select {
	case <-m.done:
	default:
		t.Fatal("the meter's goroutine runs on after Stop")
	}
	if again := m.Stop(); again != first {
		t.Fatalf("a second Stop measured %v, the first %v", again, first)
	}
}
