package hierarchy

import (
	"slices"
	"testing"
	"time"
)

// TestNudgesMoveCapacityBetweenEpochs follows one shift: the recipient's
// short answer nudges the donor, the donor's acknowledgement nudges the
// recipient back, and the recipient gets its target at that report, all
// within a few milliseconds of allocator time and with no Allocate in
// between. Once the shift is done nothing nudges anyone.
func TestNudgesMoveCapacityBetweenEpochs(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 100})
	s.a.Allocate(s.at(6000))
	if g := s.report("a", 6100, 150, -1); g == nil || !near(g.Rate, 50) {
		t.Fatalf("a's first grant = %+v, want its static 50", g)
	}
	s.takesNudges("a got its target (b may be at its share)")
	if g := s.report("b", 6200, 10, -1); g == nil || !near(g.Rate, 10) {
		t.Fatalf("b's first grant = %+v, want 10", g)
	}
	s.takesNudges("b got its smaller grant; nobody waits")

	// a now wants 90, but b may still run at 50 until it acknowledges 10.
	if g := s.report("a", 6300, 150, -1); g == nil || g.Rate > 50 {
		t.Fatalf("a got %+v before b acknowledged", g)
	}
	s.takesNudges("a is short for want of b's acknowledgement", "b")
	s.takesNudges("nudges are handed out once")

	// b answers the nudge: its report acknowledges 10, which frees what a
	// waits for.
	s.report("b", 6310, 10, -1)
	s.takesNudges("b acknowledged", "a")
	if g := s.report("a", 6320, 150, -1); g == nil || !near(g.Rate, 90) {
		t.Fatalf("a after b's acknowledgement = %+v, want 90", g)
	}
	s.takesNudges("a has its target")

	// Steady state: epochs of unchanged demand nudge nobody.
	for e := 7; e < 10; e++ {
		s.a.Allocate(s.at(e * 1000))
		s.report("a", e*1000+100, 150, -1)
		s.report("b", e*1000+200, 10, -1)
		s.takesNudges("steady state")
	}
}

// TestLearningLeaderNudgesNobody: a new leader only re-issues what regions
// hold until it has learnt; nothing it answers is short for want of an
// acknowledgement, so it asks nothing early.
func TestLearningLeaderNudgesNobody(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 100})
	s.report("a", 100, 150, -1)
	s.report("b", 200, 10, -1)
	s.report("a", 300, 150, -1)
	if got := s.a.TakeNudges(); len(got) != 0 {
		t.Fatalf("learning leader nudged %q", got)
	}
}

// TestOnlyRegionsAboveTheirTargetAreNudged: when a's answer falls short,
// only the regions that may use more than their targets are asked to
// report; c, held at its ceiling which is also its static share, already
// holds exactly its target and is left alone.
func TestOnlyRegionsAboveTheirTargetAreNudged(t *testing.T) {
	regions := []Region{{Name: "a", Weight: 2}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1, MaxShare: 0.25}}
	s := newScript(t, regions, KeyLimit{Rate: 1000, Burst: 1000})
	s.a.Allocate(s.at(6000))
	if g := s.report("a", 6100, 2000, -1); g == nil || !near(g.Rate, 500) {
		t.Fatalf("a's first grant = %+v, want its static 500", g)
	}
	if g := s.report("c", 6150, 2000, -1); g == nil || !near(g.Rate, 250) || !near(g.Burst, 250) {
		t.Fatalf("c's first grant = %+v, want its ceiling 250/250", g)
	}
	if g := s.report("b", 6200, 10, -1); g == nil || !near(g.Rate, 10) {
		t.Fatalf("b's first grant = %+v, want 10", g)
	}
	s.takesNudges("nobody is short yet")
	if g := s.report("a", 6300, 2000, -1); g == nil || g.Rate > 500 {
		t.Fatalf("a got %+v before b acknowledged", g)
	}
	s.takesNudges("a is short for want of b's acknowledgement", "b")
}

// TestPeakUseAtTheEdges pins what a region is counted at when deciding
// whom to nudge: its summary's value while that runs (until T, exclusive),
// and what it is counted at without a grant once T falls inside the
// shortest validity from now (a summary ending exactly then no longer
// matters).
func TestPeakUseAtTheEdges(t *testing.T) {
	a := mustAllocator(t, twoRegions()) // shortest validity: the 1s epoch
	const now = int64(10 * time.Second)
	for _, tc := range []struct {
		name         string
		until        int64
		wantR, wantB float64
	}{
		{"summary ended before now", now - 1, 250, 25},
		{"summary ends exactly now", now, 250, 25},
		{"summary runs past now, ends within the validity", now + 1, 300, 30},
		{"summary ends just before the horizon", now + int64(time.Second) - 1, 300, 30},
		{"summary ends exactly at the horizon", now + int64(time.Second), 300, 30},
	} {
		sm := summary{rateV: 300, burstV: 30, rateT: tc.until, burstT: tc.until}
		if r, b := a.peakUse(now, sm, 250, 25); r != tc.wantR || b != tc.wantB {
			t.Errorf("%s: peak use %v/%v, want %v/%v", tc.name, r, b, tc.wantR, tc.wantB)
		}
		sm = summary{rateV: 100, burstV: 10, rateT: tc.until, burstT: tc.until}
		wantR, wantB := 250.0, 25.0
		if tc.until >= now+int64(time.Second) {
			wantR, wantB = 100, 10
		}
		if r, b := a.peakUse(now, sm, 250, 25); r != wantR || b != wantB {
			t.Errorf("%s, below the fallback: peak use %v/%v, want %v/%v", tc.name, r, b, wantR, wantB)
		}
	}
}

// takesNudges takes the allocator's nudges and fails unless they are want.
func (s *script) takesNudges(when string, want ...string) {
	s.t.Helper()
	if got := s.a.TakeNudges(); !slices.Equal(got, want) {
		s.t.Fatalf("%s: nudges %q, want %q", when, got, want)
	}
}

// TestAcknowledgementNudgesARaisedTarget: the donor's fall is heard in a
// report of its own, which raises the recipient's target after the
// recipient's last answer met the target it had then (so that answer was
// not short). When the donor acknowledges its smaller grant, the freed
// capacity is the recipient's: it is nudged although no answer of its own
// waits for a raise.
func TestAcknowledgementNudgesARaisedTarget(t *testing.T) {
	// Each reading replaces the estimate: the fall is heard in one report.
	s := newScriptWith(t, Options{Regions: twoRegions(), DemandAlpha: 1}, KeyLimit{Rate: 100, Burst: 100})
	s.a.Allocate(s.at(6000))
	s.report("a", 6100, 150, -1)
	s.report("b", 6200, 10, -1)
	s.report("a", 6300, 150, -1)
	s.report("b", 6310, 10, -1)
	if g := s.report("a", 6320, 150, -1); g == nil || !near(g.Rate, 90) {
		t.Fatalf("a = %+v, want 90", g)
	}
	s.a.TakeNudges() // the start's, as in TestNudgesMoveCapacityBetweenEpochs

	// b's demand rises: its target is 50 while a still reads 150, and a
	// holds 90, so b's answer is short and a is nudged.
	if g := s.report("b", 6400, 150, -1); g == nil || g.Rate > 10+1e-9 {
		t.Fatalf("b got %+v before a acknowledged", g)
	}
	s.takesNudges("b is short", "a")
	// a still reads 150: it is lowered to 50 and acknowledges; b, nudged,
	// gets its target of 50 and is not short any more.
	if g := s.report("a", 6410, 150, -1); g == nil || !near(g.Rate, 50) {
		t.Fatalf("a = %+v, want 50", g)
	}
	s.report("a", 6420, 150, -1)
	s.takesNudges("a acknowledged 50", "b")
	if g := s.report("b", 6430, 150, -1); g == nil || !near(g.Rate, 50) {
		t.Fatalf("b = %+v, want its target 50", g)
	}
	s.takesNudges("b has its target")

	// a's fall is heard at the next epoch: b's target rises to 90, a is
	// lowered to 10. b's last answer was not short, but a's
	// acknowledgement frees what b's target now asks for.
	s.a.Allocate(s.at(7000))
	s.takesNudges("the epoch")
	if g := s.report("a", 7100, 10, -1); g == nil || !near(g.Rate, 10) {
		t.Fatalf("a after its fall = %+v, want 10", g)
	}
	s.takesNudges("a is lowered, not yet acknowledged")
	s.report("a", 7110, 10, -1)
	s.takesNudges("a acknowledged 10: b's raise is free", "b")
	if g := s.report("b", 7120, 150, -1); g == nil || !near(g.Rate, 90) {
		t.Fatalf("b after a's acknowledgement = %+v, want 90", g)
	}
	s.takesNudges("b has its target")
}
