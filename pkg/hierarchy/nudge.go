package hierarchy

// Nudges: moving capacity within a fraction of an epoch.
//
// Capacity moves from a donor to a recipient only once the donor has
// acknowledged its smaller grant (make before break, fence.go), and the
// allocator hears a region only when it reports. With reports once per
// epoch, a shift therefore waits for the donor's next epoch report (up to
// an epoch), its acknowledgement, and the recipient's next report (a third
// of an epoch after a short answer, ReportAgain). A nudge asks a region
// for its report now instead; the transport (AllocatorService.Watch, the
// simulator's link) delivers it, and the region answers with an ordinary
// report, so a lost, late or duplicated nudge changes timing only, never
// what is safe: every grant still goes through the fence.
//
// Report marks two kinds of regions, and TakeNudges hands them out:
//
//   - donors: when a fenced grant falls materially short of its target
//     (the same test that sets raisePending), every other region counted
//     above its own target for that key (it holds or may fall back to more
//     than the allocator now wants it to) is asked to report, so that it
//     receives its smaller grant and acknowledges it at once;
//   - waiting recipients: when a report lowers what its region is counted
//     at for some key (an acknowledgement freed capacity), every region
//     whose last answer was short (raisePending) is asked to report again,
//     and so is every region whose target for that key is now materially
//     above what it may use (nudgeRaises). The second kind matters when the
//     report that freed the capacity also raised the others' targets: a
//     donor whose demand fell reports its fall, is answered a smaller grant
//     and acknowledges it, while the recipient's last answer met its target
//     of before the fall and was not short; without the nudge it would wait
//     for its next epoch report.
//
// Cost: each report marks at most every other region once, and regions
// bound how often a nudge may start a round (regionsync.NudgeSpacing), so
// nudges at most multiply a region's report rate by a constant while
// capacity moves, and cost nothing in steady state (no answer is short and
// no acknowledgement frees anything).

// peakUse is the most a region summarized by sm (counted at cr, cb
// without a grant) may use of a key, rate and burst, at some time within
// the shortest grant validity from t: its summary says it may use v until
// T, then what it is counted at (lanesFor reads it the same way).
func (a *Allocator) peakUse(t int64, sm summary, cr, cb float64) (rate, burst float64) {
	horizon := t + a.minValidity
	peak := func(v float64, until int64, counted float64) float64 {
		p := 0.0
		if until > t {
			p = v
		}
		if until < horizon {
			p = max(p, counted)
		}
		return p
	}
	return peak(sm.rateV, sm.rateT, cr), peak(sm.burstV, sm.burstT, cb)
}

// nudgeDonors marks the regions other than ri that block b counts above
// their targets (peakUse): they hold, or may fall back to, the capacity ri
// waits for.
func (a *Allocator) nudgeDonors(t int64, b int32, ri int, sh *shares) {
	k := a.blockKey[b]
	base := int(b) * a.nr
	l := &a.limits[k]
	for j := 0; j < a.nr; j++ {
		if j == ri {
			continue
		}
		cr, cb := sh.cR[j], sh.cB[j]
		pr, pb := a.peakUse(t, a.summaries[base+j], cr, cb)
		if pr > a.targetRate[base+j]+1e-9*l.Rate || pb > a.targetBurst[base+j]+1e-9*l.Burst {
			a.markNudge(j)
		}
	}
}

// nudgeWaiting marks every region other than ri whose last answer fell
// short: ri's report just freed capacity they may be waiting for.
func (a *Allocator) nudgeWaiting(ri int) {
	for j := range a.regions {
		if j != ri && a.regions[j].raisePending {
			a.markNudge(j)
		}
	}
}

// nudgeRaises marks every region other than ri whose target for block b
// is above what it may use (peakUse) by more than raisePending's test: ri's
// report just freed capacity of the key, and such a region's next report
// would be answered a raise.
func (a *Allocator) nudgeRaises(t int64, b int32, ri int, sh *shares) {
	base := int(b) * a.nr
	l := &a.limits[a.blockKey[b]]
	for j := 0; j < a.nr; j++ {
		if j == ri {
			continue
		}
		pr, _ := a.peakUse(t, a.summaries[base+j], sh.cR[j], sh.cB[j])
		if want := a.targetRate[base+j]; a.materiallyShort(want, want-pr, l.Rate) {
			a.markNudge(j)
		}
	}
}

func (a *Allocator) markNudge(j int) {
	if len(a.nudge) != a.nr {
		a.nudge = make([]bool, a.nr)
	}
	a.nudge[j] = true
}

// TakeNudges returns the regions that should report now (see the comment
// at the top of nudge.go), in configuration order, and forgets them. The
// caller delivers a nudge to each; delivery is best effort.
func (a *Allocator) TakeNudges() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for j, n := range a.nudge {
		if n {
			out = append(out, a.regions[j].Name)
			a.nudge[j] = false
		}
	}
	return out
}
