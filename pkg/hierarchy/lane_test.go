package hierarchy

import (
	"math"
	"testing"

	"pgregory.net/rapid"
)

// laneOther is one other region's summary as a lane receives it.
type laneOther struct {
	v, s float64
	t    int64
}

// refHeadroom is H(t) from its definition: x's static share plus, for
// every other region whose summary still runs at t (t < its end), its
// static share minus what it may use; a summary that ended by now or sits
// at the static share counts nothing.
func refHeadroom(now, t int64, static float64, others []laneOther) float64 {
	h := static
	for _, o := range others {
		if o.t > now && t < o.t {
			h += o.s - o.v
		}
	}
	return h
}

// TestLaneHeadroomMatchesDefinition checks the headroom lane against H(t)
// computed from the others' summaries directly, at every instant that
// matters: the minimum over [from, to) (a step function, so its value at
// from and at every change inside), and the first instant in [from, limit)
// where it drops below a level. Times are small integers so that several
// summaries end at the same instant, at from, at to and at the limit.
func TestLaneHeadroomMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const now = 10
		static := float64(rapid.IntRange(0, 20).Draw(t, "static"))
		n := rapid.IntRange(0, 6).Draw(t, "others")
		others := make([]laneOther, n)
		var l lane
		l.reset(static)
		for i := range others {
			o := laneOther{
				v: float64(rapid.IntRange(0, 20).Draw(t, "v")),
				s: float64(rapid.IntRange(0, 20).Draw(t, "s")),
				t: int64(rapid.IntRange(now-2, now+8).Draw(t, "until")),
			}
			others[i] = o
			l.addOther(now, o.v, o.t, o.s)
		}
		from := int64(rapid.IntRange(now, now+8).Draw(t, "from"))
		to := from + int64(rapid.IntRange(1, 8).Draw(t, "len"))
		for at := int64(now); at <= now+10; at++ {
			if got, want := l.headroom(at), refHeadroom(now, at, static, others); got != want {
				t.Fatalf("H(%d) = %v, want %v (others %+v)", at, got, want, others)
			}
		}
		want := refHeadroom(now, from, static, others)
		for at := from + 1; at < to; at++ {
			want = min(want, refHeadroom(now, at, static, others))
		}
		if got := l.minHeadroom(from, to); got != want {
			t.Fatalf("min H on [%d, %d) = %v, want %v (others %+v)", from, to, got, want, others)
		}
		// The level is often one the headroom takes on: fitting exactly
		// is fitting.
		level := float64(rapid.IntRange(-10, 30).Draw(t, "level"))
		if rapid.Bool().Draw(t, "levelTaken") {
			level = refHeadroom(now, int64(rapid.IntRange(now, now+10).Draw(t, "levelAt")), static, others)
		}
		wantAt := to
		for at := from; at < to; at++ {
			if refHeadroom(now, at, static, others) < level {
				wantAt = at
				break
			}
		}
		if got := l.fitsUntil(level, from, to); got != wantAt {
			t.Fatalf("level %v fits on [%d, %d) until %d, want %d (others %+v)", level, from, to, got, wantAt, others)
		}
	})
}

// refUse is what the fence's region may use at t from the definition:
// E(t) = max(the largest live candidate value (ue > t), its static share
// once it may have fallen back), where it may have fallen back always
// when it is not known to hold a candidate, else from the earliest lower
// expiry bound on; burst caps also count the held burst until holdUntil.
func refUse(f *fence, t int64, static, staticBurst float64) (rate, burst float64) {
	fellBack := !f.heldKnown || f.n == 0
	if !fellBack {
		p := posInf
		for _, r := range f.recs[:f.n] {
			p = min(p, r.le)
		}
		fellBack = t >= p
	}
	for _, r := range f.recs[:f.n] {
		if t < r.ue {
			rate, burst = max(rate, r.rate), max(burst, r.burst)
		}
	}
	if t < f.holdUntil {
		burst = max(burst, f.holdBurst)
	}
	if fellBack {
		rate, burst = max(rate, static), max(burst, staticBurst)
	}
	return rate, burst
}

// TestFenceSummaryBoundsWhatTheRegionMayUse checks a fence's one-step
// summary ("v until T, the static share after") against E(t) at every
// instant: it never says less than the region may use (the others' grants
// are fitted next to it), and it says exactly what the region may use
// now, and that the region may be at its static share from T on when v is
// below it (a later T would count a fallen-back region below its share).
func TestFenceSummaryBoundsWhatTheRegionMayUse(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const now = 100
		var f fence
		n := rapid.IntRange(0, maxRecs).Draw(t, "recs")
		for range n {
			ue := int64(rapid.IntRange(now-2, now+10).Draw(t, "ue"))
			le := ue - int64(rapid.IntRange(0, 10).Draw(t, "early"))
			f.add(grantRec{
				rate:  float64(rapid.IntRange(0, 10).Draw(t, "rate")),
				burst: float64(rapid.IntRange(0, 10).Draw(t, "burst")),
				ue:    ue, le: le, at: le - 10,
			})
		}
		f.heldKnown = rapid.Bool().Draw(t, "heldKnown")
		if rapid.Bool().Draw(t, "hold") {
			f.holdBurst = float64(rapid.IntRange(0, 12).Draw(t, "holdBurst"))
			f.holdUntil = int64(rapid.IntRange(now-2, now+12).Draw(t, "holdUntil"))
			if rapid.IntRange(0, 3).Draw(t, "holdForever") == 0 {
				f.holdUntil = posInf
			}
		} else {
			f.holdUntil = negInf
		}
		static := float64(rapid.IntRange(0, 10).Draw(t, "static"))
		staticBurst := float64(rapid.IntRange(0, 10).Draw(t, "staticBurst"))
		sm := f.summarize(now, static, staticBurst)
		for _, lane := range []struct {
			name  string
			v, s  float64
			until int64
			use   func(int64) float64
		}{
			{"rate", sm.rateV, static, sm.rateT, func(at int64) float64 { r, _ := refUse(&f, at, static, staticBurst); return r }},
			{"burst", sm.burstV, staticBurst, sm.burstT, func(at int64) float64 { _, b := refUse(&f, at, static, staticBurst); return b }},
		} {
			said := func(at int64) float64 {
				if at < lane.until {
					return lane.v
				}
				return lane.s
			}
			for at := int64(now); at <= now+30; at++ {
				if u := lane.use(at); u > said(at) {
					t.Fatalf("%s at %d: the region may use %v, the summary (%v until %d, %v after) says %v; fence %+v",
						lane.name, at, u, lane.v, lane.until, lane.s, said(at), f)
				}
			}
			if lane.until > now && lane.v != lane.use(now) {
				t.Fatalf("%s: the summary says %v until %d, the region may use %v now; fence %+v", lane.name, lane.v, lane.until, lane.use(now), f)
			}
			if lane.until > now && lane.v < lane.s && lane.use(lane.until) < lane.s {
				t.Fatalf("%s: the summary counts %v until %d, below the static %v, but the region cannot fall back then; fence %+v",
					lane.name, lane.v, lane.until, lane.s, f)
			}
		}
	})
}

// TestFenceSummaryAtExactExpiry: a candidate or held burst whose bound is
// now has expired (expiries are exclusive), so it no longer counts in the
// summary, while one a nanosecond later still does.
func TestFenceSummaryAtExactExpiry(t *testing.T) {
	const now = 100
	var f fence
	f.add(grantRec{rate: 9, burst: 9, ue: now, le: now, at: 0})
	f.add(grantRec{rate: 5, burst: 5, ue: now + 10, le: now + 10, at: 1})
	f.heldKnown = true
	f.holdBurst, f.holdUntil = 12, now
	sm := f.summarize(now, 2, 2)
	if sm != (summary{rateV: 5, rateT: now + 10, burstV: 5, burstT: now + 10}) {
		t.Fatalf("summary at the expiries %+v, want 5/5 until %d", sm, now+10)
	}
	f.recs[0].ue, f.holdUntil = now+1, now+1
	sm = f.summarize(now, 2, 2)
	if sm != (summary{rateV: 9, rateT: now + 10, burstV: 12, burstT: now + 10}) {
		t.Fatalf("summary a nanosecond before the expiries %+v, want 9/12 until %d", sm, now+10)
	}
}

// TestDistinctStepsBelowEveryCandidate: a new grant equal to candidates
// (as values stepped down from it are, too) is lowered by the fewest
// float steps that make it differ from every candidate: rate first, burst
// when the rate is 0, and a (0, 0) grant becomes a multiple of the
// smallest rate. Regions acknowledge grants by their values.
func TestDistinctStepsBelowEveryCandidate(t *testing.T) {
	down := func(x float64, k int) float64 {
		for range k {
			x = math.Nextafter(x, 0)
		}
		return x
	}
	tiny := math.SmallestNonzeroFloat64
	for _, tc := range []struct {
		name         string
		recs         [][2]float64
		rate, burst  float64
		wantR, wantB float64
	}{
		{"no clash keeps the values", [][2]float64{{5, 5}}, 5, 4, 5, 4},
		{"one clash steps the rate once", [][2]float64{{5, 4}}, 5, 4, down(5, 1), 4},
		{"clashes all the way down", [][2]float64{{5, 4}, {down(5, 1), 4}, {down(5, 2), 4}}, 5, 4, down(5, 3), 4},
		{"a zero rate steps the burst", [][2]float64{{0, 4}, {0, down(4, 1)}}, 0, 4, 0, down(4, 2)},
		{"a zero grant without a clash stays zero", [][2]float64{{5, 5}}, 0, 0, 0, 0},
		{"zero grant becomes the smallest rate", [][2]float64{{0, 0}}, 0, 0, tiny, 0},
		{"then its multiples", [][2]float64{{0, 0}, {tiny, 0}, {2 * tiny, 0}}, 0, 0, 3 * tiny, 0},
		{"a rate stepped down to zero climbs back past every candidate", [][2]float64{{2 * tiny, 0}, {tiny, 0}, {0, 0}}, 2 * tiny, 0, 3 * tiny, 0},
	} {
		var f fence
		for _, r := range tc.recs {
			f.add(grantRec{rate: r[0], burst: r[1]})
		}
		if r, b := f.distinct(tc.rate, tc.burst); r != tc.wantR || b != tc.wantB {
			t.Errorf("%s: distinct(%v, %v) = %v, %v; want %v, %v", tc.name, tc.rate, tc.burst, r, b, tc.wantR, tc.wantB)
		}
	}
}

// TestAcknowledgeEdges pins the acknowledgement rules at their equalities:
// a held burst whose bound is now no longer counts; an unplaceable held
// grant that some candidate covers (values and expiry at least as large,
// equal included) adds no record; a region holding no grant and no more
// than its static cap leaves nothing held above it.
func TestAcknowledgeEdges(t *testing.T) {
	const now = 1000
	t.Run("held burst expiring now", func(t *testing.T) {
		var f fence
		f.add(grantRec{rate: 10, burst: 20, ue: now + 50, le: now + 40, at: now - 10})
		f.add(grantRec{rate: 5, burst: 8, ue: now + 60, le: now + 55, at: now - 5})
		f.heldKnown = true
		f.holdBurst, f.holdUntil = 30, now
		h := heldReport{rate: 5, burst: 8, valid: 50, holding: 25}
		f.acknowledge(now, h, f.match(h), 10, false)
		if f.holdBurst != 20 || f.holdUntil != now+50 {
			t.Fatalf("held burst %v until %d, want the older cap 20 until %d (the one expiring now is gone)", f.holdBurst, f.holdUntil, now+50)
		}
	})
	for _, tc := range []struct {
		name        string
		rate, burst float64
		ue          int64
	}{
		{"equal rate", 10, 12, now + 50 + heldValidSlack},
		{"equal burst", 12, 9, now + 50 + heldValidSlack},
		{"equal expiry", 12, 12, now + 50 + heldValidSlack},
	} {
		t.Run("covered by "+tc.name, func(t *testing.T) {
			var f fence
			f.add(grantRec{rate: tc.rate, burst: tc.burst, ue: tc.ue, le: now, at: now - 10})
			f.heldKnown = true
			h := heldReport{rate: 10, burst: 9, valid: 50, holding: 0}
			if m := f.match(h); m >= 0 {
				t.Fatalf("held %+v matches candidate %d", h, m)
			}
			f.acknowledge(now, h, -1, 10, false)
			if f.n != 1 {
				t.Fatalf("%d records after an unplaceable grant a candidate covers, want 1: %+v", f.n, f.recs)
			}
		})
	}
	t.Run("holding exactly the static cap", func(t *testing.T) {
		var f fence
		f.holdBurst, f.holdUntil = 5, now+100
		f.acknowledge(now, heldReport{holding: 10}, -1, 10, false)
		if f.holdUntil != negInf || f.hasNonStatic(now, 50, 10) {
			t.Fatalf("held burst %v until %d after a report holding exactly the static cap, want none", f.holdBurst, f.holdUntil)
		}
	})
}

// TestHasNonStaticAtExactExpiry: a held burst or candidate whose bound is
// now no longer keeps the region off its static share; one a nanosecond
// later does.
func TestHasNonStaticAtExactExpiry(t *testing.T) {
	const now = 100
	var f fence
	f.holdBurst, f.holdUntil = 12, now
	if f.hasNonStatic(now, 2, 2) {
		t.Fatal("a held burst whose bound is now still counts")
	}
	f.holdUntil = now + 1
	if !f.hasNonStatic(now, 2, 2) {
		t.Fatal("a held burst above the static cap until a nanosecond later does not count")
	}
	f.holdUntil = negInf
	f.add(grantRec{rate: 9, burst: 2, ue: now, le: now, at: 0})
	if f.hasNonStatic(now, 2, 2) {
		t.Fatal("a candidate expiring now still counts")
	}
	f.recs[0].ue = now + 1
	if !f.hasNonStatic(now, 2, 2) {
		t.Fatal("a candidate above the static rate until a nanosecond later does not count")
	}
}
