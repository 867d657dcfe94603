package oracle

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// twoRegions: rate 100/s, burst 200; weights 1:1, static shares 50/100.
func twoRegions(t *testing.T, mod func(*Setup)) *Oracle {
	t.Helper()
	s := Setup{
		Regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}},
		Keys: []Key{{Key: quota.Key{Tenant: "t", Class: "c"}, Rate: 100, Burst: 200,
			StaticRate: []float64{50, 50}, StaticBurst: []float64{100, 100}}},
		Epoch: time.Second, Duration: 10 * time.Minute, ConvergenceTolerance: 0.05,
	}
	if mod != nil {
		mod(&s)
	}
	o, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

const sec = time.Second

func TestConformingStreamPasses(t *testing.T) {
	o := twoRegions(t, nil)
	// The full burst at once, then exactly the rate, split over regions.
	o.Decided(0, 0, 0, 120, SourceLease)
	o.Decided(0, 1, 0, 80, SourceLease)
	for i := 1; i <= 100; i++ {
		o.Decided(time.Duration(i)*sec, i%2, 0, 100, SourceLease)
	}
	r := o.Finish(200 * sec)
	if r.Conformance.Violations != 0 || r.Conformance.MaxExcess > 0 {
		t.Fatalf("conforming stream flagged: %+v", r.Conformance)
	}
}

func TestOverAdmissionIsAViolationEvenAcrossRegions(t *testing.T) {
	o := twoRegions(t, nil)
	o.Decided(0, 0, 0, 150, SourceLease)
	o.Decided(0, 1, 0, 50, SourceStrict)
	o.Decided(500*time.Millisecond, 1, 0, 52, SourceLease) // allowance b + r·0.5 = 250; 252 admitted
	r := o.Finish(time.Second)
	c := r.Conformance
	if c.Violations != 1 || math.Abs(c.MaxExcess-2) > 1e-6 || c.FirstKey != "t/c" {
		t.Fatalf("violation not reported as 1 episode of 2 tokens: %+v", c)
	}
}

func TestCrashErrorCoversExcessUpToEpsilon(t *testing.T) {
	o := twoRegions(t, nil)
	o.Decided(0, 0, 0, 200, SourceLease)
	o.CrashError(time.Millisecond, 0, 5)
	o.Decided(2*time.Millisecond, 1, 0, 4, SourceLease) // 4 over b (+0.2 refill), within ε = 5
	r := o.Finish(time.Second)
	if r.Conformance.Violations != 0 || r.Conformance.CoveredByEps != 1 || r.Conformance.CrashError != 5 {
		t.Fatalf("excess within ε not counted apart: %+v", r.Conformance)
	}
	o = twoRegions(t, nil)
	o.Decided(0, 0, 0, 200, SourceLease)
	o.CrashError(time.Millisecond, 0, 5)
	o.Decided(2*time.Millisecond, 1, 0, 9, SourceLease)
	if r := o.Finish(time.Second); r.Conformance.Violations != 1 {
		t.Fatalf("excess beyond ε not a violation: %+v", r.Conformance)
	}
}

// TestOneTokenOfCrashErrorCoversOneTokenOver: ε of a single token, the
// least a crash can leave, is counted and covers an excess of exactly one
// token; one more is a violation.
func TestOneTokenOfCrashErrorCoversOneTokenOver(t *testing.T) {
	for _, c := range []struct {
		admitted   int64
		violations int
	}{{6, 0}, {7, 1}} {
		o := oneKey(t, 1, 5, nil)
		o.CrashError(0, 0, 1)
		o.Decided(0, 0, 0, c.admitted, SourceLease)
		r := o.Finish(sec)
		if cf := r.Conformance; cf.Violations != c.violations || cf.CoveredByEps != int64(1-c.violations) || cf.CrashError != 1 || cf.CrashKeys != 1 {
			t.Fatalf("%d admitted at once, burst 5, ε 1: %+v", c.admitted, cf)
		}
	}
}

// TestStrictAdmissionsAfterWarmup: strict admissions are counted over the
// whole run and, from the end of the warmup on, apart.
func TestStrictAdmissionsAfterWarmup(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Warmup = 10 * sec })
	o.Decided(5*sec, 0, 0, 3, SourceStrict)
	o.Decided(10*sec, 0, 0, 4, SourceStrict)
	o.Decided(10*sec, 1, 0, 5, SourceLease)
	r := o.Finish(20 * sec)
	if r.Strict != 7 || r.Admitted != 12 || r.AfterWarmup.Strict != 4 || r.AfterWarmup.Admitted != 9 {
		t.Fatalf("strict %v of %v admitted, after warmup %+v: want 7 of 12, 4 of 9", r.Strict, r.Admitted, r.AfterWarmup)
	}
}

// TestUnservedAfterWarmup: requests that found no live instance are
// denied, and counted apart, over the whole run and from the end of the
// warmup on.
func TestUnservedAfterWarmup(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Warmup = 10 * sec })
	o.Unserved(5*sec, 0, 0, 3)
	o.Unserved(10*sec, 0, 0, 4)
	o.Decided(10*sec, 1, 0, 5, SourceDenied)
	r := o.Finish(20 * sec)
	if r.Unserved != 7 || r.Denied != 12 || r.AfterWarmup.Unserved != 4 || r.AfterWarmup.Denied != 9 {
		t.Fatalf("unserved %v of %v denied, after warmup %+v: want 7 of 12, 4 of 9", r.Unserved, r.Denied, r.AfterWarmup)
	}
}

func TestDegradedAndShadowAdmissionsAreReportedApart(t *testing.T) {
	o := twoRegions(t, nil)
	o.Decided(0, 0, 0, 200, SourceLease)
	o.Decided(0, 1, 0, 300, SourceDegraded)
	o.Decided(0, 1, 0, 50, SourceShadow)
	r := o.Finish(time.Second)
	if r.Conformance.Violations != 0 || r.Degraded != 300 || r.Shadow != 50 || r.Conformance.MaxExcessWithDegraded < 299 {
		t.Fatalf("degraded/shadow accounting: %+v degraded %v shadow %v", r.Conformance, r.Degraded, r.Shadow)
	}
}

func TestRateSumCheckedWhenGrantsApply(t *testing.T) {
	o := twoRegions(t, nil)
	o.GrantApplied(sec, 0, 0, 70, 140, 6*sec) // a: 70 + b static 50 = 120 > 100
	r := o.Finish(2 * sec)
	if r.Rates.Violations != 1 || r.Bursts.Violations != 1 || r.Rates.FirstSum != 120 {
		t.Fatalf("oversubscription not caught: rates %+v bursts %+v", r.Rates, r.Bursts)
	}
}

func TestRateSumCheckedWhenAGrantExpires(t *testing.T) {
	// A donor below its static share and a recipient above it: fine while
	// both grants run; the donor's grant expiring first jumps it back to 50
	// while the recipient still has 70.
	o := twoRegions(t, nil)
	o.GrantApplied(sec, 0, 0, 30, 60, 5*sec)
	o.GrantApplied(sec, 1, 0, 70, 140, 8*sec)
	o.Advance(4 * sec)
	if o.res.Rates.Violations != 0 {
		t.Fatalf("flagged before the donor's grant expired: %+v", o.res.Rates)
	}
	r := o.Finish(6 * sec)
	if r.Rates.Violations != 1 || r.Rates.FirstAt != 5*sec {
		t.Fatalf("donor fallback at its expiry not caught exactly at 5s: %+v", r.Rates)
	}
}

func TestSupersededGrantDoesNotLeaveAStaleExpiryCheck(t *testing.T) {
	o := twoRegions(t, nil)
	o.GrantApplied(sec, 0, 0, 40, 80, 5*sec)
	o.GrantApplied(sec, 1, 0, 60, 120, 5*sec)
	o.GrantApplied(2*sec, 0, 0, 40, 80, 7*sec)
	o.GrantApplied(2*sec, 1, 0, 60, 120, 7*sec)
	if r := o.Finish(10 * sec); r.Rates.Violations != 0 || r.Rates.Checks < 5 {
		t.Fatalf("matched grants flagged: %+v", r.Rates)
	}
}

func TestRedisDownStopsRefillAndRestartDropsGrants(t *testing.T) {
	o := twoRegions(t, nil)
	o.GrantApplied(sec, 0, 0, 30, 60, 20*sec)
	o.GrantApplied(sec, 1, 0, 70, 140, 20*sec)
	o.RedisDown(2*sec, 0)
	if a, _ := o.rateAt(0, 0, 3*sec); a != 0 {
		t.Fatalf("a region with Redis down refills at %v", a)
	}
	o.RedisUp(4*sec, 0) // back empty: static 50 + b's 70
	r := o.Finish(5 * sec)
	if r.Rates.Violations != 1 || r.Rates.FirstAt != 4*sec {
		t.Fatalf("restart dropping a donor's grant not caught: %+v", r.Rates)
	}
}

func TestIdealBucketAndUtilization(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Warmup = 0; s.Duration = 2 * time.Minute })
	// 150 requests/s offered for two minutes; Sluice admits 100/s.
	for i := 0; i < 120; i++ {
		at := time.Duration(i) * sec
		o.Offered(at, 0, 0, 150, 1)
		o.Decided(at, 0, 0, 100, SourceLease)
		o.Decided(at, 0, 0, 50, SourceDenied)
	}
	r := o.Finish(2 * time.Minute)
	if r.Util60sMin < 0.999 || r.Windows60 != 2 {
		t.Fatalf("utilization at the limit is %v over %d windows", r.Util60sMin, r.Windows60)
	}
	// The ideal bucket admits its burst once, then the rate.
	if want := 200.0 + 100*119; math.Abs(r.IdealAdmitted-want) > 1 {
		t.Fatalf("ideal bucket admitted %v, want %v", r.IdealAdmitted, want)
	}
	if r.FalseRejects != 0 {
		t.Fatalf("denials above the fair share counted as false: %v", r.FalseRejects)
	}
}

func TestFalseRejectsBelowFairShare(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Warmup = 0; s.Duration = time.Minute })
	// Region a wants 80/s, b nothing: a's fair share is 100 (the whole
	// rate), yet it is held at its static 50.
	for i := 0; i < 60; i++ {
		at := time.Duration(i) * sec
		o.Offered(at, 0, 0, 80, 1)
		o.Decided(at, 0, 0, 50, SourceLease)
		o.Decided(at, 0, 0, 30, SourceDenied)
	}
	r := o.Finish(time.Minute)
	if math.Abs(r.FalseRejects-30.0/80) > 0.01 {
		t.Fatalf("false rejects %v, want 30/80", r.FalseRejects)
	}
	if r.Util60sMin > 0.63 || r.Util60sMin < 0.62 {
		t.Fatalf("utilization %v, want 50/80", r.Util60sMin)
	}
}

func TestConvergenceMeasure(t *testing.T) {
	// At 10s demand moves to region b (90/s there, 10/s in a): fair is
	// 10/90. b's grant rises to 90 just before the fourth epoch.
	o := twoRegions(t, func(s *Setup) {
		s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{10, 90}}}
		s.Duration = time.Minute
	})
	o.GrantApplied(12*sec, 0, 0, 10, 20, 90*sec)
	o.GrantApplied(13900*time.Millisecond, 1, 0, 90, 180, 90*sec)
	r := o.Finish(time.Minute)
	if r.Convergence.Shifts != 1 || r.Convergence.NotConverged != 0 || r.Convergence.Max != 4 {
		t.Fatalf("convergence %+v, want 4 epochs", r.Convergence)
	}
	// Without the grant it never converges.
	o = twoRegions(t, func(s *Setup) {
		s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{10, 90}}}
		s.Duration = time.Minute
	})
	if r := o.Finish(time.Minute); r.Convergence.NotConverged != 1 {
		t.Fatalf("a static split counted as converged: %+v", r.Convergence)
	}
}

func TestReclaimAndRPCCounts(t *testing.T) {
	o := twoRegions(t, nil)
	o.Reclaimed(10*sec, 14*sec, 30)
	o.Reclaimed(20*sec, 21*sec, 5)
	o.RPC(TierInstance, 3)
	o.RPC(TierGlobal, 1)
	r := o.Finish(30 * sec)
	if r.Reclaim.Max != 4*sec || r.Reclaim.Crashes != 2 || r.Reclaim.Tokens != 35 {
		t.Fatalf("reclaim %+v", r.Reclaim)
	}
	if r.RPCs(TierInstance) != 3 || r.RPCs(TierGlobal) != 1 || r.RPCs(TierRedis) != 0 {
		t.Fatalf("rpc counts %v", r.RPC)
	}
}

func TestSeriesAndFocus(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Focus = []int{0}; s.Duration = 10 * sec; s.Step = sec })
	o.Offered(500*time.Millisecond, 1, 0, 10, 2)
	o.Decided(500*time.Millisecond, 1, 0, 12, SourceLease)
	o.GrantApplied(1500*time.Millisecond, 1, 0, 70, 140, 9*sec)
	r := o.Finish(10 * sec)
	s := r.Series
	if len(s.Times) != 10 || s.Offered[0] != 20 || s.Admitted[0] != 12 || len(s.Focus) != 1 {
		t.Fatalf("series %+v", s)
	}
	rg := s.Focus[0].Regions[1]
	if rg.Offered[0] != 20 || rg.Rate[0] != 50 || rg.Rate[1] != 70 || rg.Rate[9] != 50 {
		t.Fatalf("focus region series: offered %v rate %v", rg.Offered[:2], rg.Rate)
	}
}

func TestBadSetupRefused(t *testing.T) {
	if _, err := New(Setup{}); err == nil {
		t.Fatal("empty setup accepted")
	}
	_, err := New(Setup{Regions: []Region{{Name: "a", Weight: 1}}, Epoch: sec, Duration: sec,
		Keys: []Key{{Key: quota.Key{Tenant: "t", Class: "c"}, Rate: 0, Burst: 1, StaticRate: []float64{0}, StaticBurst: []float64{1}}}})
	if err == nil {
		t.Fatal("zero rate accepted")
	}
}

// TestStaticLeaseLapseCountsTheFloor: once a region's static lease has
// lapsed, invariant 2 counts its floor, so the other region may be granted
// the rest; a grant beyond that while the lease still holds is a violation.
func TestStaticLeaseLapseCountsTheFloor(t *testing.T) {
	o := twoRegions(t, func(s *Setup) {
		s.Keys[0].FloorRate, s.Keys[0].FloorBurst = []float64{10, 10}, []float64{20, 20}
	})
	o.StaticLease(sec, 1, 30*sec)
	// While b's lease holds, a may not go beyond 50.
	o.GrantApplied(10*sec, 0, 0, 90, 180, 15*sec)
	if o.res.Rates.Violations != 1 || o.res.Bursts.Violations != 1 {
		t.Fatalf("grant beyond the static share of a live lease: rate %d burst %d violations", o.res.Rates.Violations, o.res.Bursts.Violations)
	}
	// After it lapsed, b counts its floor: 90 + 10 fits.
	o.GrantApplied(31*sec, 0, 0, 90, 180, 40*sec)
	if o.res.Rates.Violations != 1 || o.res.Bursts.Violations != 1 {
		t.Fatalf("grant within the floor of a lapsed lease flagged: %+v", o.res.Rates)
	}
	// Conferred again: b's static share is back and 90 + 50 is too much.
	o.StaticLease(32*sec, 1, 60*sec)
	if o.res.Rates.Violations != 2 {
		t.Fatalf("a static lease conferred on top of the grant not flagged: %+v", o.res.Rates)
	}
	// A config change lowering b's static share to its floor (drained).
	o.StaticShares(33*sec, 1, 0, 10, 20, 10, 20)
	o.GrantApplied(34*sec, 0, 0, 90, 180, 50*sec)
	if o.res.Rates.Violations != 2 {
		t.Fatalf("grant within a drained region's floor flagged: %+v", o.res.Rates)
	}
}

// TestRecoveredMeasuresLeaveOutTheRecoveryWindows: admitted vs ideal and
// false rejects count only outside [change, change + recovery), and each
// change's recovery time is when admissions stay at the level.
func TestRecoveredMeasuresLeaveOutTheRecoveryWindows(t *testing.T) {
	o := twoRegions(t, func(s *Setup) {
		s.Duration = 60 * sec
		s.Changes = []Change{{At: 20 * sec, Label: "x"}}
		s.Recovery = 10 * sec
	})
	for i := 0; i < 60; i++ {
		at := time.Duration(i)*sec + sec/2
		o.Offered(at, 0, 0, 100, 1)
		switch {
		case i >= 20 && i < 27: // down for 7 s after the change
			o.Decided(at, 0, 0, 100, SourceDenied)
		case i >= 40 && i < 41: // one bad second, inside no recovery window
			o.Decided(at, 0, 0, 50, SourceLease)
			o.Decided(at, 0, 0, 50, SourceDenied)
		default:
			o.Decided(at, 0, 0, 100, SourceLease)
		}
	}
	r := o.Finish(60 * sec)
	rc := r.Recovered
	if rc.Seconds != 50 {
		t.Fatalf("measured %d s, want 50 (60 less the 10 s after the change)", rc.Seconds)
	}
	// 49 full seconds and one at half: the ideal bucket admits 100 every
	// second but the first (its burst covers more).
	if !(rc.VsIdeal <= 0.995 && rc.VsIdeal >= 0.985) {
		t.Fatalf("vs ideal %v, want about 0.99", rc.VsIdeal)
	}
	if !(rc.FalseRejects > 0 && rc.FalseRejects <= 0.011) {
		t.Fatalf("false rejects %v, want about 1%%", rc.FalseRejects)
	}
	// The outage ends at 27 s; the dip at 40 s is a 5 s window at 90%,
	// below 97%: recovered only once that window passed (45 s).
	if len(rc.Each) != 1 || rc.Each[0].Took != 25*sec {
		t.Fatalf("recovery times %+v, want 25s", rc.Each)
	}
}

// TestMeasuresStartAtTheEndOfWarmup: every measure after warmup starts
// where the warmup ends, not at the next minute mark: a 90 s run with a
// 30 s warmup has one whole 60 s window (30 s to 90 s), and the tokens and
// the comparison with the ideal bucket count from 30 s on.
func TestMeasuresStartAtTheEndOfWarmup(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Warmup = 30 * sec; s.Duration = 90 * sec })
	// 150 requests/s offered; Sluice admits 100/s during warmup and 90/s
	// after it.
	for i := 0; i < 90; i++ {
		at := time.Duration(i) * sec
		adm := int64(100)
		if at >= 30*sec {
			adm = 90
		}
		o.Offered(at, 0, 0, 150, 1)
		o.Decided(at, 0, 0, adm, SourceLease)
		o.Decided(at, 0, 0, 150-adm, SourceDenied)
	}
	r := o.Finish(90 * sec)
	if r.Windows60 != 1 || math.Abs(r.Util60sMin-0.9) > 1e-9 {
		t.Fatalf("60 s windows after a 30 s warmup: %d, worst %v; want 1 at 90%%", r.Windows60, r.Util60sMin)
	}
	if math.Abs(r.VsIdeal-0.9) > 1e-9 {
		t.Fatalf("admitted vs ideal after warmup %v, want 0.9", r.VsIdeal)
	}
	aw := r.AfterWarmup
	if aw.Offered != 60*150 || aw.Admitted != 60*90 || aw.Denied != 60*60 || aw.IdealAdmitted != 60*100 {
		t.Fatalf("tokens after warmup %+v, want offered 9000, admitted 5400, denied 3600, ideal 6000", aw)
	}
	if r.Offered != 90*150 {
		t.Fatalf("tokens over the whole run: offered %v, want 13500", r.Offered)
	}
}

// TestNoWindowAfterWarmupIsNaN: a run too short for a 60 s window after
// warmup has no 60 s measure and no comparison with the ideal bucket
// (NaN, not 0).
func TestNoWindowAfterWarmupIsNaN(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Warmup = 30 * sec; s.Duration = 80 * sec })
	r := o.Finish(80 * sec)
	if r.Windows60 != 0 || !math.IsNaN(r.Util60sMin) || !math.IsNaN(r.VsIdeal) {
		t.Fatalf("no traffic, no whole window: %d windows, worst %v, vs ideal %v", r.Windows60, r.Util60sMin, r.VsIdeal)
	}
}
