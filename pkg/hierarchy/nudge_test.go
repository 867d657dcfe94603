package hierarchy

import (
	"slices"
	"testing"
)

// TestNudgesMoveCapacityBetweenEpochs follows one shift: the recipient's
// short answer nudges the donor, the donor's acknowledgement nudges the
// recipient back, and the recipient gets its target at that report, all
// within a few milliseconds of allocator time and with no Allocate in
// between. Once the shift is done nothing nudges anyone.
func TestNudgesMoveCapacityBetweenEpochs(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 100})
	takes := func(when string, want ...string) {
		t.Helper()
		if got := s.a.TakeNudges(); !slices.Equal(got, want) {
			t.Fatalf("%s: nudges %q, want %q", when, got, want)
		}
	}
	s.a.Allocate(s.at(6000))
	if g := s.report("a", 6100, 150, -1); g == nil || !near(g.Rate, 50) {
		t.Fatalf("a's first grant = %+v, want its static 50", g)
	}
	takes("a got its target (b may be at its share)")
	if g := s.report("b", 6200, 10, -1); g == nil || !near(g.Rate, 10) {
		t.Fatalf("b's first grant = %+v, want 10", g)
	}
	takes("b got its smaller grant; nobody waits")

	// a now wants 90, but b may still run at 50 until it acknowledges 10.
	if g := s.report("a", 6300, 150, -1); g == nil || g.Rate > 50 {
		t.Fatalf("a got %+v before b acknowledged", g)
	}
	takes("a is short for want of b's acknowledgement", "b")
	takes("nudges are handed out once")

	// b answers the nudge: its report acknowledges 10, which frees what a
	// waits for.
	s.report("b", 6310, 10, -1)
	takes("b acknowledged", "a")
	if g := s.report("a", 6320, 150, -1); g == nil || !near(g.Rate, 90) {
		t.Fatalf("a after b's acknowledgement = %+v, want 90", g)
	}
	takes("a has its target")

	// Steady state: epochs of unchanged demand nudge nobody.
	for e := 7; e < 10; e++ {
		s.a.Allocate(s.at(e * 1000))
		s.report("a", e*1000+100, 150, -1)
		s.report("b", e*1000+200, 10, -1)
		takes("steady state")
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
