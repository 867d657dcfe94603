package logthrottle

import (
	"fmt"
	"testing"
	"time"
)

// TestThrottleSpacesLinesPerKey: the first event of a key is logged,
// later ones within the interval are left out and counted into the next
// logged line, and keys are spaced independently.
func TestThrottleSpacesLinesPerKey(t *testing.T) {
	t0 := time.Unix(1000, 0)
	lt := New(time.Second)
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
		ok, leftOut := lt.Allow(s.key, t0.Add(s.at))
		if ok != s.ok || leftOut != s.wantLeftOut {
			t.Errorf("step %d (%s at %v): logged %v, left out %d; want %v, %d", i, s.key, s.at, ok, leftOut, s.ok, s.wantLeftOut)
		}
	}
}

// TestThrottleForgetsOldQuietKeys: past maxKeys keys (peers that came and
// went), the keys last logged an interval ago with nothing left out since
// are forgotten, so the map stays bounded; a key with events left out is
// kept, and its count reaches its next line.
func TestThrottleForgetsOldQuietKeys(t *testing.T) {
	t0 := time.Unix(1000, 0)
	lt := New(time.Second)
	for i := range maxKeys {
		lt.Allow(fmt.Sprintf("peer-%d", i), t0)
	}
	lt.Allow("peer-0", t0.Add(time.Millisecond)) // left out: kept
	if ok, _ := lt.Allow("late", t0.Add(time.Second)); !ok {
		t.Fatal("a new key was not logged")
	}
	if n := len(lt.last); n != 2 {
		t.Errorf("%d keys remembered after the old quiet ones were forgotten, want 2 (peer-0 and late)", n)
	}
	if ok, left := lt.Allow("peer-0", t0.Add(time.Second)); !ok || left != 1 {
		t.Errorf("peer-0 after its interval: logged %v, left out %d; want true, 1", ok, left)
	}
}
