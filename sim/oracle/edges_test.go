package oracle

import (
	"math"
	"testing"
	"time"
)

// TestObservationBehindTheClockCheckedAtTheClock: an observation stamped
// before the oracle's clock (ties between sources) is checked at the
// clock's time; the clock never runs backwards.
func TestObservationBehindTheClockCheckedAtTheClock(t *testing.T) {
	o := twoRegions(t, nil)
	o.Advance(6 * sec)
	o.GrantApplied(5*sec, 0, 0, 70, 140, 20*sec)
	if r := o.Finish(10 * sec).Rates; r.Violations != 1 || r.FirstAt != 6*sec {
		t.Fatalf("rates %+v, want the violation at 6s", r)
	}
}

// TestStaticSharesMoveTheFloor: a config change moves the floor a region
// falls to once its static lease lapsed.
func TestStaticSharesMoveTheFloor(t *testing.T) {
	o := twoRegions(t, func(s *Setup) {
		s.Keys[0].FloorRate, s.Keys[0].FloorBurst = []float64{10, 10}, []float64{20, 20}
	})
	o.StaticLease(sec, 1, 2*sec)
	o.StaticShares(3*sec, 1, 0, 40, 80, 5, 10)
	o.GrantApplied(4*sec, 0, 0, 95, 190, 10*sec)
	if r := o.Finish(5 * sec); r.Rates.Violations != 0 || r.Bursts.Violations != 0 {
		t.Fatalf("grant within the new floor flagged: %+v %+v", r.Rates, r.Bursts)
	}
}

// TestMeasuresWithoutOffers: windows in which decisions came but nothing
// was offered do not enter utilization; with nothing offered the false
// reject and fairness figures are zero, not NaN.
func TestMeasuresWithoutOffers(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Duration = 2 * time.Minute })
	perSecond(o, 0, 60, 0, 100, 50)          // at r: no contention
	o.Decided(90*sec, 0, 0, 3, SourceDenied) // no offer recorded
	r := o.Finish(2 * time.Minute)
	if r.Util1sMean != 0.5 || r.Util1sMin != 0.5 || r.Util60sMean != 0.5 || r.Windows60 != 1 {
		t.Fatalf("utilization %v %v %v over %d minutes", r.Util1sMean, r.Util1sMin, r.Util60sMean, r.Windows60)
	}
	if r.Fairness[0] != 0 || r.Fairness[1] != 0 || r.FairnessWindows[0] != 0 {
		t.Fatalf("fairness without contention %v %v", r.Fairness, r.FairnessWindows)
	}
	o = twoRegions(t, func(s *Setup) { s.Duration = time.Minute })
	o.Decided(10*sec, 0, 0, 3, SourceDenied)
	if r := o.Finish(time.Minute); r.FalseRejects != 0 || !math.IsNaN(r.Util1sMean) {
		t.Fatalf("nothing offered: false rejects %v util %v", r.FalseRejects, r.Util1sMean)
	}
}

// TestMeasuresPerKeyAndRegion: false rejects and fairness are judged per
// key over each region's own demand, both regions denying at once.
func TestMeasuresPerKeyAndRegion(t *testing.T) {
	o := twoByTwo(t) // key v/c: rate 10
	offer := func(i, region int, off, adm int64) {
		at := time.Duration(i)*sec + sec/2
		o.Offered(at, region, 1, off, 1)
		o.Decided(at, region, 1, adm, SourceLease)
		o.Decided(at, region, 1, off-adm, SourceDenied)
	}
	for i := 0; i < 10; i++ {
		offer(i, 0, 3, 1)  // fair 3 (demand below the equal split): room 1 of 2 denied
		offer(i, 1, 12, 5) // fair 7: room 1
	}
	for i := 10; i < 20; i++ {
		offer(i, 0, 3, 3)
		offer(i, 1, 15, 4)
	}
	r := o.Finish(time.Minute)
	if math.Abs(r.FalseRejectTokens-40) > 1e-9 || math.Abs(r.FalseRejects-40.0/330) > 1e-12 {
		t.Fatalf("false rejects %v tokens, %v", r.FalseRejectTokens, r.FalseRejects)
	}
	// First 10 s: a admitted 10 of fair 30, b 50 of 70: 0.2 each. Next:
	// a 30 of 30, b 40 of 70: 0 and 0.3.
	if math.Abs(r.Fairness[0]-0.1) > 1e-12 || math.Abs(r.Fairness[1]-0.25) > 1e-12 || r.FairnessWindows[0] != 2 || r.FairnessWindows[1] != 2 {
		t.Fatalf("fairness %v over %v", r.Fairness, r.FairnessWindows)
	}
}

// TestConvergenceTargetsAndEdges: the target is the smaller of the fair
// share and the demand (the fair share may hand a region more than it
// wants); a shift already met counts as converged in 0 epochs; demand
// exactly at a static share within float rounding is no contention.
func TestConvergenceTargetsAndEdges(t *testing.T) {
	c := convergence(t, func(s *Setup) {
		s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{0, 60}}} // fair 20/80
	}, []grantAt{{11500 * time.Millisecond, 100 * sec, 1, 56}})
	if c.NotConverged != 0 || c.Each[0].Epochs != 2 {
		t.Fatalf("target above the demand: %+v", c)
	}
	c = convergence(t, func(s *Setup) {
		s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{0, 60}}}
	}, []grantAt{{5 * sec, 100 * sec, 1, 60}})
	if c.NotConverged != 0 || c.Each[0].Epochs != 0 || c.Max != 0 || c.Held != 1 {
		t.Fatalf("met at the shift: %+v", c)
	}
	rel := 1e-9 // at run time, as the oracle rounds it
	c = convergence(t, func(s *Setup) {
		s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{50 * (1 + rel), 0}}}
	}, nil)
	if c.Shifts != 0 {
		t.Fatalf("demand at the static share within rounding counted: %+v", c)
	}
}

// TestConvergenceDefaultTolerance: without a tolerance set, a region is
// allowed 5% of r under its target.
func TestConvergenceDefaultTolerance(t *testing.T) {
	for _, c := range []struct {
		rate      float64
		converged bool
	}{{5.001, true}, {4.999, false}} {
		o := twoRegions(t, func(s *Setup) {
			s.Duration, s.DemandAlpha, s.ConvergenceTolerance = time.Minute, 1e-12, 0
			s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{10, 90}}}
		})
		o.GrantApplied(11*sec, 0, 0, c.rate, 10, time.Hour)
		o.GrantApplied(11*sec, 1, 0, 95, 100, time.Hour)
		if conv := o.Finish(time.Minute).Convergence; (conv.NotConverged == 0) != c.converged {
			t.Fatalf("a at %v: %+v, want converged %v", c.rate, conv, c.converged)
		}
	}
}

// TestHoldingToleranceIsOneMicrotoken: the cap allows 1e-6 token of
// storage rounding, growth two of them.
func TestHoldingToleranceIsOneMicrotoken(t *testing.T) {
	for _, c := range []struct {
		name      string
		tokens    float64
		violation bool
	}{
		{"cap and a micro-token", 20.000001, false},
		{"cap and one and a half micro-tokens", 20.0000015, true},
	} {
		o := oneKey(t, 10, 20, nil)
		o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Tokens: c.tokens, Cap: 20})
		if got := o.Finish(2*sec).Holding.Violations != 0; got != c.violation {
			t.Fatalf("%s: violation %v", c.name, got)
		}
	}
	for _, c := range []struct {
		name      string
		tokens    float64
		violation bool
	}{
		{"growth and two micro-tokens", 10.000002, false},
		{"growth and two and a half micro-tokens", 10.0000025, true},
	} {
		o := oneKey(t, 10, 20, nil)
		o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Tokens: 5, Cap: 20})
		o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1.5e6, Tokens: c.tokens, Cap: 20})
		if got := o.Finish(2*sec).Holding.Violations != 0; got != c.violation {
			t.Fatalf("%s: violation %v", c.name, got)
		}
	}
}

// TestConvergenceHorizonIsThirtyEpochs: samples stop 30 epochs after a
// shift, so a lapse after them does not count against Held.
func TestConvergenceHorizonIsThirtyEpochs(t *testing.T) {
	for _, c := range []struct {
		expiry time.Duration
		held   float64
	}{{40*sec + sec/2, 1}, {39*sec + sec/2, 30.0 / 31}} {
		conv := convergence(t, func(s *Setup) {
			s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{0, 60}}}
		}, []grantAt{{5 * sec, c.expiry, 1, 60}})
		if conv.Held != c.held || conv.Each[0].Epochs != 0 {
			t.Fatalf("grant to %v: %+v, want held %v", c.expiry, conv, c.held)
		}
	}
}

// TestConvergenceMedianOverConvergedShifts: shifts that never converged
// are counted apart, not in the median or the maximum.
func TestConvergenceMedianOverConvergedShifts(t *testing.T) {
	c := convergence(t, func(s *Setup) {
		s.Shifts = []Shift{
			{At: 10 * sec, Key: 0, Demand: []float64{0, 60}},
			{At: 20 * sec, Key: 0, Demand: []float64{60, 0}},
			{At: 30 * sec, Key: 0, Demand: []float64{0, 90}},
		}
	}, []grantAt{
		{12500 * time.Millisecond, 20 * sec, 1, 60}, // first: 3 epochs
		{21500 * time.Millisecond, 30 * sec, 0, 60}, // second: 2
	})
	if c.Shifts != 3 || c.NotConverged != 1 || c.P50 != 3 || c.Max != 3 || c.FirstMiss != "t/c at 30s" {
		t.Fatalf("convergence %+v", c)
	}
}

// TestWarmupLeftOutOfShortWindows: seconds and 10 s windows before the
// warmup are not measured.
func TestWarmupLeftOutOfShortWindows(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Duration, s.Warmup = 30*sec, 10*sec })
	perSecond(o, 0, 10, 0, 150, 150)
	perSecond(o, 10, 30, 0, 150, 75)
	r := o.Finish(30 * sec)
	if r.Util1sMean != 0.75 || r.Util1sMin != 0.75 || r.FairnessWindows[0] != 2 || r.Fairness[0] != 0.25 {
		t.Fatalf("util %v %v fairness %v over %v", r.Util1sMean, r.Util1sMin, r.Fairness, r.FairnessWindows)
	}
}

// TestResultRecordsRunFacts: the run's end, faults and notes as given.
func TestResultRecordsRunFacts(t *testing.T) {
	o := twoRegions(t, nil)
	o.Fault(sec, 3*sec, "region-down a")
	o.Note(2*sec, "leader b")
	r := o.Finish(7 * sec)
	if r.Duration != 7*sec || len(r.Faults) != 1 || r.Faults[0] != (Fault{At: sec, Until: 3 * sec, Label: "region-down a"}) ||
		len(r.Notes) != 1 || r.Notes[0] != (Note{At: 2 * sec, Text: "leader b"}) {
		t.Fatalf("duration %v faults %v notes %v", r.Duration, r.Faults, r.Notes)
	}
}

// TestDefaultStepRoundsToTheNearestSecond: 6119 s / 720 = 8.499 s.
func TestDefaultStepRoundsToTheNearestSecond(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Duration = 6119 * sec })
	if r := o.Finish(sec); r.Series.Step != 8*sec {
		t.Fatalf("step %v", r.Series.Step)
	}
}
