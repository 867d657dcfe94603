package regionsync

import (
	"cmp"
	"slices"
	"time"

	"github.com/sluicehq/sluice/internal/shrink"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Selection: which keys a region reports.
//
// A region reports only the keys that need the global tier, so its
// control-plane cost per epoch grows with its contended keys, not with
// all its keys. The scripts mark such keys into per-slot candidate sets
// in the region's Redis (luascripts, lib.lua's "Candidates": a demand
// reading at half the static share, or a grant, until its expiry), and
// each report the leader reads the marks since CandidatesSince and the
// keys it selected before (Select), reads only their states, and reports
// them. A selected key stays in the reports while its demand is at least
// LowShare of the region's static share, while it holds a valid grant,
// and while an acknowledgement is owed (a grant was installed since it
// was last reported); it leaves after LowEpochs epoch reports in a row
// without any of these (hysteresis between the marking threshold, half
// the share, and LowShare: a key near the threshold does not flap in and
// out). A key left out of a report counts as no demand at the global
// tier, and the region holds its static share for it unless granted
// otherwise: what the region would do anyway for a key whose demand fits
// in its share.

// LowShare is the share of the region's static share of a key below
// which its demand counts as low for leaving the reports.
const LowShare = 0.25

// LowEpochs is how many epoch reports in a row a key's demand stays low,
// with no valid grant and no acknowledgement owed, before it leaves the
// reports.
const LowEpochs = 3

// CandidateHorizon is how far back (in epochs) a candidate mark puts a
// key in a report: two, so a mark between two epoch reports is read even
// when one round failed.
const CandidateHorizon = 2

// CandidatesSince is the oldest candidate score (Redis time, µs) that
// puts a key in a report sent at sendUS; the leader trims older marks.
// A grant's mark scores its expiry, so a granted key is a candidate until
// CandidateHorizon epochs after its grant ends.
func CandidatesSince(sendUS int64, epoch time.Duration) int64 {
	return sendUS - (CandidateHorizon * epoch).Microseconds()
}

// MarkEvery is the scripts' mark interval (luascripts.Common.MarkEvery)
// for an allocation epoch: a quarter epoch, so a key that crosses the
// threshold is marked within a quarter epoch of its next script call and
// reported by the next epoch report, while a hot key costs its slot's
// candidate set at most four writes per epoch.
func MarkEvery(epoch time.Duration) time.Duration {
	return max(epoch/4, time.Millisecond).Truncate(time.Millisecond)
}

// selected is what the leader remembers of a key it reports.
type selected struct {
	low int  // epoch reports in a row with low demand, no grant, no ack owed
	ack bool // a grant was installed since the key was last reported
}

// Select is the keys to read for a report: the candidates read from the
// region's candidate sets and the keys selected before, each once, in
// key order (tenant, then class).
func (l *Leader) Select(candidates []quota.Key) []quota.Key {
	out := make([]quota.Key, 0, len(l.sel)+len(candidates))
	for k := range l.sel {
		out = append(out, k)
	}
	for _, k := range candidates {
		if _, ok := l.sel[k]; !ok {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b quota.Key) int {
		if c := cmp.Compare(a.Tenant, b.Tenant); c != 0 {
			return c
		}
		return cmp.Compare(a.Class, b.Class)
	})
	return slices.CompactFunc(out, func(a, b quota.Key) bool { return a == b })
}

// Selected is how many keys the leader keeps reporting without a mark.
func (l *Leader) Selected() int { return len(l.sel) }

// Installed records the grants an answer installed (applied[i] for
// installs[i], as for Outcome): an acknowledgement is owed for each, so
// the key is reported next even when it was not in the report answered
// (the global tier may grant a key the region did not report). The tokens
// an install clipped (Install.Released) go with the next report that
// still finds its grant held; an install of another grant drops what was
// released under the one before.
func (l *Leader) Installed(installs []Install, applied []bool) {
	for i, in := range installs {
		if !applied[i] {
			continue
		}
		e := l.sel[in.Key]
		e.ack, e.low = true, 0
		l.sel[in.Key] = e
		l.release(in.Key, grantTag{rate: in.Rate, burst: in.Burst, expiryUS: in.ExpiryUS}, in.Released)
	}
}

// noteSelected updates the selection from a report of kind just built
// from reads, with demand[i] the demand reported for reads[i] (tokens/s).
func (l *Leader) noteSelected(kind Kind, reads []KeyRead, demand []float64) {
	if kind == Epoch {
		// A selected key that was not read (its class left the config)
		// leaves.
		in := make(map[quota.Key]bool, len(reads))
		for _, r := range reads {
			in[r.Key] = true
		}
		for k := range l.sel {
			if !in[k] {
				delete(l.sel, k)
			}
		}
	}
	for i, r := range reads {
		e := l.sel[r.Key]
		// Demand counts when there is some: on its floor a region's share
		// may be 0.
		needed := (demand[i] > 0 && demand[i] >= LowShare*r.StaticRate) || r.State.GrantExpiryUS > 0 || e.ack
		e.ack = false
		switch {
		case needed:
			e.low = 0
		case kind == Epoch:
			e.low++
		}
		if e.low >= LowEpochs {
			delete(l.sel, r.Key)
			continue
		}
		l.sel[r.Key] = e
	}
	l.selPeak.Note(len(l.sel))
	l.sel = shrink.Map(l.sel, &l.selPeak)
}
