package regional

import (
	"testing"
	"time"
)

// TestLogThrottleSpacesLinesPerKey: the first event of a key is logged,
// later ones within the interval are left out and counted into the next
// logged line, and keys are spaced independently.
func TestLogThrottleSpacesLinesPerKey(t *testing.T) {
	t0 := time.Unix(1000, 0)
	lt := newLogThrottle(time.Second)
	steps := []struct {
		key         string
		at          time.Duration
		ok          bool
		wantLeftOut int
	}{
		{"acquire", 0, true, 0},
		{"acquire", 10 * time.Millisecond, false, 0},
		{"sync", 20 * time.Millisecond, true, 0}, // another key: its own spacing
		{"acquire", 999 * time.Millisecond, false, 0},
		{"acquire", time.Second, true, 2}, // the interval is over: two left out
		{"acquire", 1500 * time.Millisecond, false, 0},
		{"sync", 1500 * time.Millisecond, true, 0},
		{"acquire", 3 * time.Second, true, 1},
	}
	for i, s := range steps {
		ok, leftOut := lt.allow(s.key, t0.Add(s.at))
		if ok != s.ok || leftOut != s.wantLeftOut {
			t.Errorf("step %d (%s at %v): logged %v, left out %d; want %v, %d", i, s.key, s.at, ok, leftOut, s.ok, s.wantLeftOut)
		}
	}
}
