package lease

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// Batch sizing. Units: tokens and tokens per second.
//
// demand     = tokens admitted + denied + asked of the fallback or strict
//              path; its rate is an EWMA over windows of at least
//              minSampleWindow, with time constant 2 × Refresh.
// sizing rate = max(EWMA, rate of the current, still open window), so a
//              sudden rise is seen at once and a fall only gradually.
// target     = ceil(sizing rate × 1.5 × Refresh), clamped to [1, cap].
// cap        = floor(region_burst) for a lone instance whose demand
//              drains the region (drainsRegion: at least the region's
//              rate); floor(burst / 2) for one whose demand does not: its
//              bucket refills faster than it spends, so half the burst
//              stays in the bucket, where a grant that lowers the
//              region's cap clips it and the global tier may move it to
//              a region that spends its own (docs/architecture.md,
//              "Burst transfer"); held in the instance's pool it would
//              only be spent here, in place of refill the full bucket
//              loses. With n live instances, floor(burst / 2n), however
//              fast the region refills; never above floor(region_burst);
//              at least 1.
//              The region's bucket holds at most its cap less the tokens
//              out in leases, and an instance's tokens out are its pool
//              after its last grant until it reports what it spent, so
//              the batches out fill at most half the cap and the bucket
//              keeps room to refill every instance at the same instant.
//              (A cap of max(burst/n, rate × Refresh / n) let a few
//              instances' batches, held or spent and not yet reported,
//              fill the cap: the bucket could not refill and a peer's
//              acquire found nothing, or "never", while the key's demand
//              was well under its rate: 4-25% of the requests of four
//              instances on a key with a cap of 10 were denied.)
//              Needs cap ≥ 2n to hold; below that each instance holds 1.
// low water  = ceil(sizing rate × lead) with lead = max(2 × RTT,
//              Refresh/4), at most target/2: a refill started there
//              arrives before the pool runs dry.
// excess     = a Sync returns tokens above target when the pool holds more
//              than 2 × target, or more than cap (a need granted beyond
//              it, or a batch sized while fewer instances were live or
//              while a lone instance's demand drained the region). A
//              grant that tells of more live instances than the one before
//              while the pool is above the new cap sends that Sync at once
//              (keyInfo.giveBack, PrepareRefill): a peer that found the
//              region's bucket empty waits for it, and the region tells
//              the peer to ask again after about one refresh.

const horizonRefreshes = 1.5

func (t *Table) minSampleWindow() time.Duration {
	return max(t.opts.Refresh/20, 10*time.Millisecond)
}

// ratesLocked measures the key's demand at now and returns the sizing
// rate, and drain, the rate that says whether the instance drains its
// region (batchCap); it keeps both in the entry (sizingRate, drainRate)
// for the answer to the report they size. A window of at least
// minSampleWindow since the last sample closes: its rate r is folded
// into the demand EWMA and starts a new window. The sizing rate is
// max(EWMA, r), so a rise is seen at once and a fall only gradually, and
// batches do not shrink on a quiet window; drain is r when a window
// closed, else the sizing rate. The test of draining thus sees a fall at
// once, so that an instance whose demand just fell below its region's
// rate (after a shift, or a grant that raised the rate) leaves half the
// burst in the bucket at its next batch, not seconds later, when the
// grant that lowers the region's cap would find it in the pool instead.
func (t *Table) ratesLocked(now time.Time, e *entry) (sizing, drain float64) {
	demand := e.demandLocked()
	dt := t.at(now) - e.sampleAt
	window := t.minSampleWindow()
	r := float64(demand-e.sampleDemand) / max(dt, window).Seconds()
	closed := dt >= window
	if closed {
		if e.has(haveRateFlag) {
			alpha := 1 - math.Exp(-dt.Seconds()/(2*t.opts.Refresh.Seconds()))
			e.rate += alpha * (r - e.rate)
		} else {
			e.rate = r
			e.set(haveRateFlag, true)
		}
		e.sampleAt, e.sampleDemand = t.at(now), demand
	}
	sizing = r
	if e.has(haveRateFlag) && e.rate > sizing {
		sizing = e.rate
	}
	drain = sizing
	if closed {
		drain = r
	}
	e.sizingRate, e.drainRate = sizing, drain
	return sizing, drain
}

// windowRateLocked is the demand rate of the current, still open window
// at now (no EWMA, no side effects): what an instance asks right now.
func (t *Table) windowRateLocked(now time.Time, e *entry) float64 {
	return float64(e.demandLocked()-e.sampleDemand) / max(t.at(now)-e.sampleAt, t.minSampleWindow()).Seconds()
}

// batchCap is the largest batch one instance with demand rate should hold
// of a key: with several live instances, burst/2n each, so their batches
// out leave the region's bucket room for half its cap; a lone instance
// whose demand drains the region, the whole burst; one whose demand does
// not, half of it (see the header).
func (t *Table) batchCap(in *keyInfo, rate float64) int64 {
	if !(in.regionBurst > 0) {
		return quota.MaxWant // nothing learned yet: demand alone decides
	}
	burst := max(1, int64(in.regionBurst))
	live := max(1, in.live)
	if live == 1 && t.drainsRegion(in, rate) {
		return burst
	}
	return max(1, min(int64(in.regionBurst/float64(2*live)), burst))
}

// targetFor is the batch an instance with sizing rate rate asks for,
// capped by batchCap at drain, the rate that says whether it drains the
// region (ratesLocked).
func (t *Table) targetFor(in *keyInfo, rate, drain float64) int64 {
	target := ceilTokens(rate * horizonRefreshes * t.opts.Refresh.Seconds())
	return max(1, min(target, t.batchCap(in, drain)))
}

func (t *Table) lowWaterFor(rate float64, target int64) int64 {
	lead := max(2*t.RTT(), t.opts.Refresh/4)
	return min(ceilTokens(rate*lead.Seconds()), target/2)
}

// capHeldSteps is how many reports per region burst an instance sends
// while its unreported spending holds the region's bucket at its cap.
const capHeldSteps = 16

// capHeldWater is the low-water mark for a pool of pool tokens just
// credited by a grant after which the region's bucket held remaining
// tokens (0 when the usual mark applies).
//
// The region refills its bucket only up to its cap less the tokens out in
// leases as last reported (DESIGN invariant 3), so while the bucket and
// this instance's pool together fill the cap, every token the instance
// spends without reporting it is a token of refill the region loses. That
// is the case when a key starts (the bucket starts full and the first
// large batch takes most of it) and whenever one instance holds most of a
// region's burst. When this instance's demand drains the region
// (drainsRegion), it reports once it spent the room the bucket had left
// (at least 1/capHeldSteps of the region's burst) instead of at the usual
// mark, before the bucket can fill it, which hands the region room to
// refill again. The owner loop sends that report after CapHeldSpacing
// from its last early refill, not the usual RefillSpacing, which at the
// default refresh let the bucket sit at its cap for up to 50 ms
// (Core.RefillWait); that spacing bounds how often.
func (t *Table) capHeldWater(in *keyInfo, pool, remaining int64) int64 {
	// The rate a batch was sized with lags a demand that just rose (it
	// was measured while requests waited for the batch), so the mark is
	// set whatever it says, and the early report is sent only if the
	// demand measured when the mark is reached drains the region
	// (PrepareRefill); otherwise the usual mark is back at no RPC.
	if !(in.regionBurst > 0) || remaining < 0 {
		return 0
	}
	// The room the bucket has left to refill into, which it fills in
	// room / region rate; an instance draining the region spends room
	// tokens at least as fast, so it reports by then.
	room := int64(math.Floor(in.regionBurst)) - remaining - pool
	spend := max(1, int64(in.regionBurst/capHeldSteps), room)
	if spend >= pool {
		return 0
	}
	return pool - spend
}

// drainsRegion reports whether an instance with demand rate (tokens/s),
// with the key's other live instances demanding as much, asks at least
// the region's rate. A region rate not learned yet counts as not drained.
func (t *Table) drainsRegion(in *keyInfo, rate float64) bool {
	if !(in.regionRate > 0) {
		return false
	}
	return rate*float64(max(1, in.live)) >= in.regionRate
}

func ceilTokens(x float64) int64 {
	if !(x > 0) {
		return 0
	}
	if x >= quota.MaxWant {
		return quota.MaxWant
	}
	return int64(math.Ceil(x))
}
