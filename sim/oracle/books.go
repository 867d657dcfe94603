package oracle

import (
	"fmt"
	"time"
)

// Bucket is one region's bucket of one key as its Redis holds it right
// after a script call.
type Bucket struct {
	// NowUS is the Redis time the script ran at.
	NowUS int64
	// Tokens in the bucket and Outstanding, the unspent tokens of live
	// leases as the region's books have them.
	Tokens, Outstanding float64
	// Rate and Cap in force at NowUS (the grant while valid, else the
	// static share).
	Rate, Cap float64
	// GrantRate and GrantExpiryUS are the stored grant (0 when none).
	GrantRate     float64
	GrantExpiryUS int64
	// Admitted and Denied are the bucket's cumulative counters.
	Admitted, Denied int64
}

// regionBooks is what the oracle knows of one (key, region).
type regionBooks struct {
	admitted, denied int64 // decided by the instances (shadow in both)
	pending          int64 // decided by the region, not (yet) by an instance
	retiredAdm       int64 // counters of earlier buckets (expired, or lost with their Redis)
	retiredDen       int64
	// overAdm and overDen are the largest excesses of the bucket's
	// counters over the instances' already reported: a count off once
	// stays off at every later call, and is one violation, not one per
	// call.
	overAdm, overDen int64
	last             Bucket
	observed         bool
	// deposit is what a grant's deposit may add at the next call (the
	// burst transfer: tokens other regions' buckets released), on top of
	// refill; that call uses it up.
	deposit float64
}

// Deposited records that the next script call on region's bucket of key
// installs a grant that deposits up to tokens (docs/architecture.md,
// "Burst transfer"): the bucket may grow by that much more than its
// refill, still within its cap. Whether the whole fleet stays within
// b + r·t is the conformance check's to say.
func (o *Oracle) Deposited(region, key int, tokens float64) {
	o.books[key*o.nr+region].deposit += tokens
}

// RegionPending adjusts the tokens region decided for key that no
// instance has recorded: a strict Check counts its decision in the bucket
// when it runs, the instance when the answer arrives. The simulator adds
// them when the script runs and takes them back when the instance records
// the decision; those whose answer was lost stay.
func (o *Oracle) RegionPending(region, key int, tokens int64) {
	o.books[key*o.nr+region].pending += tokens
}

// BucketGone records that region's bucket of key was deleted (its TTL ran
// out, or its Redis came back empty): its counters start again at 0 and
// its next state is a new bucket's.
func (o *Oracle) BucketGone(region, key int) {
	bk := &o.books[key*o.nr+region]
	if !bk.observed {
		return
	}
	bk.retiredAdm += bk.last.Admitted
	bk.retiredDen += bk.last.Denied
	bk.last, bk.observed = Bucket{}, false
}

// BucketObserved checks region's bucket of key right after a script call
// at t:
//   - what the region holds, tokens + outstanding, is within the cap in
//     force, or (when a smaller grant lowered the cap below the leases
//     already out) no more than it held before;
//   - it grew since the previous call by no more than refill at the
//     highest rate in force in between, and the deposit of a grant this
//     call installed (Deposited): tokens never appear from nowhere (a
//     return credited twice, a replayed report applied twice);
//   - exactly-once accounting: the admitted and denied counters of every
//     bucket the region had for the key add up to no more than what the
//     instances decided there (plus decisions whose answer was lost); an
//     excess is reported when it first shows and again only when it grows.
//
// The tolerance is the bucket's storage rounding, 1e-6 token per call.
func (o *Oracle) BucketObserved(t time.Duration, region, key int, b Bucket) {
	o.Advance(t)
	bk := &o.books[key*o.nr+region]
	kd := &o.s.Keys[key]
	name := o.s.Regions[region].Name
	hold := b.Tokens + b.Outstanding
	o.res.Holding.Checks++
	bound := b.Cap
	if bk.observed {
		prev := bk.last.Tokens + bk.last.Outstanding
		bound = max(bound, prev)
		if dt := b.NowUS - bk.last.NowUS; dt >= 0 {
			rate := kd.StaticRate[region]
			if bk.last.GrantExpiryUS > bk.last.NowUS {
				rate = max(rate, bk.last.GrantRate)
			}
			// Both readings are rounded: the growth between them may
			// show up to one rounding more than the refill.
			if grow := prev + rate*float64(dt)/1e6 + bk.deposit; hold > grow+2*holdTol {
				o.res.Holding.note(t, kd.Key, name, hold-grow, fmt.Sprintf(
					"holds %.6f, held %.6f %dµs earlier at rate ≤ %v", hold, prev, dt, rate))
			}
		}
	}
	if hold > bound+holdTol {
		o.res.Holding.note(t, kd.Key, name, hold-bound, fmt.Sprintf(
			"holds %.6f (tokens %.6f + leased %.0f) over cap %v", hold, b.Tokens, b.Outstanding, b.Cap))
	}
	o.res.Books.Checks++
	adm, den := bk.retiredAdm+b.Admitted, bk.retiredDen+b.Denied
	if over := adm - bk.admitted - bk.pending; over > bk.overAdm {
		o.res.Books.note(t, kd.Key, name, float64(over), fmt.Sprintf(
			"bucket counted %d admitted, instances admitted %d (+%d undelivered)", adm, bk.admitted, bk.pending))
		bk.overAdm = over
	}
	if over := den - bk.denied - bk.pending; over > bk.overDen {
		o.res.Books.note(t, kd.Key, name, float64(over), fmt.Sprintf(
			"bucket counted %d denied, instances denied %d (+%d undelivered)", den, bk.denied, bk.pending))
		bk.overDen = over
	}
	bk.last, bk.observed, bk.deposit = b, true, 0
}

// GrantIssued records that region's Redis applied, at t, a grant of key
// issued at issuedUS (the send time of the report it answers, on the
// region's clock), and checks it was issued no earlier than the last one
// it applied there: a delayed older grant must never overwrite a newer
// one.
func (o *Oracle) GrantIssued(t time.Duration, region, key int, issuedUS int64) {
	o.Advance(t)
	ks := &o.keys[key]
	if ks.issued == nil {
		ks.issued = make([]int64, o.nr)
	}
	o.res.GrantOrder.Checks++
	if prev := ks.issued[region]; issuedUS < prev {
		o.res.GrantOrder.note(t, o.s.Keys[key].Key, o.s.Regions[region].Name, 0, fmt.Sprintf(
			"applied a grant issued at %dµs after one issued at %dµs", issuedUS, prev))
		return
	}
	ks.issued[region] = issuedUS
}
