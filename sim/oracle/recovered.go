package oracle

import (
	"math"
	"sort"
	"time"
)

// Recovered are the measures taken outside every change's recovery
// window: how well the system serves once it has had Setup.Recovery to
// settle after each disturbance.
type Recovered struct {
	// Recovery is Setup.Recovery; Seconds the whole seconds measured.
	Recovery time.Duration
	Seconds  int
	// VsIdeal is admitted / what the ideal central bucket admitted over
	// those seconds (NaN when the ideal bucket admitted nothing there).
	VsIdeal float64
	// FalseRejects is a fraction of the tokens offered in those seconds.
	FalseRejects float64
	// Level is the admitted/ideal ratio recovery times are measured
	// against (Setup.RecoveredLevel).
	Level float64
	// Each is every change with its measured recovery time.
	Each []ChangeOutcome
}

// ChangeOutcome is one change and how long the system took to recover.
type ChangeOutcome struct {
	At    time.Duration
	Label string
	// Took is the time from the change until every 5 s window after it
	// (up to the next change or the end) admitted at least Level of what
	// the ideal bucket did; -1 when it never did.
	Took time.Duration
}

// recoverWindow is the window recovery times are judged on: short enough
// to time a recovery, long enough to average the arrivals' noise.
const recoverWindow = 5

// recovered fills r.Recovered from the per-second totals.
func (o *Oracle) recovered(r *Result) {
	warm := int((o.s.Warmup + time.Second - 1) / time.Second)
	n := int(o.s.Duration / time.Second) // whole seconds only
	excluded := make([]bool, n)
	changes := append([]Change(nil), o.s.Changes...)
	sort.SliceStable(changes, func(i, j int) bool { return changes[i].At < changes[j].At })
	for _, c := range changes {
		from := int(c.At / time.Second)
		to := int((c.At + o.s.Recovery + time.Second - 1) / time.Second)
		for i := max(from, 0); i < min(to, n); i++ {
			excluded[i] = true
		}
	}
	rec := Recovered{Recovery: o.s.Recovery, Level: o.s.RecoveredLevel, VsIdeal: math.NaN()}
	var adm, ideal, off, fr float64
	for i := warm; i < n; i++ {
		if excluded[i] {
			continue
		}
		rec.Seconds++
		adm += o.secAdm[i]
		ideal += o.secIdeal[i]
		off += o.secOff[i]
		fr += o.secFalse[i]
	}
	if ideal > 0 {
		rec.VsIdeal = adm / ideal
	}
	if off > 0 {
		rec.FalseRejects = fr / off
	}
	for ci, c := range changes {
		end := n
		if ci+1 < len(changes) {
			end = min(end, int(changes[ci+1].At/time.Second))
		}
		start := int((c.At + time.Second - 1) / time.Second)
		rec.Each = append(rec.Each, ChangeOutcome{At: c.At, Label: c.Label, Took: o.recoveryTime(start, end, c.At)})
	}
	r.Recovered = rec
}

// recoveryTime is how long after at (whose first whole second is start)
// every recoverWindow-second window up to end stays at or above the
// level: the end of the last window below it, -1 when none fits.
func (o *Oracle) recoveryTime(start, end int, at time.Duration) time.Duration {
	if end-start < recoverWindow {
		return -1
	}
	last := -1 // last second of the latest window below the level
	for s := start; s+recoverWindow <= end; s++ {
		var adm, ideal float64
		for i := s; i < s+recoverWindow; i++ {
			adm += o.secAdm[i]
			ideal += o.secIdeal[i]
		}
		if ideal > 0 && adm < o.s.RecoveredLevel*ideal {
			last = s + recoverWindow
		}
	}
	if last < 0 {
		return max(0, time.Duration(start)*time.Second-at)
	}
	if last+recoverWindow > end {
		return -1 // never stayed up for a whole window before the next change
	}
	return time.Duration(last)*time.Second - at
}
