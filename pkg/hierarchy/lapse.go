package hierarchy

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// The static share is a lease. A region may run on its static shares only
// while it holds a static lease, which the Allocator confers in its
// answers (Answer.StaticLease = RegionLease, measured by the region from
// the send time of the report it answers); without one the region runs on
// its floor (Floor of the static share by KeyLimit.FloorShare).
//
// Lapse. The region's lease ends at most RegionLease after the send time
// of the last report answered, so at most RegionLease after the Allocator
// received it. Once the Allocator has received nothing from a region for
// RegionLease + Validity + LapseMargin (its grants have expired too, and
// the margin covers clock rates), the region surely runs on its floor
// without grants. The region is then pending (PendingLapses); the caller
// makes the lapsed set durable and calls LapseDurable, and only from then
// on is the region counted at its floor: its share above the floor goes to
// the others through the usual water-fill and fencing.
//
// Return. A lapsed region that reports again at T is returning: it is
// counted at max(grant, static share) in every decision from T on, its
// own grants fall back to its floor, and it is conferred a static lease
// only once every grant issued before T (counting it at its floor) has
// expired, at T + Validity, or earlier when the fencing shows that its
// static shares fit next to every grant the others may hold.
//
// Leader change. A new leader (BecomeLeader, or NewAllocator with
// Options.Lapsed) is given the durable lapsed set: it confers no static
// lease to those regions while learning (the previous leader's grants may
// count them at their floor), and counts every region as not heard from
// since it took over. Removal from the durable set may lag (LapsedSet
// shrinks once a lease is conferred): a region in the set is never counted
// at its floor on the set's word alone.

// RegionState is what the Allocator knows about a region's static lease.
type RegionState string

// Region states (the wire's RegionStatus.state).
const (
	// StateLive: heard from within the silence timeout.
	StateLive RegionState = "live"
	// StateSilent: not heard from within the silence timeout; counted at
	// max(grant, static share) until its lapse is durable.
	StateSilent RegionState = "silent"
	// StateLapsed: its static lease surely lapsed and the lapse is durable:
	// counted at its floor.
	StateLapsed RegionState = "lapsed"
	// StateReturning: reporting again after a lapse (or in the durable
	// lapsed set a new leader read), not yet conferred a static lease.
	StateReturning RegionState = "returning"
	// StateDrained: the config drains it; its static share is its floor.
	StateDrained RegionState = "drained"
)

// lapseState is one region's static-lease state.
type lapseState struct {
	// heardAt is when the latest report (a retry included) was received,
	// or when the Allocator started or became leader if none since.
	heardAt int64
	// lapsed: its lapse is durable, it is counted at its floor.
	lapsed bool
	// returning: it may run on its floor (lapsed before, or in the durable
	// lapsed set); no static lease before confirmAt unless the fencing
	// proves it safe.
	returning bool
	confirmAt int64
	// inSet: named in the durable lapsed set given at BecomeLeader.
	inSet bool
	// conferredAt is when a static lease was last conferred (negInf never).
	conferredAt int64
}

// LapseMargin is the clock margin added to RegionLease + Validity before
// a silent region's static lease counts as lapsed: one epoch, or 1% of
// the region lease when that is longer (clock rates may differ by that
// much over the lease).
func LapseMargin(epoch, regionLease time.Duration) int64 {
	return int64(max(epoch, regionLease/100))
}

func (a *Allocator) freshLapseState() lapseState {
	return lapseState{heardAt: a.clock, conferredAt: negInf}
}

// markLapsedSet marks the named regions as in the durable lapsed set.
func (a *Allocator) markLapsedSet(names []string) {
	for _, name := range names {
		if i, ok := a.regionIndex[name]; ok {
			a.regions[i].inSet = true
		}
	}
}

// heard records that region ri's report was received at t: a lapsed
// region (or one in the durable lapsed set) becomes returning.
func (a *Allocator) heard(t int64, ri int) {
	rs := &a.regions[ri]
	rs.heardAt = t
	switch {
	case rs.lapsed:
		rs.lapsed, rs.returning = false, true
		rs.confirmAt = t + a.validity
		if rs.inSet {
			// Lapsing again under this leader (while learning was
			// extended past a lapse period) leaves the set's wait as it
			// was: a previous leader's grants may count it at its floor
			// until learning ends, later than its own lapse's grants.
			rs.confirmAt = max(rs.confirmAt, a.learnUntil)
		}
		a.sharesChanged()
		a.resummarizeAll()
	case rs.inSet && !rs.returning:
		// A previous leader's grants may count it at its floor until
		// learning ends; this leader never has.
		rs.returning = true
		rs.confirmAt = a.learnUntil
		a.sharesChanged()
	}
}

// confer decides the static lease of the answer to region ri at t.
func (a *Allocator) confer(t int64, ri int) time.Duration {
	rs := &a.regions[ri]
	if rs.lapsed {
		return 0
	}
	if rs.returning {
		if t < rs.confirmAt && (t < a.learnUntil || !a.returnSafe(t, ri)) {
			return 0
		}
		rs.returning, rs.inSet = false, false
		a.sharesChanged()
	}
	rs.conferredAt = t
	return time.Duration(a.regionLease)
}

// returnSafe says whether region ri's static shares fit, from t on, next
// to what every other region may use for every key with fencing state
// (keys without it have no grant above a fallback anywhere). Only valid
// outside learning, when every grant in force is in the fences.
func (a *Allocator) returnSafe(t int64, ri int) bool {
	for b := range a.blockKey {
		k := a.blockKey[b]
		if k < 0 {
			continue
		}
		sh := a.loadShares(k)
		a.lanesFor(t, int32(b), ri, sh)
		s, sb := sh.sR[ri], sh.sB[ri]
		rl, bl := &a.rateLane, &a.burstLane
		// The slack forgives the last-bit differences rounding leaves
		// between a share and the headroom it equals (as fallbackSafe).
		if rl.minHeadroom(t, posInf)+1e-12*s < s || bl.minHeadroom(t, posInf)+1e-12*sb < sb {
			return false
		}
	}
	return true
}

// PendingLapses lists (in region order) the regions not heard from for
// longer than RegionLease + Validity + LapseMargin whose lapse is not
// durable yet. Make the lapsed set (LapsedSet plus these) durable, then
// call LapseDurable for each.
func (a *Allocator) PendingLapses(now time.Time) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.peek(now)
	var out []string
	for i := range a.regions {
		if rs := &a.regions[i]; !rs.lapsed && t-rs.heardAt > a.lapseAfter {
			out = append(out, rs.Name)
		}
	}
	return out
}

// LapseDurable is called once region is in the durable lapsed set: if it
// still has not been heard from for longer than RegionLease + Validity +
// LapseMargin, it is counted at its floor from now on and LapseDurable
// reports true; otherwise (it reported since, or it is already lapsed)
// nothing changes. An unknown region is an error wrapping quota.ErrInvalid.
func (a *Allocator) LapseDurable(now time.Time, region string) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ri, ok := a.regionIndex[region]
	if !ok {
		return false, fmt.Errorf("hierarchy: lapse: %w: unknown region %q", quota.ErrInvalid, region)
	}
	t := a.tick(now)
	rs := &a.regions[ri]
	if rs.lapsed || t-rs.heardAt <= a.lapseAfter {
		return false, nil
	}
	rs.lapsed, rs.returning = true, false
	a.sharesChanged()
	a.resummarizeAll()
	return true, nil
}

// LapsedSet is what the durable lapsed set must hold at least (in region
// order): the regions counted at their floor, and those that may still
// be, until they are conferred a static lease again.
func (a *Allocator) LapsedSet() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for i := range a.regions {
		if rs := &a.regions[i]; rs.lapsed || rs.returning || rs.inSet {
			out = append(out, rs.Name)
		}
	}
	return out
}

// RegionLease is the static lease the Allocator confers.
func (a *Allocator) RegionLease() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return time.Duration(a.regionLease)
}

// regionState is region i's state at t for the View.
func (a *Allocator) regionStateAt(t int64, i int) RegionState {
	rs := &a.regions[i]
	switch {
	case rs.Drained:
		return StateDrained
	case rs.lapsed:
		return StateLapsed
	case rs.returning:
		return StateReturning
	case !rs.reported || t-rs.lastAt > a.silence:
		return StateSilent
	}
	return StateLive
}

// StartOwning is called when an Allocator that owned no keys until now
// starts owning some (a shard of the global tier that a change of the
// shard count makes an owner, pkg/allocator). While it owned nothing no
// region had reason to report to it, so silence counted before now says
// nothing: every region not counted at its floor counts as heard at now,
// as a newly elected leader's regions do, and one that reports promptly
// is live, not returning (a region named in the durable lapsed set is
// still returning while learning, and a lapsed one stays at its floor).
//
// noGrantsOut says that no grant this Allocator (or an earlier leader of
// the same keys) issued can still be valid: it owned nothing for longer
// than any grant lasts. Then a lapse it holds (counted at the floor,
// returning, or named in the durable lapsed set) protects nothing, since
// only its own grants ever counted those regions at their floor: they
// start afresh at now too, counted at max(grant, static share) until
// they lapse again. Without noGrantsOut those states stay.
func (a *Allocator) StartOwning(now time.Time, noGrantsOut bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tick(now)
	changed := false
	for i := range a.regions {
		rs := &a.regions[i]
		if noGrantsOut && (rs.lapsed || rs.returning || rs.inSet) {
			rs.lapsed, rs.returning, rs.inSet, rs.confirmAt = false, false, false, 0
			changed = true
		}
		// A lapsed region's silence no longer matters; any other lapses
		// later for it, which is safe.
		rs.heardAt = max(rs.heardAt, t)
	}
	if changed {
		a.sharesChanged()
		a.resummarizeAll()
	}
}
