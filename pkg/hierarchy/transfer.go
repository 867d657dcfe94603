package hierarchy

// Burst transfer (docs/architecture.md, "Burst transfer").
//
// A region's bucket holds at most its cap. When a grant lowers the cap
// below what the bucket holds, set_rate clips the bucket, and until now
// those tokens were simply gone: a region whose demand stays below its
// rate sits on a full bucket it never spends (at a key's start, every
// region's static slice of the burst), while another region spends its
// bucket empty and waits for refill. The ideal central bucket would have
// admitted those tokens. So the clipped tokens are released: the region
// reports them once (KeyDemand.Released), the allocator holds them in
// flight for the key, and deposits them (Grant.Deposit) in the bucket of a
// region whose demand is above the rate it gets, with a cap
// raised by as much.
//
// Invariant: Σ counted caps + in flight <= the key's burst. The tokens
// in flight are reserved in every region's burst headroom (lanesFor), as
// a cap would be, until a deposit turns them into the recipient's cap or
// they are dropped. Hence at every instant the tokens in all buckets,
// leases and flight are at most b, and since a transfer only moves tokens
// (the donor's clip before the deposit; a deposit is added at most once
// per answer, on top of a cap raised by as much), admissions over any
// window stay within b + r·t.
//
// Exactly once: a report's Released is credited only by the first receipt
// of its seq (a retry is answered from the cache), and not while learning:
// a report retried to a new leader may have been credited by the old one,
// which may have deposited it; learning lasts longer than any report is
// retried. Lost reports and answers lose tokens, never add them.

// inFlight is one key's tokens released by donors and not yet deposited.
type inFlight struct {
	tokens float64
	// at is when tokens were last credited (ns since origin): they are
	// dropped one epoch later, so a reservation nobody takes does not hold
	// the key's caps down; the lanes reserve them until then only.
	at int64
}

// inFlightAt is block b's tokens in flight at t, dropping them when they
// are older than one epoch.
func (a *Allocator) inFlightAt(b int32, t int64) float64 {
	f := &a.transfer[b]
	if f.tokens > 0 && t-f.at > a.epochNS {
		*f = inFlight{}
	}
	return f.tokens
}

// credit adds tokens region ri released of block b's key, as far as they
// are backed and when they are a material part of its burst, when the key
// is contended and some other region's demand is materially above the
// rate it may use now (its bucket drains: it would spend them), and
// nudges those regions to report for their deposit. Otherwise the tokens
// are dropped: reserved, they would only hold the key's caps down. before and
// after are ri's summaries before and after this report's acknowledgement,
// cb its counted static burst, sh the key's shares.
//
// Backed: the tokens are safe to hand on only while no bucket could have
// refilled into the room they left. The region reports them only while it
// still holds the grant whose install clipped them, so its own cap never
// rose over that room (regionsync). The allocator counted ri at its old,
// larger cap until this acknowledgement, so the room stayed reserved,
// unless that cap's grant ended in the allocator's view meanwhile (the
// report came late) and the room went to other regions, or the fence
// still counts ri at a newer grant that hands the room back to it. So the
// tokens count only as far as this acknowledgement lowers what ri is
// counted at, at every instant until they are dropped; and as far as the
// others' caps, ri's and what is already in flight leave room.
func (a *Allocator) credit(t int64, b int32, ri int, released float64, before, after summary, cb float64, sh *shares) {
	if !(released > 0) || !a.blockContended[b] {
		return
	}
	wanted := a.wanted[:0]
	for j := 0; j < a.nr; j++ {
		if j == ri {
			continue
		}
		if pr, _ := a.peakUse(t, a.summaries[int(b)*a.nr+j], sh.cR[j], sh.cB[j]); a.short(b, j, pr) {
			wanted = append(wanted, j)
		}
	}
	a.wanted = wanted
	if len(wanted) == 0 {
		return
	}
	a.lanesFor(t, b, ri, sh)
	bl := &a.burstLane
	end := t + a.epochNS
	use := func(sm *summary, at int64) float64 {
		if at < sm.burstT {
			return sm.burstV
		}
		return cb
	}
	// What is in flight already is reserved by the lane until it would
	// be dropped; credited now, it stays until end with the new tokens.
	held := a.inFlightAt(b, t)
	heldUntil := a.transfer[b].at + a.epochNS + 1
	backed := released
	check := func(at int64) {
		room := bl.headroom(at) - use(&after, at)
		if at >= heldUntil {
			room -= held
		}
		backed = min(backed, use(&before, at)-use(&after, at), room)
	}
	check(t)
	for _, u := range bl.until[:bl.n] {
		if u > t && u <= end {
			check(u)
		}
	}
	for _, u := range []int64{before.burstT, after.burstT, heldUntil} {
		if u > t && u <= end {
			check(u)
		}
	}
	// Only a material part of the burst (the test of raisePending, on the
	// burst) is worth moving: a cap that drifts down by a token each epoch
	// would otherwise move a token each epoch, each move a reservation
	// that holds the others' caps down, a nudge and a report.
	l := &a.limits[a.blockKey[b]]
	if backed < max(1, pendingShortfall*l.Burst) {
		return
	}
	f := &a.transfer[b]
	f.tokens = min(held+backed, l.Burst)
	f.at = t
	for _, j := range wanted {
		a.markNudge(j)
	}
}

// short says whether region ri's demand for block b's key (its estimate)
// is materially above rate (the test of raisePending): refilled at rate,
// its bucket drains, so tokens deposited there are spent. A region only
// marginally above its rate by the estimate's noise may not spend them
// before its next answer takes its cap back down, which releases them
// again: with no margin, such deposits went back and forth between the
// regions of small keys and doubled the reports to the global tier (the
// steady scenario, 6.2 to 12.5 per second).
func (a *Allocator) short(b int32, ri int, rate float64) bool {
	k := a.blockKey[b]
	j := int(k)*a.nr + ri
	d := a.decayed(a.demand[j], a.lastObs[j], a.regions[ri].nReports)
	return a.materiallyShort(d, d-rate, a.limits[k].Rate)
}

// deposit is what block b's tokens in flight give region ri's grant of
// rate and burst, valid until end (sh: the key's shares). The caller adds
// it to the grant's burst.
//
// Only a grant that does not lower ri's cap below the largest it may hold
// until it installs the grant (peak: its summary, or its counted static
// cap) carries one: ri may spend the tokens of its old cap before the
// grant lands, so the deposit in transit must fit above peak, in the cap
// the grant raises (the fence counts ri at burst + deposit from now on). And at most what the
// headroom leaves without the reservation (lanesFor subtracted it); and
// only when ri's demand is materially above rate (it will spend them).
func (a *Allocator) deposit(t int64, b int32, ri int, rate, burst float64, end int64, sh *shares) float64 {
	held := a.inFlightAt(b, t)
	if held <= 0 {
		return 0
	}
	if peak := max(sh.cB[ri], a.summaries[int(b)*a.nr+ri].burstV); burst < peak || !a.short(b, ri, rate) {
		return 0
	}
	// The headroom without the reservation: the lane holds the tokens
	// back only until they would be dropped (lanesFor).
	bl := &a.burstLane
	until := a.transfer[b].at + a.epochNS + 1
	free := bl.minHeadroom(t, min(end, until)) + held
	if end > until {
		free = min(free, bl.minHeadroom(until, end))
	}
	give := min(held, free-burst)
	if !(give > 0) {
		return 0
	}
	a.transfer[b].tokens = held - give
	return give
}
