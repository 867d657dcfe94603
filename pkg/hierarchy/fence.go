package hierarchy

import "math"

// Times inside the fence are int64 nanoseconds since the Allocator's
// origin. negInf stands for "unknown / long ago" and is far enough from
// math.MinInt64 that adding a validity never overflows.
const negInf int64 = math.MinInt64 / 4

// posInf is "never".
const posInf int64 = math.MaxInt64 / 4

// Record flags.
const (
	// recPseudo: a grant this Allocator did not issue that the region
	// reported holding. Its send time is unknown.
	recPseudo uint8 = 1 << iota
	// recMerged: two records merged to make room for a pseudo record; an
	// acknowledgement must not raise its lower expiry bound.
	recMerged
)

// grantRec is what the allocator remembers about one grant it issued to
// one region for one key, while the region may hold it or still receive
// it (a candidate).
type grantRec struct {
	rate, burst float64
	// ue bounds the grant's expiry on the receiver's clock from above: the
	// region measures validity from when it sent its report, which was
	// before the allocator answered at `at`, so its expiry <= at + valid.
	ue int64
	// le bounds the same expiry from below: the send time of the report it
	// answered is at least the answer time of a grant that report
	// acknowledged (the region held it, so it had received it), so
	// le = that time + valid; after an acknowledgement of this grant,
	// at + reported remaining validity.
	le int64
	// at is when the allocator answered with this grant; negInf for pseudo.
	at    int64
	flags uint8
}

// maxRecs bounds the candidates kept per (key, region). In steady state
// two are live (the acknowledged grant and the newest); lost answers add
// more, and a full fence issues no new grant until the oldest expire.
const maxRecs = 3

// fence is the allocator's knowledge of what one region may be using for
// one key, and a summary of it for the other regions' checks.
//
// The region's possible refill rate at a future time t is bounded by
// E(t) = max(A(t), S(t)) where A(t) is the largest rate among candidates
// still unexpired at t (t < ue) and S(t) is the static share once the
// region may have fallen back to it: always when heldKnown is false (it
// may hold nothing), else from P = min le over candidates on. Burst caps
// are the same, plus holdBurst.
//
// The fields every report reads come first and the records after them, in
// age order: in steady state a region holds one grant and gets the next,
// so the records in use (recs[:n], n <= 2) and the fields before them are
// the first 120 of the fence's 168 bytes; the last record is touched only
// while answers are being lost.
type fence struct {
	n uint8
	// heldKnown: the region provably received the oldest candidate, so it
	// holds one of the candidates until at least P.
	heldKnown bool
	// holdBurst is what still counts of older caps (superseded grants, or
	// the static share the region may have run on before) after the region
	// acknowledged a smaller cap while holding more tokens than it: the
	// largest of those caps, bounded by the holding last reported. It
	// counts until holdUntil (the last of their expiries; never for the
	// static share) or until a report shows the holding within the cap.
	holdBurst float64
	holdUntil int64
	recs      [maxRecs]grantRec
}

func (f *fence) fallbackAt() int64 {
	if !f.heldKnown || f.n == 0 {
		return negInf
	}
	p := posInf
	for i := 0; i < int(f.n); i++ {
		p = min(p, f.recs[i].le)
	}
	return p
}

// summary over-approximates a fence for the other regions' checks: the
// region uses at most rateV on [now, rateT) and at most its static share
// from rateT on; the same for burst. It is kept apart from the records so
// one key's summaries share cache lines.
type summary struct {
	rateV, burstV float64
	rateT, burstT int64
}

// summarize computes the summary from the records, given the static
// shares.
func (f *fence) summarize(now int64, static, staticBurst float64) summary {
	var aHi, bHi float64
	aUntil, bUntil := negInf, negInf
	// p is fallbackAt, worked out in the same pass over the records.
	p := posInf
	for i := 0; i < int(f.n); i++ {
		r := &f.recs[i]
		p = min(p, r.le)
		if r.ue <= now {
			continue
		}
		aHi = max(aHi, r.rate)
		bHi = max(bHi, r.burst)
		aUntil = max(aUntil, r.ue)
	}
	if !f.heldKnown || f.n == 0 {
		p = negInf
	}
	bUntil = aUntil
	if f.holdUntil > now {
		bHi = max(bHi, f.holdBurst)
		bUntil = max(bUntil, f.holdUntil)
	}
	var sm summary
	sm.rateV, sm.rateT = laneSummary(aHi, aUntil, p, static)
	sm.burstV, sm.burstT = laneSummary(bHi, bUntil, p, staticBurst)
	return sm
}

// laneSummary turns (highest live value, last expiry, fallback time) into
// the one-step summary "v until T, static after".
func laneSummary(hi float64, until, fallback int64, static float64) (float64, int64) {
	switch {
	case until == negInf:
		return static, negInf
	case hi >= static:
		return hi, until
	default:
		// Below the static share until the region may fall back to it;
		// fallback <= until since every candidate's le <= its ue.
		return hi, min(fallback, until)
	}
}

// full reports whether no further grant can be recorded: the region has
// not acknowledged the last maxRecs-1 grants, so its answers are being
// lost. New grants wait until the oldest expire.
func (f *fence) full() bool { return int(f.n) == maxRecs }

// add appends a record; the caller checked full.
func (f *fence) add(r grantRec) {
	f.recs[f.n] = r
	f.n++
}

// addOldest inserts a record before all others: a grant the region
// reported holding that is not ours. It must be recorded, so when full
// the two oldest records are merged to make room.
func (f *fence) addOldest(r grantRec) {
	if int(f.n) == maxRecs {
		f.mergeOldest()
	}
	copy(f.recs[1:f.n+1], f.recs[:f.n])
	f.recs[0] = r
	f.n++
}

// mergeOldest replaces the two oldest records by one that covers both:
// larger values, later upper and earlier lower expiry, earlier answer.
func (f *fence) mergeOldest() {
	a, b := f.recs[0], f.recs[1]
	f.dropOldest(1)
	f.recs[0] = grantRec{
		rate:  max(a.rate, b.rate),
		burst: max(a.burst, b.burst),
		ue:    max(a.ue, b.ue),
		le:    min(a.le, b.le),
		at:    min(a.at, b.at),
		flags: a.flags | b.flags | recMerged,
	}
}

// dropOldest removes the m oldest records.
func (f *fence) dropOldest(m int) {
	// A loop rather than copy: at most maxRecs records, which a call of
	// the runtime's memmove costs more than moving.
	for i := m; i < int(f.n); i++ {
		f.recs[i-m] = f.recs[i]
	}
	for i := int(f.n) - m; i < int(f.n); i++ {
		f.recs[i] = grantRec{}
	}
	f.n -= uint8(m)
}

// prune drops candidates that surely expired, and the held burst once its
// grants did.
func (f *fence) prune(now int64) {
	for i := 0; i < int(f.n); {
		if f.recs[i].ue <= now {
			// The region may have received it and fallen back since.
			f.heldKnown = false
			copy(f.recs[i:], f.recs[i+1:f.n])
			f.n--
			f.recs[f.n] = grantRec{}
			continue
		}
		i++
	}
	if f.n == 0 {
		f.heldKnown = false
	}
	if f.holdUntil <= now {
		f.holdBurst, f.holdUntil = 0, negInf
	}
}

// heldReport is what a region said about one key's grant in a report.
type heldReport struct {
	rate, burst float64
	valid       int64 // remaining validity (ns) at send time; 0 = holds none
	holding     float64
}

// match returns the index of the oldest candidate whose values equal the
// held grant, or -1. Regions echo the values they received and distinct
// keeps candidates' values apart, so at most one normally matches.
func (f *fence) match(h heldReport) int {
	if h.valid <= 0 {
		return -1
	}
	for i := 0; i < int(f.n); i++ {
		if r := &f.recs[i]; r.rate == h.rate && r.burst == h.burst {
			return i
		}
	}
	return -1
}

// heldSince returns the answer time of the grant the held report
// acknowledges, a lower bound of the report's send time, or negInf.
func (f *fence) heldSince(h heldReport) int64 {
	if m := f.match(h); m >= 0 && f.recs[m].flags&recPseudo == 0 {
		return f.recs[m].at
	}
	return negInf
}

// acknowledge applies a report's held fields. m is the result of match
// (computed before any state changed); staticBurst is the region's static
// burst share; learning says whether a previous leader's grants may still
// be out there.
func (f *fence) acknowledge(now int64, h heldReport, m int, staticBurst float64, learning bool) {
	switch {
	case m >= 0:
		// The region holds recs[m] (or, for a merged record, one of those
		// merged into it): everything older is superseded for good.
		if h.holding > h.burst {
			// Its bucket and leases still hold more than the new cap: the
			// older, larger caps keep counting until they expire, but
			// never for more than the tokens it holds, which cannot grow
			// past its cap.
			hold, until := 0.0, negInf
			if f.holdUntil > now {
				hold, until = f.holdBurst, f.holdUntil
			}
			if !f.heldKnown {
				// It may have been on its static share before this grant,
				// and that cap does not expire: only a report can clear it.
				hold, until = max(hold, staticBurst), posInf
			}
			for i := 0; i < m; i++ {
				if old := &f.recs[i]; old.burst > h.burst {
					hold = max(hold, old.burst)
					until = max(until, old.ue)
				}
			}
			f.holdBurst, f.holdUntil = min(hold, h.holding), until
		} else {
			f.holdBurst, f.holdUntil = 0, negInf
		}
		f.dropOldest(m)
		if rec := &f.recs[0]; rec.flags&(recPseudo|recMerged) == 0 {
			valid := min(h.valid, rec.ue-rec.at)
			rec.le = max(rec.le, rec.at+valid)
		}
		f.heldKnown = true
	case h.valid > 0:
		// The region holds a grant we cannot place. Count it as reported
		// until it surely expired. Its expiry has no lower bound: the
		// report's send time is unknown. It may be a previous leader's (in
		// learning mode), one of ours echoed inexactly (a misbehaving
		// region), or one of ours whose record is gone: a grant at the
		// static share, which keeps no record once the key's block is
		// freed, and which the region runs until it expires. If the region
		// acknowledges the record later, it may fall back to its static
		// share whenever that grant ends, so the record's lower expiry
		// bound is negInf, as every record's is at most its upper one.
		// (With posInf here, a region that acknowledged such a record was
		// counted below its static share, at a newer grant it never
		// installed, after that grant had ended: found by sim/live's
		// drain-and-restore run, Σ rates 1.02 r.)
		ue := now + h.valid + heldValidSlack
		if learning {
			f.heldKnown = false
		}
		if rec := (grantRec{rate: h.rate, burst: h.burst, ue: ue, le: negInf, at: negInf, flags: recPseudo}); !f.covers(rec) {
			f.addOldest(rec)
		}
	default:
		// Holds no grant: every grant it received expired before it sent
		// the report; tokens left from older caps are bounded by holding.
		f.heldKnown = false
		if h.holding <= staticBurst {
			f.holdBurst, f.holdUntil = 0, negInf
		} else {
			f.holdBurst = min(f.holdBurst, h.holding)
		}
	}
	f.prune(now)
}

// covers reports whether some record already counts at least r's rate and
// burst until at least its upper expiry.
func (f *fence) covers(r grantRec) bool {
	for i := 0; i < int(f.n); i++ {
		if c := &f.recs[i]; c.rate >= r.rate && c.burst >= r.burst && c.ue >= r.ue {
			return true
		}
	}
	return false
}

// heldValidSlack covers the truncation of held_valid to whole milliseconds
// on the wire: the true remaining validity may be up to 1ms longer.
const heldValidSlack = int64(1e6)

// distinct nudges a new grant's values down by the smallest float steps
// until they differ from every candidate's. Regions acknowledge a grant
// by echoing its values, so equal values would make it impossible to tell
// which grant a region holds, and with it when the region may fall back;
// a lower grant is always safe and the change is ~1e-16 relative. A (0, 0)
// grant cannot go lower: it becomes a rate of a few times the smallest
// positive float64 (~5e-324 tokens/s), which no sum of rates registers.
func (f *fence) distinct(rate, burst float64) (float64, float64) {
	zeroStep := 0
	for attempt := 0; attempt <= 2*maxRecs+2; attempt++ {
		clash := false
		for i := 0; i < int(f.n); i++ {
			if r := &f.recs[i]; r.rate == rate && r.burst == burst {
				clash = true
				break
			}
		}
		if !clash {
			break
		}
		switch {
		case zeroStep > 0:
			zeroStep++
			rate = float64(zeroStep) * math.SmallestNonzeroFloat64
		case rate > 0:
			rate = math.Nextafter(rate, 0)
		case burst > 0:
			burst = math.Nextafter(burst, 0)
		default:
			zeroStep = 1
			rate = math.SmallestNonzeroFloat64
		}
	}
	return rate, burst
}

// nearStatic tells values nudged by distinct (or rounded) from the static
// share apart from real deviations.
func nearStatic(v, static float64) bool { return math.Abs(v-static) <= 1e-12*static }

// hasNonStatic reports whether the region may be running on something
// other than its static share for this key.
func (f *fence) hasNonStatic(now int64, static, staticBurst float64) bool {
	if f.holdUntil > now && !nearStatic(f.holdBurst, staticBurst) {
		return true
	}
	for i := 0; i < int(f.n); i++ {
		r := &f.recs[i]
		if r.ue > now && (!nearStatic(r.rate, static) || !nearStatic(r.burst, staticBurst)) {
			return true
		}
	}
	return false
}

// lane is one resource (rate or burst) of the check for region x: the
// headroom H(t) the other regions leave it, from their summaries. x's own
// current grants are deliberately not part of it: a new grant must fit
// next to what the others may use, whatever x held before, so that
// knowledge lost about x (an unmatched report) can never be turned into
// capacity.
type lane struct {
	static float64 // x's static share of this resource
	// Others' summaries that are away from their static share: their
	// deviation delta[j] lasts until until[j] (sorted ascending), j < n.
	until [MaxRegions]int64
	delta [MaxRegions]float64
	n     int
	// H on [now, until[0]) is base; after until[j] it rises by delta[j].
	base float64
}

func (l *lane) reset(static float64) {
	l.static = static
	l.n = 0
	l.base = static
}

// addOther records another region's summary: v until t, its static share
// s after.
func (l *lane) addOther(now int64, v float64, t int64, s float64) {
	if t <= now || v == s {
		return
	}
	d := v - s
	l.base -= d
	i := l.n
	for ; i > 0 && l.until[i-1] > t; i-- {
		l.until[i], l.delta[i] = l.until[i-1], l.delta[i-1]
	}
	l.until[i], l.delta[i] = t, d
	l.n++
}

// headroom is H(t) for t >= now: the limit minus what the others may use,
// written as x's static share plus what the others leave below theirs
// minus what they may hold above theirs.
func (l *lane) headroom(t int64) float64 {
	h := l.base
	until, delta := l.until[:l.n], l.delta[:l.n]
	for j, u := range until {
		if u > t {
			break
		}
		h += delta[j]
	}
	return h
}

// minHeadroom is min H over [from, to).
func (l *lane) minHeadroom(from, to int64) float64 {
	m := l.headroom(from)
	h := l.base
	for j := 0; j < l.n; j++ {
		u := l.until[j]
		if u >= to {
			break
		}
		h += l.delta[j]
		// Deviations ending at the same instant end together: H is only
		// defined once all of them are applied.
		if u > from && (j+1 == l.n || l.until[j+1] != u) {
			m = min(m, h)
		}
	}
	return m
}

// fitsUntil returns the first time in [from, limit) where H drops below
// level, or limit when it never does.
func (l *lane) fitsUntil(level float64, from, limit int64) int64 {
	if l.headroom(from) < level {
		return from
	}
	h := l.base
	until, delta := l.until[:l.n], l.delta[:l.n]
	for j, u := range until {
		if u >= limit {
			break
		}
		h += delta[j]
		if u > from && (j+1 == len(until) || until[j+1] != u) && h < level {
			return u
		}
	}
	return limit
}
