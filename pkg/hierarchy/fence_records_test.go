package hierarchy

import "testing"

// TestMergeKeepsTheEarliestAnswer: a full fence that must record a grant
// it cannot place merges its two oldest records into one covering both:
// the larger values, the later upper and the earlier lower expiry, and the
// earlier answer time, which is the lower bound of the send time of a
// report acknowledging either of them.
func TestMergeKeepsTheEarliestAnswer(t *testing.T) {
	const now = 1000
	var f fence
	f.add(grantRec{rate: 10, burst: 4, ue: now + 50, le: now + 20, at: now - 30})
	f.add(grantRec{rate: 6, burst: 8, ue: now + 70, le: now + 40, at: now - 20})
	f.add(grantRec{rate: 3, burst: 2, ue: now + 90, le: now + 60, at: now - 10})
	f.addOldest(grantRec{rate: 12, burst: 12, ue: now + 5, le: negInf, at: negInf, flags: recPseudo})
	if f.n != maxRecs {
		t.Fatalf("%d records after merging into a full fence, want %d", f.n, maxRecs)
	}
	want := grantRec{rate: 10, burst: 8, ue: now + 70, le: now + 20, at: now - 30, flags: recMerged}
	if f.recs[1] != want {
		t.Fatalf("merged record %+v, want %+v", f.recs[1], want)
	}
	if got := f.heldSince(heldReport{rate: 10, burst: 8, valid: 10}); got != now-30 {
		t.Fatalf("send time bound of a report holding the merged grant %d, want the earlier answer %d", got, now-30)
	}
}

// TestDropOldestClearsTheVacatedSlots: records removed from the front
// leave zero slots behind, so the fence equals one holding only the
// remaining records.
func TestDropOldestClearsTheVacatedSlots(t *testing.T) {
	r := func(i int64) grantRec {
		return grantRec{rate: float64(i), burst: float64(i), ue: 100 + i, le: 50 + i, at: i}
	}
	for m := 0; m <= maxRecs; m++ {
		var f, want fence
		for i := range int64(maxRecs) {
			f.add(r(i))
			if i >= int64(m) {
				want.add(r(i))
			}
		}
		f.dropOldest(m)
		if f != want {
			t.Fatalf("after dropping %d: %+v, want %+v", m, f, want)
		}
	}
}

// TestAcknowledgedValidityIsBoundedByTheGrant: a report claiming more
// remaining validity than the grant was issued with raises the lower
// expiry bound only up to the grant's own expiry bound.
func TestAcknowledgedValidityIsBoundedByTheGrant(t *testing.T) {
	const now = 1000
	for _, tc := range []struct {
		name   string
		valid  int64
		wantLE int64
	}{
		{"less than issued", 40, now - 10 + 40},
		{"exactly as issued", 60, now + 50},
		{"more than issued", 100, now + 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f fence
			f.add(grantRec{rate: 5, burst: 5, ue: now + 50, le: negInf, at: now - 10})
			h := heldReport{rate: 5, burst: 5, valid: tc.valid, holding: 1}
			f.acknowledge(now, h, f.match(h), 2, false)
			if f.n != 1 || f.recs[0].le != tc.wantLE {
				t.Fatalf("records %+v, want one with lower expiry %d", f.recs[:f.n], tc.wantLE)
			}
		})
	}
}

// TestAcknowledgingAMergedRecordKeepsItsLowerExpiry: a merged record
// stands for either of two grants, so a report echoing its values raises
// nothing: its lower expiry bound stays the earlier of the two, and the
// region may fall back from then on.
func TestAcknowledgingAMergedRecordKeepsItsLowerExpiry(t *testing.T) {
	const now = 1000
	var f fence
	f.add(grantRec{rate: 10, burst: 8, ue: now + 50, le: now + 20, at: now - 30})
	f.add(grantRec{rate: 6, burst: 4, ue: now + 70, le: now + 40, at: now - 20})
	f.add(grantRec{rate: 3, burst: 2, ue: now + 90, le: now + 60, at: now - 10})
	f.addOldest(grantRec{rate: 12, burst: 12, ue: now + 5, le: negInf, at: negInf, flags: recPseudo})
	f.dropOldest(1) // the pseudo record expired; the merged one is oldest
	if f.recs[0].flags != recMerged {
		t.Fatalf("oldest record %+v, want the merged one", f.recs[0])
	}
	h := heldReport{rate: 10, burst: 8, valid: 60, holding: 1}
	f.acknowledge(now, h, f.match(h), 2, false)
	if f.n != 2 || f.recs[0].le != now+20 {
		t.Fatalf("records %+v after acknowledging the merged one, want its lower expiry %d unchanged", f.recs[:f.n], now+20)
	}
	if got := f.fallbackAt(); got != now+20 {
		t.Fatalf("fallback at %d, want %d", got, now+20)
	}
}

// TestHoldingNoGrantBoundsTheHeldBurst: a region that holds no grant and
// reports holding more than its static cap keeps its older caps counting,
// but never for more than the tokens it reports.
func TestHoldingNoGrantBoundsTheHeldBurst(t *testing.T) {
	const now = 1000
	var f fence
	f.heldKnown = true
	f.holdBurst, f.holdUntil = 20, now+100
	f.acknowledge(now, heldReport{holding: 7}, -1, 4, false)
	if f.holdBurst != 7 || f.holdUntil != now+100 || f.heldKnown {
		t.Fatalf("held burst %v until %d (held known %v), want 7 until %d and nothing known held", f.holdBurst, f.holdUntil, f.heldKnown, now+100)
	}
	if sm := f.summarize(now, 3, 4); sm.burstV != 7 {
		t.Fatalf("summary burst %v, want the holding 7", sm.burstV)
	}
}

// TestLearningCountsAPreviousLeadersGrantAsEndingAnyTime: in learning
// mode a held grant the allocator cannot place is a previous leader's,
// whose expiry it cannot bound from below. Its record has no lower
// expiry, so even once a later report echoes it the region may fall back
// to its static share at any time, and a grant below that share frees
// nothing for the others.
func TestLearningCountsAPreviousLeadersGrantAsEndingAnyTime(t *testing.T) {
	const now = 1000
	var f fence
	h := heldReport{rate: 2, burst: 1, valid: 500, holding: 1}
	f.acknowledge(now, h, -1, 4, true)
	if f.n != 1 || f.recs[0].le != negInf || f.heldKnown {
		t.Fatalf("records %+v (held known %v), want one with no lower expiry and nothing known held", f.recs[:f.n], f.heldKnown)
	}
	h.valid = 400
	f.acknowledge(now+100, h, f.match(h), 4, true)
	if !f.heldKnown || f.fallbackAt() != negInf {
		t.Fatalf("held known %v, fallback at %d; want the echoed grant held and a fallback at any time", f.heldKnown, f.fallbackAt())
	}
	if sm := f.summarize(now+100, 5, 4); sm.rateT > now+100 {
		t.Fatalf("summary rate %v until %d, want the static share 5 from now on", sm.rateV, sm.rateT)
	}
}
