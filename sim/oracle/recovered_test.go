package oracle

import (
	"math"
	"slices"
	"testing"
	"time"
)

// recoveredRun offers traffic(i) tokens in each second i of a 60 s run
// on the twoRegions key (rate 100: the ideal bucket admits up to 100 a
// second) and admits what traffic says, denying the rest.
func recoveredRun(t *testing.T, warmup time.Duration, changes []Change, recovery time.Duration,
	traffic func(i int) (offered, admitted int64)) Recovered {
	t.Helper()
	o := twoRegions(t, func(s *Setup) {
		s.Duration, s.Warmup, s.Changes, s.Recovery = 60*sec, warmup, changes, recovery
	})
	for i := 0; i < 60; i++ {
		off, adm := traffic(i)
		if off == 0 {
			continue
		}
		at := time.Duration(i)*sec + sec/2
		o.Offered(at, 0, 0, off, 1)
		if adm > 0 {
			o.Decided(at, 0, 0, adm, SourceLease)
		}
		if off > adm {
			o.Decided(at, 0, 0, off-adm, SourceDenied)
		}
	}
	if lvl := o.s.RecoveredLevel * 500; lvl != 485 {
		t.Fatalf("the default level of a 5 s window of 100/s is %v, not 485", lvl)
	}
	return o.Finish(60 * sec).Recovered
}

// full serves 100 a second except in the seconds listed, where it admits
// what the map says.
func full(bad map[int]int64) func(int) (int64, int64) {
	return func(i int) (int64, int64) {
		if a, ok := bad[i]; ok {
			return 100, a
		}
		return 100, 100
	}
}

// TestRecoveryTimes: a change's recovery time is from the change until
// every 5 s window after it, up to the next change or the end, admits at
// least the level (97%) of what the ideal bucket did; -1 when that never
// holds for a whole window.
func TestRecoveryTimes(t *testing.T) {
	at := func(s float64) time.Duration { return time.Duration(s * float64(sec)) }
	for _, c := range []struct {
		name    string
		changes []Change
		traffic func(int) (int64, int64)
		labels  []string
		took    []time.Duration
	}{
		{"no dip, change mid-second: recovered at the next whole second",
			[]Change{{At: at(10.5), Label: "a"}}, full(nil), []string{"a"}, []time.Duration{sec / 2}},
		{"no dip, change a nanosecond past a second",
			[]Change{{At: 10*sec + 1, Label: "a"}}, full(nil), []string{"a"}, []time.Duration{sec - 1}},
		{"no dip, change on a second", []Change{{At: 10 * sec, Label: "a"}}, full(nil), []string{"a"}, []time.Duration{0}},
		{"outage of three seconds: five more to fill a window", []Change{{At: 10 * sec, Label: "a"}},
			full(map[int]int64{10: 0, 11: 0, 12: 0}), []string{"a"}, []time.Duration{7 * sec}},
		{"windows exactly at the level are recovered", []Change{{At: 30 * sec, Label: "a"}},
			full(map[int]int64{40: 85}), []string{"a"}, []time.Duration{0}},
		{"a token under the level is not", []Change{{At: 30 * sec, Label: "a"}},
			full(map[int]int64{40: 84}), []string{"a"}, []time.Duration{15 * sec}},
		{"below the level in the last window: never recovered", []Change{{At: 10 * sec, Label: "a"}},
			full(map[int]int64{59: 0}), []string{"a"}, []time.Duration{-1}},
		{"recovered for exactly one window before the end", []Change{{At: 10 * sec, Label: "a"}},
			full(map[int]int64{50: 0}), []string{"a"}, []time.Duration{45 * sec}},
		{"changes one window apart", []Change{{At: 10 * sec, Label: "a"}, {At: 15 * sec, Label: "b"}},
			full(nil), []string{"a", "b"}, []time.Duration{0, 0}},
		{"changes closer than a window", []Change{{At: 10 * sec, Label: "a"}, {At: 13 * sec, Label: "b"}},
			full(nil), []string{"a", "b"}, []time.Duration{-1, 0}},
		{"a later change's dip is its own", []Change{{At: 10 * sec, Label: "a"}, {At: 30 * sec, Label: "b"}},
			full(map[int]int64{31: 0, 32: 0, 33: 0}), []string{"a", "b"}, []time.Duration{0, 8 * sec}},
		{"changes in time order, ties as given",
			[]Change{{At: 30 * sec, Label: "b"}, {At: 10 * sec, Label: "a"}, {At: 30 * sec, Label: "c"}, {At: 20 * sec, Label: "x"}},
			full(nil), []string{"a", "x", "b", "c"}, []time.Duration{0, 0, -1, 0}},
		{"a window with a single token offered counts",
			[]Change{{At: 10 * sec, Label: "a"}},
			func(i int) (int64, int64) {
				switch {
				case i == 20:
					return 1, 0
				case i >= 10 && i <= 30:
					return 0, 0
				}
				return 100, 100
			}, []string{"a"}, []time.Duration{15 * sec}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc := recoveredRun(t, 0, c.changes, 0, c.traffic)
			var labels []string
			var took []time.Duration
			for i, e := range rc.Each {
				labels = append(labels, e.Label)
				took = append(took, e.Took)
				if e.At != c.changes[slices.IndexFunc(c.changes, func(ch Change) bool { return ch.Label == e.Label })].At {
					t.Errorf("change %d %q at %v", i, e.Label, e.At)
				}
			}
			if !slices.Equal(labels, c.labels) || !slices.Equal(took, c.took) {
				t.Fatalf("changes %v took %v, want %v took %v", labels, took, c.labels, c.took)
			}
		})
	}
}

// TestRecoveredSecondsAndRatios: which whole seconds the recovered
// measures count (after the warmup, outside [change, change + recovery)
// rounded out to whole seconds) and the ratios over them.
func TestRecoveredSecondsAndRatios(t *testing.T) {
	outage := full(map[int]int64{10: 0, 11: 0, 12: 0})
	for _, c := range []struct {
		name     string
		warmup   time.Duration
		changes  []Change
		recovery time.Duration
		traffic  func(int) (int64, int64)
		seconds  int
		vsIdeal  float64 // NaN: none
		falseRej float64
	}{
		{"every second", 0, nil, 0, full(nil), 60, 1, 0},
		{"warmup a nanosecond past a second", 10*sec + 1, nil, 0, full(nil), 49, 1, 0},
		{"recovery a nanosecond past a second", 0, []Change{{At: 20 * sec}}, 10*sec + 1, full(nil), 49, 1, 0},
		{"change at the start", 0, []Change{{At: 0}}, 5 * sec, full(nil), 55, 1, 0},
		{"change mid-second without recovery", 0, []Change{{At: 20*sec + sec/2}}, 0, full(nil), 59, 1, 0},
		{"recovery past the end", 0, []Change{{At: 58 * sec}}, 10 * sec, full(nil), 58, 1, 0},
		// 300 denied below the fair share of 100/s: 99 a second are false
		// (one token of slack).
		{"an outage counted", 0, []Change{{At: 40 * sec}}, 5 * sec, outage, 55, 5200.0 / 5500, 297.0 / 5500},
		{"an outage left out", 0, []Change{{At: 10 * sec}}, 3 * sec, outage, 57, 1, 0},
		{"no traffic", 0, nil, 0, func(int) (int64, int64) { return 0, 0 }, 60, math.NaN(), 0},
		{"a single token", 0, nil, 0, func(i int) (int64, int64) {
			if i == 5 {
				return 1, 1
			}
			return 0, 0
		}, 60, 1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc := recoveredRun(t, c.warmup, c.changes, c.recovery, c.traffic)
			if rc.Seconds != c.seconds || rc.Recovery != c.recovery || rc.Level != 0.97 {
				t.Fatalf("measured %d s (recovery %v, level %v), want %d", rc.Seconds, rc.Recovery, rc.Level, c.seconds)
			}
			if math.IsNaN(c.vsIdeal) != math.IsNaN(rc.VsIdeal) || (!math.IsNaN(c.vsIdeal) && math.Abs(rc.VsIdeal-c.vsIdeal) > 1e-12) {
				t.Fatalf("vs ideal %v, want %v", rc.VsIdeal, c.vsIdeal)
			}
			if !(math.Abs(rc.FalseRejects-c.falseRej) <= 1e-12) {
				t.Fatalf("false rejects %v, want %v", rc.FalseRejects, c.falseRej)
			}
		})
	}
}
