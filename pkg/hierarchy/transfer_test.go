package hierarchy

import "testing"

// reportReleased is script.report with the tokens the region's last
// install released, and seq repeated when retry is set.
func (s *script) reportReleased(region string, sentMs int, tokensPerSec, holding, released float64, retry bool) *Grant {
	s.t.Helper()
	kd := s.demand(region, tokensPerSec, holding, sentMs)
	kd.Released = released
	return s.send(region, sentMs, kd, retry)
}

func (s *script) inFlight() float64 {
	k, ok := s.a.keyIndex[s.key]
	if !ok || s.a.blockOf[k] < 0 {
		return 0
	}
	return s.a.transfer[s.a.blockOf[k]].tokens
}

// TestReleasedTokensAreDepositedOnce: the burst transfer between two
// regions (transfer.go). b idles on a full static bucket while a spends
// its own empty; b's lowered cap clips 40 tokens, which its
// acknowledgement releases, and a's next answer deposits them with a cap
// raised by as much. Retries credit and deposit nothing twice.
func TestReleasedTokensAreDepositedOnce(t *testing.T) {
	s := newScriptWith(t, Options{Regions: twoRegions(), DemandAlpha: 1}, KeyLimit{Rate: 100, Burst: 100})
	s.a.Allocate(s.at(6000))
	// a wants 150/s and holds nothing; b wants 10/s on a full bucket (its
	// static 50). b is lowered to 10/s and a cap of 10 at once.
	s.report("a", 6100, 150, 0)
	g := s.report("b", 6110, 10, 50)
	if g == nil || !near(g.Burst, 10) {
		t.Fatalf("b = %+v, want a cap of 10", g)
	}
	s.a.TakeNudges()
	// b installs it (40 clipped) and acknowledges with them released.
	s.reportReleased("b", 6120, 10, 10, 40, false)
	if got := s.inFlight(); !near(got, 40) {
		t.Fatalf("in flight after b's acknowledgement: %v, want 40", got)
	}
	s.takesNudges("b released 40", "a")
	// The acknowledgement retried: nothing more.
	s.reportReleased("b", 6125, 10, 10, 40, true)
	if got := s.inFlight(); !near(got, 40) {
		t.Fatalf("in flight after a retried acknowledgement: %v, want 40", got)
	}
	// a reports: its cap rises to its target 90, 40 of it deposited.
	ga := s.reportReleased("a", 6130, 150, 0, 0, false)
	if ga == nil || !near(ga.Deposit, 40) || !near(ga.Burst, 90) {
		t.Fatalf("a = %+v, want burst 90 with a deposit of 40", ga)
	}
	if got := s.inFlight(); got != 0 {
		t.Fatalf("in flight after the deposit: %v, want 0", got)
	}
	// a's report retried gets the same answer; nothing is taken twice.
	if again := s.reportReleased("a", 6130, 150, 0, 0, true); again == nil || again.Deposit != ga.Deposit {
		t.Fatalf("retried answer %+v, want the same deposit %v", again, ga.Deposit)
	}
	// a's next report: no deposit left.
	if g := s.reportReleased("a", 6140, 150, 0, 0, false); g == nil || g.Deposit != 0 {
		t.Fatalf("a's next answer %+v, want no deposit", g)
	}
}

// TestReleasedTokensNobodyNeedsAreDropped: with no region short of its
// rate, released tokens are not held back (they would hold the caps
// down); and tokens in flight no region takes are dropped after an epoch.
func TestReleasedTokensNobodyNeedsAreDropped(t *testing.T) {
	s := newScriptWith(t, Options{Regions: twoRegions(), DemandAlpha: 1}, KeyLimit{Rate: 100, Burst: 100})
	s.a.Allocate(s.at(6000))
	s.report("a", 6100, 40, 0)
	s.report("b", 6110, 70, 50)
	s.report("a", 6115, 40, 0)
	s.reportReleased("b", 6120, 70, 10, 40, false)
	if got := s.inFlight(); got != 0 {
		t.Fatalf("in flight with a at 40/s, below the rate it has: %v, want 0", got)
	}

	s = newScriptWith(t, Options{Regions: twoRegions(), DemandAlpha: 1}, KeyLimit{Rate: 100, Burst: 100})
	s.a.Allocate(s.at(6000))
	s.report("a", 6100, 150, 0)
	s.report("b", 6110, 10, 50)
	s.reportReleased("b", 6120, 10, 10, 40, false)
	if got := s.inFlight(); !near(got, 40) {
		t.Fatalf("in flight: %v, want 40", got)
	}
	// b reports again more than an epoch later; a never came for them.
	s.reportReleased("b", 7200, 10, 10, 0, false)
	if got := s.inFlight(); got != 0 {
		t.Fatalf("in flight an epoch later: %v, want 0 (dropped)", got)
	}
}

// TestLearningCreditsNoReleasedTokens: a new leader learning may be sent a
// report its predecessor credited (a retry after the failover), so it
// credits nothing while it learns.
func TestLearningCreditsNoReleasedTokens(t *testing.T) {
	s := newScriptWith(t, Options{Regions: twoRegions(), DemandAlpha: 1}, KeyLimit{Rate: 100, Burst: 100})
	// Learning until 5 s.
	s.report("a", 1100, 150, 0)
	s.report("b", 1110, 10, 50)
	s.reportReleased("b", 1120, 10, 10, 40, false)
	if got := s.inFlight(); got != 0 {
		t.Fatalf("in flight while learning: %v, want 0", got)
	}
}

// TestNoDepositWithAGrantThatLowersTheCap: a region may spend its old
// cap's tokens before a grant lands, so a deposit goes only with a grant
// that does not lower its cap below the largest it may hold; a grant that
// lowers it carries none, even to a region short of its rate.
func TestNoDepositWithAGrantThatLowersTheCap(t *testing.T) {
	regions := []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}}
	s := newScriptWith(t, Options{Regions: regions, DemandAlpha: 1}, KeyLimit{Rate: 300, Burst: 300})
	s.a.Allocate(s.at(6000))
	// a wants 600/s on an empty bucket; b and c idle on full ones (100).
	s.report("a", 6100, 600, 0)
	s.report("b", 6110, 10, 100)
	s.report("c", 6120, 10, 100)
	// b releases 90; a's next answer deposits them with a cap above its
	// static 100.
	s.reportReleased("b", 6130, 10, 10, 90, false)
	ga := s.reportReleased("a", 6140, 600, 0, 0, false)
	if ga == nil || !near(ga.Deposit, 90) {
		t.Fatalf("a = %+v, want a deposit of 90", ga)
	}
	peak := ga.Burst
	// c releases 90 too, while b's demand rises: a's target falls below
	// the cap it holds.
	s.reportReleased("c", 6150, 10, 10, 90, false)
	if got := s.inFlight(); !near(got, 90) {
		t.Fatalf("in flight after c's release: %v, want 90", got)
	}
	s.reportReleased("b", 6160, 300, 0, 0, false)
	g := s.reportReleased("a", 6170, 600, 0, 0, false)
	if g == nil {
		t.Fatal("a got no grant")
	}
	if g.Burst < peak && g.Deposit != 0 {
		t.Fatalf("a = %+v: a grant below the cap it holds (%v) carries a deposit", g, peak)
	}
	if g.Burst >= peak {
		t.Fatalf("a = %+v: its cap was not lowered below %v; the case is not reached", g, peak)
	}
}
