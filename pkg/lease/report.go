package lease

import (
	"errors"
	"fmt"
	"math"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Batch is a set of reports (at most one per key) to send in one RPC now.
// Every key in it is marked in flight until Apply, Failed or Reject is
// called with the batch, and no other report for those keys is prepared
// meanwhile. Not safe for concurrent use; hand it to one goroutine.
type Batch struct {
	// Reports go on the wire as they are; do not modify them.
	Reports []*sluicev1.KeyReport
	entries []*entry
	sentAt  time.Time
	useSync bool
}

// SentAt is the send time the batch was prepared for. Lease deadlines are
// measured from it, so the caller must send the batch right away.
func (b *Batch) SentAt() time.Time { return b.sentAt }

// UseSync reports that a batch from PrepareAcquire must go out as a Sync
// with one report rather than an Acquire: it resends a report that returns
// tokens, and Acquire does not carry returned tokens.
func (b *Batch) UseSync() bool { return b.useSync }

// Keys lists the batch's keys in report order.
func (b *Batch) Keys() []quota.Key {
	out := make([]quota.Key, len(b.entries))
	for i, e := range b.entries {
		out[i] = e.key()
	}
	return out
}

// Split returns one single-report batch per key, sent at now, to isolate a
// report the region refuses. The original batch must not be used after.
func (b *Batch) Split(now time.Time) []*Batch {
	out := make([]*Batch, len(b.entries))
	for i := range b.entries {
		out[i] = &Batch{Reports: b.Reports[i : i+1], entries: b.entries[i : i+1], sentAt: now}
	}
	return out
}

// chunks cuts b into batches of at most n reports, in order, sharing b's
// send time (a region refuses a call carrying more reports than its
// bound). The original batch must not be used after.
func (b *Batch) chunks(n int) []*Batch {
	if len(b.Reports) <= n {
		return []*Batch{b}
	}
	out := make([]*Batch, 0, (len(b.Reports)+n-1)/n)
	for i := 0; i < len(b.Reports); i += n {
		j := min(i+n, len(b.Reports))
		out = append(out, &Batch{Reports: b.Reports[i:j:j], entries: b.entries[i:j:j], sentAt: b.sentAt, useSync: b.useSync})
	}
	return out
}

func wireKey(k quota.Key) *sluicev1.QuotaKey {
	return &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}
}

// newReportLocked builds the key's next report: the lease's cumulative
// totals (used, denied, and returned including, when withReturn, every
// token waiting to go back). The region books what they add to the totals
// it applied last, so a report that supersedes one that never arrived
// carries its usage too. The report becomes the pending one, resent
// unchanged until acknowledged. It says when it was built (now, on the
// table's clock: builtUS), so the region measures the instance's demand
// over the time its totals were read at, not over their arrival times.
func (t *Table) newReportLocked(now time.Time, e *entry, want, minBatch int64, withReturn bool) *sluicev1.KeyReport {
	want = min(max(want, 0), quota.MaxWant)
	seq := t.seq.Add(1)
	if e.lease == 0 {
		e.lease = seq
	}
	if withReturn {
		e.returned += e.toReturn
		e.toReturn = 0
	}
	used, denied, returned := e.totalsLocked()
	t.mirrorWindowLocked(now, e, used+denied, e.lease == seq)
	r := &sluicev1.KeyReport{
		Key:      wireKey(e.key()),
		Seq:      seq,
		Lease:    e.lease,
		Used:     used,
		Denied:   denied,
		Returned: returned,
		Want:     want,
		Min:      min(max(minBatch, 0), want),
		BuiltUs:  t.builtUS(now),
	}
	e.pending = r
	return r
}

// totalsLocked is the current lease's used, denied and returned totals.
func (e *entry) totalsLocked() (used, denied, returned int64) {
	denied = e.deniedTokens()
	if r := e.rare.Load(); r != nil {
		denied -= r.baseDenied
	}
	return e.spentLocked() - e.baseSpent, denied, e.returned
}

// newLeaseLocked forgets the key's lease: the pool is emptied and its
// tokens abandoned (neither spent nor returned: the region's record of the
// old lease keeps them), and the next report starts a new lease from zero
// totals.
func (e *entry) newLeaseLocked() {
	e.drainLocked(maxPool)
	e.toReturn = 0
	e.pending = nil
	e.set(grantedFlag, false)
	e.lease = 0
	e.set(rebaseFlag, false)
	e.own().hasLease, e.own().checkClock = false, false
	e.own().negUntil = never
	e.baseSpent, e.returned = e.spentLocked(), 0
	if r := e.rare.Load(); r != nil {
		r.baseDenied = r.denied.Load()
	}
	e.publishLocked()
}

func (e *entry) beginLocked() { e.set(inflightFlag, true) }

// doneLocked is the channel closed when the report in flight ends, made
// for the first who waits for it.
func (e *entry) doneLocked() <-chan struct{} {
	r := e.rareFor()
	if r.done == nil {
		r.done = make(chan struct{})
	}
	return r.done
}

func (e *entry) finishLocked() {
	if !e.has(inflightFlag) {
		return
	}
	e.set(inflightFlag, false)
	if r := e.rare.Load(); r != nil && r.done != nil {
		close(r.done)
		r.done = nil
	}
}

// syncReportLocked is the key's report for a Sync at now: the pending one
// unchanged, else a new one that tops the pool up to target or gives back
// the excess.
func (t *Table) syncReportLocked(now time.Time, e *entry) *sluicev1.KeyReport {
	if e.pending != nil {
		return e.pending
	}
	if e.view().mode == ModeStrict {
		// No lease: the report only keeps what the region says about the
		// key (mode, tier, limit) current.
		return t.newReportLocked(now, e, 0, 0, true)
	}
	t.expireLocked(now, e)
	if e.view().giveBack {
		e.own().giveBack = false
		e.publishLocked()
	}
	rate, drain := t.ratesLocked(now, e)
	target := t.targetFor(e.view(), rate, drain)
	have := e.tokens()
	var want int64
	switch {
	case have > 2*target || have > t.batchCap(e.view(), drain):
		e.toReturn += e.drainLocked(have - target)
	case have < target && (e.view().negNever || t.instant(now) >= e.view().negUntil):
		// While the region's named wait runs, the key's refill asks at its
		// end: asked again now, the region answers a wait from now, which
		// the round trip and rounding up to a millisecond put later than
		// the one the instance's callers were told, and a caller retrying
		// at what it was told would be denied by the instance's own wait.
		want = target - have
	}
	return t.newReportLocked(now, e, want, 1, true)
}

// idleLocked reports whether the key saw no demand for IdleTimeout.
func (t *Table) idleLocked(now time.Time, e *entry) bool {
	if a := e.demandLocked(); a != e.activityMark {
		e.activityMark, e.lastActive = a, t.at(now)
		return false
	}
	return t.at(now)-e.lastActive >= t.opts.IdleTimeout
}

// PrepareSync builds the periodic Sync at now: one report for every key not
// already in flight (strict keys too, with want 0, so a change of mode is
// learned), split into batches of MaxReportsPerSync. Keys idle for
// IdleTimeout are forgotten instead: their tokens are taken out and their
// final reports gathered in release (nil when none), to send with Release.
// The table thus holds the keys with demand in the last IdleTimeout, plus
// the leased keys whose last report the region has not acknowledged.
func (t *Table) PrepareSync(now time.Time) (syncs []*Batch, release *Batch) {
	var cur *Batch
	forgot := false
	for _, e := range t.keys.entries() {
		e.mu.Lock()
		if e.has(removedFlag) || e.has(inflightFlag) {
			e.mu.Unlock()
			continue
		}
		// A key whose report the region never acknowledged is kept until
		// it is, unless the region holds no lease for it: then that report
		// only counts demand, and a region unreachable for long must not
		// make every key seen meanwhile stay in memory.
		// A key whose class became strict while it held a lease is
		// forgotten too, once its reports are acknowledged: its lease ends
		// exactly.
		strictLease := e.pending == nil && e.has(grantedFlag) && e.view().mode == ModeStrict
		if ((e.pending == nil || !e.has(grantedFlag)) && t.idleLocked(now, e)) || strictLease {
			if r := t.finalReportLocked(now, e); r != nil {
				if release == nil {
					release = &Batch{sentAt: now}
				}
				release.Reports = append(release.Reports, r)
				release.entries = append(release.entries, e)
			}
			t.removeLocked(e)
			forgot = true
			e.mu.Unlock()
			continue
		}
		r := t.syncReportLocked(now, e)
		e.beginLocked()
		e.mu.Unlock()
		if cur == nil || len(cur.Reports) == t.opts.MaxReportsPerSync {
			cur = &Batch{sentAt: now}
			syncs = append(syncs, cur)
		}
		cur.Reports = append(cur.Reports, r)
		cur.entries = append(cur.entries, e)
	}
	if forgot {
		t.keys.publish()
	}
	t.foldAll()
	return syncs, release
}

// PrepareRefill builds an early Sync at now for the keys whose pool is at
// or below its low-water mark (nil when none): leased keys not in flight
// and not told to wait by the region; and for the keys whose pool a grant
// found above the batch cap of more live instances than before (giveBack):
// their report gives the excess back now, so a peer that found the
// region's bucket empty, because this instance took the burst while it
// was alone on the key, waits one round trip after this instance learns of
// it, not a further refresh. It clears capHeldDue: a key that crosses a
// cap-held mark after its entry was looked at here sets it again.
func (t *Table) PrepareRefill(now time.Time) *Batch {
	t.capHeldDue.Store(false)
	var b *Batch
	for _, e := range t.keys.entries() {
		in := e.info.Load()
		if in.mode != ModeLease || !in.hasLease {
			continue
		}
		if !in.giveBack && (e.tokens() > int64(in.lowWater) || t.instant(now) < in.negUntil) {
			continue
		}
		e.mu.Lock()
		if e.has(removedFlag) || e.has(inflightFlag) || !e.view().hasLease {
			e.mu.Unlock()
			continue
		}
		if e.view().giveBack {
			// A pool above the batch cap of the key's live instances:
			// the report gives the excess back (syncReportLocked).
		} else if e.tokens() > int64(e.view().lowWater) {
			e.mu.Unlock()
			continue
		} else if e.tokens() > int64(e.view().usualWater) && !t.drainsRegion(e.view(), t.windowRateLocked(now, e)) {
			// An early report for a region held at its cap, but the
			// demand since the batch came says this instance does not
			// drain the region: its refill is not what requests wait for.
			e.own().lowWater = e.view().usualWater
			e.publishLocked()
			e.mu.Unlock()
			continue
		}
		b = t.addEarlyLocked(now, b, e)
		e.mu.Unlock()
		if len(b.Reports) == t.opts.MaxReportsPerSync {
			break
		}
	}
	return b
}

// addEarlyLocked adds the key's Sync report at now to the early batch b
// (made when nil) and marks the key in flight.
func (t *Table) addEarlyLocked(now time.Time, b *Batch, e *entry) *Batch {
	r := t.syncReportLocked(now, e)
	e.beginLocked()
	if b == nil {
		b = &Batch{sentAt: now}
	}
	b.Reports = append(b.Reports, r)
	b.entries = append(b.entries, e)
	return b
}

// PrepareFalls builds an early Sync at now for the leased keys whose
// demand since their last report fell plainly below the rate that report
// measured (fellLocked); nil when none. The owner runs it every
// FallCheckEvery; it locks each leased key, as PrepareSync does.
//
// Why: the region reads an instance's demand only from its reports
// (docs/architecture.md, "How fast capacity moves"), and the global tier
// moves a donor's capacity only once the donor's region reads the fall.
// An instance whose demand fell seldom reaches its low-water mark, so
// without this its fall waited for the periodic Sync, up to a refresh,
// while the region kept refilling at a rate nobody spent and the region
// the demand moved to was held at its share.
func (t *Table) PrepareFalls(now time.Time) *Batch {
	var b *Batch
	for _, e := range t.keys.entries() {
		if in := e.info.Load(); in.mode != ModeLease || !in.hasLease || e.has(inflightFlag) {
			continue
		}
		e.mu.Lock()
		if e.has(removedFlag) || e.has(inflightFlag) || !e.view().hasLease || !t.fellLocked(now, e) {
			e.mu.Unlock()
			continue
		}
		b = t.addEarlyLocked(now, b, e)
		e.mu.Unlock()
		if len(b.Reports) == t.opts.MaxReportsPerSync {
			break
		}
	}
	return b
}

// mirrorWindowLocked follows, at a report built at now carrying the
// lease's used + denied total demand, the region's demand window for the
// lease (lib.lua apply_usage): the lease's first report opens it; a later
// one closes it when it is at least the region's demand window long (half
// a refresh) or, from a tenth of a refresh on, when its count is a plain
// change from the rate the region read last (quota.DemandMoved), and the
// region then reads the window's rate. Both sides measure on the
// instance's clock (the report's build time), so the mirror follows every
// report the region books. It can drift for a window or two: a report that
// never arrives leaves it a window ahead, and a lease that supersedes its
// instance's leftover record starts at the region from that record's rate
// (lease_carry), which the instance does not know, so its first window
// may close at another report there. A drift only moves when a fall is
// reported early; the periodic Sync reports it regardless.
func (t *Table) mirrorWindowLocked(now time.Time, e *entry, demand int64, first bool) {
	at := t.at(now)
	if first {
		e.winAt, e.winDemand, e.regionRead = at, demand, 0
		return
	}
	span, got := at-e.winAt, float64(demand-e.winDemand)
	if span <= 0 {
		return
	}
	if span >= t.opts.Refresh/2 || t.closesEarly(span, got, e.regionRead) {
		e.winAt, e.winDemand, e.regionRead = at, demand, got/span.Seconds()
	}
}

// closesEarly is the scripts' early close of a demand window (lib.lua
// apply_usage): from a tenth of a refresh on, a window of span counting
// got tokens closes when they are a plain change from the rate read last
// (quota.DemandMoved).
func (t *Table) closesEarly(span time.Duration, got, read float64) bool {
	return span >= t.opts.Refresh/10 && quota.DemandMoved(got, read*span.Seconds())
}

// fellLocked reports whether a report now would close the region's demand
// window for the lease (mirrorWindowLocked) on a plain fall below the rate
// the region read last: from a tenth of a refresh on, the window's count
// is a plain change from that rate (quota.DemandMoved) and below it by
// more than a tenth of the region's rate for the key, a fall that moves
// capacity at the global tier (the region leader's own test of a fall has
// the same margin). The rate the region read is what the global tier
// divides the key by, so a window that closed on a mix of the old demand
// and the new (a shift inside it) is followed by a report as soon as the
// next shows the new demand alone, not at the next Sync. A key with a
// report pending is already being reported; a lease with no report yet
// has no window.
func (t *Table) fellLocked(now time.Time, e *entry) bool {
	if e.pending != nil || e.lease == 0 {
		return false
	}
	span := t.at(now) - e.winAt
	used, denied, _ := e.totalsLocked()
	got := float64(used + denied - e.winDemand)
	return e.regionRead*span.Seconds()-got > e.view().regionRate*span.Seconds()/10 && t.closesEarly(span, got, e.regionRead)
}

// PrepareAcquire builds the synchronous acquire for a request of cost
// tokens on key at now. Exactly one of the results is set, or none:
//   - b: send it (Acquire, or Sync when b.UseSync), then Apply or Failed;
//   - wait: a report for the key is already in flight; wait for the
//     channel to close (or give up), then call Allow again;
//   - neither: the key changed meanwhile (tokens arrived, or it was
//     forgotten); call Allow again.
func (t *Table) PrepareAcquire(now time.Time, key quota.Key, cost int64) (b *Batch, wait <-chan struct{}) {
	e := t.keys.lookupFresh(key)
	if e == nil {
		return nil, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.has(removedFlag) || t.closed.Load() {
		return nil, nil
	}
	if e.has(inflightFlag) {
		return nil, e.doneLocked()
	}
	t.expireLocked(now, e)
	r := e.pending
	if r == nil {
		have := e.tokens()
		if e.view().hasLease && have >= cost {
			return nil, nil
		}
		need := cost - have
		rate, drain := t.ratesLocked(now, e)
		target := t.targetFor(e.view(), rate, drain)
		// Acquire carries no returned tokens: they wait for the next Sync.
		r = t.newReportLocked(now, e, max(target-have, need), need, false)
	}
	e.beginLocked()
	return &Batch{Reports: []*sluicev1.KeyReport{r}, entries: []*entry{e}, sentAt: now, useSync: r.Returned > 0}, nil
}

// PreparePending builds a Sync that resends every unacknowledged report
// not in flight (nil when none); used before a graceful Release.
func (t *Table) PreparePending(now time.Time) *Batch {
	var b *Batch
	for _, e := range t.keys.entries() {
		e.mu.Lock()
		if e.pending != nil && !e.has(inflightFlag) && !e.has(removedFlag) {
			if b == nil {
				b = &Batch{sentAt: now}
			}
			b.Reports = append(b.Reports, e.pending)
			b.entries = append(b.entries, e)
			e.beginLocked()
		}
		e.mu.Unlock()
	}
	return b
}

// InFlight returns the channels of the reports in flight, each closed when
// its report ends; used to wait for them before a graceful Release.
func (t *Table) InFlight() []<-chan struct{} {
	var out []<-chan struct{}
	for _, e := range t.keys.entries() {
		e.mu.Lock()
		if e.has(inflightFlag) {
			out = append(out, e.doneLocked())
		}
		e.mu.Unlock()
	}
	return out
}

// Drain closes the table for spending: every pool is emptied into the
// tokens to return, and grants applied later are returned, not credited.
// Allow on a key still answers (from the policy paths) until PrepareRelease.
func (t *Table) Drain() {
	t.closed.Store(true)
	for _, e := range t.keys.entries() {
		e.mu.Lock()
		e.toReturn += e.drainLocked(maxPool)
		e.mu.Unlock()
	}
}

// PrepareRelease drains the table (see Drain), forgets every key not in
// flight and returns their final reports for Release (nil when there is
// nothing to tell the region): usage since the last report, every unspent
// token returned, want 0.
func (t *Table) PrepareRelease(now time.Time) *Batch {
	t.Drain()
	var b *Batch
	for _, e := range t.keys.entries() {
		e.mu.Lock()
		if e.has(inflightFlag) {
			e.mu.Unlock()
			continue
		}
		if r := t.finalReportLocked(now, e); r != nil {
			if b == nil {
				b = &Batch{sentAt: now}
			}
			b.Reports = append(b.Reports, r)
			b.entries = append(b.entries, e)
		}
		t.removeLocked(e)
		e.mu.Unlock()
	}
	t.keys.publish()
	return b
}

// finalReportLocked empties the pool and returns the report that closes
// the key's lease, or nil when the region holds no lease record for it
// (never granted). Whatever the class's mode now: a lease issued before a
// change to strict ends exactly too. A pending report need not be resent:
// the final report's totals include its usage.
func (t *Table) finalReportLocked(now time.Time, e *entry) *sluicev1.KeyReport {
	e.toReturn += e.drainLocked(maxPool)
	if !e.has(grantedFlag) {
		return nil
	}
	return t.newReportLocked(now, e, 0, 0, true)
}

// PrepareRebase starts a new lease on every key, for an instance that
// takes a new identity (its reports conflicted with another process's
// under the same id). It returns the final reports of the leases the
// region holds, to send with Release under the old identity (nil when
// none); keys with a report in flight start their new lease when it ends.
func (t *Table) PrepareRebase(now time.Time) *Batch {
	var b *Batch
	for _, e := range t.keys.entries() {
		e.mu.Lock()
		switch {
		case e.has(removedFlag):
		case e.has(inflightFlag):
			e.set(rebaseFlag, true)
		default:
			if r := t.finalReportLocked(now, e); r != nil {
				if b == nil {
					b = &Batch{sentAt: now}
				}
				b.Reports = append(b.Reports, r)
				b.entries = append(b.entries, e)
			}
			e.newLeaseLocked()
		}
		e.mu.Unlock()
	}
	return b
}

// Apply acknowledges a batch with the region's grants (one per report, in
// order) received at now: the pending reports are cleared, new tokens
// credited, and the lease deadline moved to SentAt + ttl. A grant that does
// not match its report is not applied: that key's report stays pending and
// is resent; the error lists such keys.
func (t *Table) Apply(now time.Time, b *Batch, grants []*sluicev1.Grant) error {
	t.Answered() // grants or not, the region answered
	if len(grants) != len(b.Reports) {
		t.Failed(now, b)
		return fmt.Errorf("lease: region answered %d reports with %d grants", len(b.Reports), len(grants))
	}
	t.observeRTT(now.Sub(b.sentAt))
	var errs []error
	for i, e := range b.entries {
		if err := matchGrant(b.Reports[i], grants[i]); err != nil {
			e.mu.Lock()
			e.finishLocked()
			e.mu.Unlock()
			errs = append(errs, fmt.Errorf("lease: key %s: %w", e.key(), err))
			continue
		}
		if grants[i].RedisFailed {
			// The region's Redis Cluster node of this key failed its
			// call; the other keys were answered. The report stays
			// pending, as for a failed Sync, and the key is held off.
			e.mu.Lock()
			t.failedLocked(e)
			t.holdOffLocked(now, e)
			e.mu.Unlock()
			continue
		}
		t.applyGrant(now, b.sentAt, e, b.Reports[i], grants[i])
	}
	return errors.Join(errs...)
}

// HoldOff holds off the keys of b (holdOffLocked): the region answered
// that their Redis Cluster node failed the call.
func (t *Table) HoldOff(now time.Time, b *Batch) {
	for _, e := range b.entries {
		e.mu.Lock()
		t.holdOffLocked(now, e)
		e.mu.Unlock()
	}
}

// HoldOffKey holds off key (holdOffLocked) when the table has it.
func (t *Table) HoldOffKey(now time.Time, key quota.Key) {
	if e := t.keys.lookupFresh(key); e != nil {
		e.mu.Lock()
		t.holdOffLocked(now, e)
		e.mu.Unlock()
	}
}

// holdOffLocked marks e's key held off until keyHoldOff after now: its
// requests are decided by its on_failure policy without a call to the
// region (HeldOff), as they would be for a whole region behind an open
// breaker, while the region serves the keys of its other Redis nodes.
// The key's pending report still goes out with the periodic Syncs, whose
// answer for it ends the hold (clearDegradedLocked). The caller holds
// e.mu.
func (t *Table) holdOffLocked(now time.Time, e *entry) {
	e.rareFor().heldOff = t.instant(now.Add(t.keyHoldOff))
}

// HeldOff reports whether key's requests are decided by its on_failure
// policy without a call at now (holdOffLocked).
func (t *Table) HeldOff(now time.Time, key quota.Key) bool {
	e := t.keys.lookupFresh(key)
	if e == nil {
		return false
	}
	r := e.rare.Load()
	if r == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return t.instant(now) < r.heldOff
}

func matchGrant(r *sluicev1.KeyReport, g *sluicev1.Grant) error {
	switch {
	case g == nil:
		return errors.New("missing grant")
	case g.Key.GetTenant() != r.Key.GetTenant() || g.Key.GetClass() != r.Key.GetClass():
		return fmt.Errorf("grant for %s/%s answers report for %s/%s", g.Key.GetTenant(), g.Key.GetClass(), r.Key.GetTenant(), r.Key.GetClass())
	case g.Seq != 0 && g.Seq != r.Seq:
		return fmt.Errorf("grant seq %d answers report seq %d", g.Seq, r.Seq)
	case g.Granted < 0 || g.Granted > r.Want:
		return fmt.Errorf("granted %d outside 0..want %d", g.Granted, r.Want)
	}
	return nil
}

func (t *Table) applyGrant(now, sentAt time.Time, e *entry, r *sluicev1.KeyReport, g *sluicev1.Grant) {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.finishLocked()
	if e.pending == r {
		e.pending = nil
	}
	wasLive, wasRate, wasBurst := e.view().live, e.view().regionRate, e.view().regionBurst
	t.learnLocked(now, e, g)
	if e.has(rebaseFlag) {
		e.newLeaseLocked()
		return
	}
	if e.view().mode == ModeLease {
		// A strict class opens no lease: only one issued before the class
		// changed is booked (and grantedFlag already says so).
		e.set(grantedFlag, true)
	}
	t.expireLocked(now, e)
	t.clearDegradedLocked(e)

	dead := e.has(removedFlag) || t.closed.Load() || e.view().mode == ModeStrict
	if e.view().mode == ModeStrict {
		e.toReturn += e.drainLocked(maxPool)
		e.own().hasLease, e.own().checkClock = false, false
	} else if g.TtlMs > 0 {
		ttl := time.Duration(g.TtlMs) * time.Millisecond
		if d := t.instant(sentAt.Add(ttl)); d > t.instant(now) {
			if !e.view().hasLease || d > e.view().deadline {
				e.own().deadline = d
			}
			e.own().hasLease = true
			e.guard = ttl / 2
		}
	}
	switch {
	case g.Granted > 0:
		e.own().negUntil, e.own().negNeed, e.own().negNever = never, 0, false
	case r.Want > 0 && g.RetryAfterMs != 0:
		// The answer is about min tokens (at least 1: a report with
		// want > 0 and min 0 is answered as for one token).
		wait := time.Duration(g.RetryAfterMs) * time.Millisecond
		e.own().negNeed = int32(min(max(r.Min, 1), quota.MaxWant))
		e.own().negNever = g.RetryAfterMs < 0
		if e.view().negNever {
			// Never (min exceeds what the region's bucket can hold at its
			// current cap, or its rate is zero): requests needing min are
			// denied until the next refresh, when the key asks again in
			// case the cap or rate grew or leases came back; with
			// RetryNever only for a cost above the configured burst, or
			// above an unleased region's cap (keyInfo.waitCures).
			wait = t.opts.Refresh
			need := float64(e.view().negNeed)
			zeroed := wasRate >= zeroRate && !(e.view().regionRate >= zeroRate)
			capped := wasBurst >= need && !(e.view().regionBurst >= need)
			if (zeroed || capped) && !t.unleased.Load() {
				// The region's rate just fell to zero, or its cap below
				// what the request needs: a grant moved its share to
				// other regions, most often before the global tier heard
				// this region's demand for the key (a key a region does
				// not report counts as no demand there), or gave its rate
				// back before its cap (the cap waits until the donors'
				// instances hold no more than their new caps). The region
				// reports the key from this grant on, and its share comes
				// back within a few of the global tier's answers, well
				// inside a refresh: the key asks again after
				// neverAfterZeroed of it. A rate or cap that stays short
				// is asked about once a refresh, as before.
				wait = t.opts.Refresh / neverAfterZeroed
			}
		} else {
			wait += retrySpread(t.spreadDraw(now, e), e.view(), wait)
		}
		e.own().negUntil = t.instant(now.Add(wait))
	}
	target := t.targetFor(e.view(), e.sizingRate, e.drainRate)
	e.own().lowWater = clampWater(t.lowWaterFor(e.sizingRate, target))
	e.own().usualWater = e.view().lowWater
	if g.Granted > 0 && !dead && e.view().hasLease {
		e.own().lowWater = max(e.view().lowWater, clampWater(t.capHeldWater(e.view(), e.tokens()+g.Granted, g.Remaining)))
	}
	e.own().checkClock = e.view().hasLease && time.Duration(e.view().deadline-t.ownerHorizon(now)) < e.guard
	if pool := e.tokens() + max(g.Granted, 0); !dead && e.view().hasLease && e.view().live > wasLive && pool > t.batchCap(e.view(), e.drainRate) {
		// More instances share the key than when this pool was sized:
		// give the excess back now (PrepareRefill), not a refresh later.
		e.own().giveBack = true
		t.giveBackDue.Store(true)
	}
	// Publish the deadline before the tokens it covers.
	e.publishLocked()
	if g.Granted > 0 {
		if dead || !e.view().hasLease {
			e.toReturn += g.Granted
		} else {
			e.toReturn += e.creditLocked(g.Granted)
		}
	}
}

// learnLocked copies what the region says about the key.
func (t *Table) learnLocked(now time.Time, e *entry, g *sluicev1.Grant) {
	if m, err := ParseMode(g.Mode); err == nil {
		e.own().mode = m
	}
	if p, err := ParsePolicy(g.OnFailure); err == nil {
		e.own().onFailure = p
	}
	e.own().shadow = g.Shadow
	if g.Tier != "" {
		e.own().setTier(g.Tier)
	}
	t.unleased.Store(g.Unleased)
	if g.Limit > 0 {
		e.own().limit = g.Limit
	}
	if g.RegionRate >= 0 && g.RegionBurst >= 0 {
		e.own().regionRate, e.own().regionBurst = g.RegionRate, g.RegionBurst
	}
	if g.LiveInstances > 0 {
		e.own().live = int32(min(g.LiveInstances, math.MaxInt32))
	}
	e.own().resetAt = now.Add(time.Duration(max(0, g.ResetMs)) * time.Millisecond)
	e.own().regionLeft = max(0, g.Remaining)
	e.own().cap = wholeCap(e.view().regionBurst, e.view().limit)
	e.own().capKnown = e.view().limit > 0 && (e.view().capKnown || (g.RegionRate >= 0 && g.RegionBurst >= 0))
}

// Failed ends a batch that got no answer: the reports stay pending and are
// resent unchanged by the next Prepare.
func (t *Table) Failed(now time.Time, b *Batch) {
	for _, e := range b.entries {
		e.mu.Lock()
		t.failedLocked(e)
		e.mu.Unlock()
	}
}

// failedLocked ends e's part of a batch the region did not apply (Failed).
// The caller holds e.mu.
func (t *Table) failedLocked(e *entry) {
	e.finishLocked()
	if e.has(rebaseFlag) {
		e.newLeaseLocked()
	}
}

// Reject ends a batch the region refused as invalid: its reports are
// dropped (resending them would be refused again; their usage goes
// unreported, which only under-counts) and its keys are forgotten, so bad
// input leaves nothing behind. Tokens still in their pools are abandoned to
// the region's expiry of the lease.
func (t *Table) Reject(now time.Time, b *Batch) {
	for i, e := range b.entries {
		e.mu.Lock()
		if e.pending == b.Reports[i] {
			e.pending = nil
		}
		e.finishLocked()
		e.drainLocked(maxPool)
		t.removeLocked(e)
		e.mu.Unlock()
	}
	t.keys.publish()
}

// Forget drops key unless a report for it is in flight or the region holds
// a lease record for it; used when the region refuses a request on a key
// that never got a lease, so bad input leaves nothing behind.
func (t *Table) Forget(key quota.Key) {
	e := t.keys.lookupFresh(key)
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.has(inflightFlag) || e.has(grantedFlag) || e.tokens() != 0 {
		return
	}
	t.removeLocked(e)
}

// expireLocked ends the key's lease when its deadline has passed at now:
// the pool is emptied (those tokens go back in the next report; the region
// caps what it takes back at what the lease still shows unspent).
func (t *Table) expireLocked(now time.Time, e *entry) {
	if !e.view().hasLease || t.instant(now) < e.view().deadline {
		return
	}
	e.toReturn += e.drainLocked(maxPool)
	e.own().hasLease, e.own().checkClock = false, false
	e.publishLocked()
}

// Expire enforces lease deadlines at now and returns when it must run next
// (zero when no key holds a lease). Pools whose deadline passed are
// emptied; keys within their guard time of the deadline get checkClock, so
// the lock-free hot path stops serving them and every decision goes
// through Allow. An owner whose wake-up is late by more than the guard
// (half the TTL) leaves the deadline to the hot path's own clock reading
// (allowFast).
func (t *Table) Expire(now time.Time) time.Time { return t.ExpireFor(now, 0) }

// ExpireFor is Expire for an owner about to be busy for up to busy (a
// blocking RPC) before it can call Expire again: every key whose guard
// time falls before now + busy gets checkClock at once, and grants applied
// meanwhile set it against that horizon too. So however the RPC timeout
// compares with the lease TTL, the lock-free hot path never serves a key
// past its deadline while the owner is blocked.
func (t *Table) ExpireFor(now time.Time, busy time.Duration) time.Time {
	horizon := t.instant(now.Add(max(busy, 0)))
	t.ownerDue.Store(int64(horizon))
	next := never
	earliest := func(at instant) {
		if next == never || at < next {
			next = at
		}
	}
	for _, e := range t.keys.entries() {
		e.mu.Lock()
		t.expireLocked(now, e)
		if e.view().hasLease {
			if !e.view().checkClock {
				if w := e.view().deadline - instant(e.guard); horizon < w {
					earliest(w)
				} else {
					e.own().checkClock = true
					e.publishLocked()
				}
			}
			if e.view().checkClock {
				earliest(e.view().deadline)
			}
		}
		e.mu.Unlock()
	}
	return t.timeOf(next)
}

// spreadDraw is the number retrySpread draws from for key e's answer
// applied at now: the instance's seq base (its start, in microseconds:
// different for every instance), the key and the instant, so that peers
// draw apart, and runs of the simulator, whose instants and seq bases
// follow its seed, repeat. (A report's seq would not: a table numbers
// reports in the order its callers happen to ask.)
func (t *Table) spreadDraw(now time.Time, e *entry) uint64 {
	h := uint64(14695981039346656037) // FNV-1a of tenant and class, each ended by a 0 byte
	for _, s := range [2]string{e.tenant, e.class.Value()} {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * 1099511628211
		}
		h *= 1099511628211
	}
	return h ^ t.opts.SeqBase ^ uint64(t.instant(now))
}

// neverAfterZeroed divides the refresh into the wait of a key whose
// region's rate a grant just zeroed: short enough that a share coming
// back within an epoch is taken up within a quarter of it, long enough
// that a region held at zero (a floor of 0, a drain) sees at most one
// more ask per key than at the refresh.
const neverAfterZeroed = 4

// zeroRate: a region rate below it is zero, as the scripts' wait_ms
// reads it. A grant of nothing carries a rate of a few times the
// smallest float64 (pkg/hierarchy fence.distinct), not 0.
const zeroRate = 1e-9

// retrySpread is what an instance adds to the region's wait before it asks
// again for a key the region could not serve: a pseudo-random part of one
// refill of the tokens it needs, drawn from draw (spreadDraw). Peers denied together are told the same instant,
// the one when the bucket next holds their need; asking at it, one of them
// wins every round, and which one depends on phases that repeat: of two
// instances with equal demand on a contended key one admitted 20-38% of
// its tokens, and behind two agents one admitted 8%. Spread over
// one refill step, the round's winner is drawn anew each time.
//
// A lone instance (the region's last answer counted one live lease) races
// no one and asks at the region's instant.
//
// Nothing is lost while the bucket has room: it keeps refilling during the
// spread, and whoever asks first collects what it holds. So the spread is
// at most the time the bucket takes to go from the need to its cap (none
// for a key whose burst is its need: a bucket of one token left full would
// waste refill), and at most the wait itself.
func retrySpread(draw uint64, in *keyInfo, wait time.Duration) time.Duration {
	need := float64(max(in.negNeed, 1))
	if in.live < 2 || !(in.regionRate > 0) || !(in.regionBurst > need) {
		return 0
	}
	step := time.Duration(need / in.regionRate * float64(time.Second))
	room := time.Duration((in.regionBurst - need) / in.regionRate * float64(time.Second))
	d := min(step, room, wait)
	if d <= 0 {
		return 0
	}
	// splitmix64 of draw: close draws give unrelated spreads.
	z := draw + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return time.Duration(z % uint64(d))
}
