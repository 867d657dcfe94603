package oracle

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestIdealBucketAdmitsWholeRequests: the reference bucket refills at r
// up to b since its last arrival and admits whole requests while it holds
// their cost (a nanotoken short of a cost still admits).
func TestIdealBucketAdmitsWholeRequests(t *testing.T) {
	o := oneKey(t, 100, 200, nil)
	o.Offered(0, 0, 0, 300, 1)                     // 200, the burst
	o.Offered(sec/2, 0, 0, 100, 1)                 // 50 refilled
	o.Offered(sec/2, 0, 0, 10, 3)                  // empty
	o.Offered(sec, 0, 0, 10, 3)                    // 50 held: 10 requests
	o.Offered(1200*time.Millisecond, 0, 0, 100, 1) // 20 + 20
	o.Offered(100*sec, 0, 0, 1000, 1)              // the burst again, not more
	o.Offered(101*sec, 0, 0, 100, 3)               // 100 held: 33 requests
	r := o.Finish(102 * sec)
	if r.IdealAdmitted != 200+50+30+40+200+99 || r.Offered != 300+100+30+30+100+1000+300 {
		t.Fatalf("ideal admitted %v of %v", r.IdealAdmitted, r.Offered)
	}
	for _, c := range []struct {
		burst float64
		want  float64
	}{{2.9999999985, 2}, {2.9999999995, 3}} {
		o := oneKey(t, 1, c.burst, nil)
		o.Offered(0, 0, 0, 5, 1)
		if r := o.Finish(sec); r.IdealAdmitted != c.want {
			t.Fatalf("burst %v: ideal admitted %v, want %v", c.burst, r.IdealAdmitted, c.want)
		}
	}
}

// perSecond offers and decides for key 0 in each second i of [from, to)
// at i + 0.5 s.
func perSecond(o *Oracle, from, to, region int, offered, admitted int64) {
	for i := from; i < to; i++ {
		at := time.Duration(i)*sec + sec/2
		o.Offered(at, region, 0, offered, 1)
		if admitted > 0 {
			o.Decided(at, region, 0, admitted, SourceLease)
		}
		if offered > admitted {
			o.Decided(at, region, 0, offered-admitted, SourceDenied)
		}
	}
}

// TestFalseRejectsAndOneSecondUtilization: tokens denied in a second in
// which the region admitted less than its fair share minus one token are
// false, up to that room; utilization per second is admitted over
// min(offered, r).
func TestFalseRejectsAndOneSecondUtilization(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Duration = 10 * sec })
	perSecond(o, 0, 1, 0, 120, 50)  // fair share 100: room 49 of 70 denied
	perSecond(o, 1, 2, 0, 120, 99)  // room 0
	perSecond(o, 2, 10, 0, 120, 80) // room 19 of 40
	r := o.Finish(10 * sec)
	if r.FalseRejectTokens != 49+8*19 || math.Abs(r.FalseRejects-float64(49+8*19)/1200) > 1e-15 {
		t.Fatalf("false rejects %v tokens, %v", r.FalseRejectTokens, r.FalseRejects)
	}
	if math.Abs(r.Util1sMean-(0.5+0.99+8*0.8)/10) > 1e-12 || r.Util1sMin != 0.5 {
		t.Fatalf("1 s utilization mean %v min %v", r.Util1sMean, r.Util1sMin)
	}
	if r.Windows60 != 0 || !math.IsNaN(r.Util60sMean) || !math.IsNaN(r.Util60sMin) {
		t.Fatalf("no whole minute measured: %d windows, %v %v", r.Windows60, r.Util60sMean, r.Util60sMin)
	}
	// Admitted against the ideal bucket counts every whole second after
	// warmup, whole minute or not.
	if r.VsIdeal != r.AfterWarmup.Admitted/r.AfterWarmup.IdealAdmitted || r.AfterWarmup.Admitted != 50+99+8*80 {
		t.Fatalf("vs ideal %v, tokens after warmup %+v", r.VsIdeal, r.AfterWarmup)
	}
}

// TestMinuteWindowsMeasured: the minutes measured start at the first whole
// second after the warmup, one after the other, and must end by the run's
// end; admitted against the ideal bucket counts every whole second from
// that one on.
func TestMinuteWindowsMeasured(t *testing.T) {
	for _, c := range []struct {
		name             string
		warmup, duration time.Duration
		windows          int
		mean, min, vs    float64
	}{
		{"both minutes after the warmup", time.Minute, 3 * time.Minute, 2, 0.75, 0.5, 0.75},
		// 61 s to 121 s: 59 seconds at 100, one at 50; the seconds to the
		// end admit 59·100 + 60·50 of the ideal 119·100.
		{"warmup a nanosecond into the second minute", time.Minute + 1, 3 * time.Minute, 1, 5950.0 / 6000, 5950.0 / 6000, 8900.0 / 11900},
		{"run ends a second before the last minute", time.Minute, 3*time.Minute - sec, 1, 1, 1, 8950.0 / 11900},
		{"warmup half a minute", 30 * sec, 3 * time.Minute, 2, (1 + 0.75) / 2, 0.75, (90*100 + 60*50) / 15000.0},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := twoRegions(t, func(s *Setup) { s.Warmup, s.Duration = c.warmup, c.duration })
			perSecond(o, 0, 120, 0, 150, 100)
			perSecond(o, 120, 180, 0, 150, 50)
			r := o.Finish(3 * time.Minute)
			if r.Windows60 != c.windows || math.Abs(r.Util60sMean-c.mean) > 1e-12 || r.Util60sMin != c.min ||
				math.Abs(r.VsIdeal-c.vs) > 1e-12 || r.IdealUtil60sMean != 1 {
				t.Fatalf("%d windows, mean %v min %v vs ideal %v ideal util %v", r.Windows60, r.Util60sMean, r.Util60sMin, r.VsIdeal, r.IdealUtil60sMean)
			}
		})
	}
	// The ideal bucket's first minute holds its burst on top of the rate:
	// its line is capped at 1, and Sluice admitting the rate is compared
	// with all it admitted.
	o := twoRegions(t, func(s *Setup) { s.Duration = time.Minute })
	perSecond(o, 0, 60, 0, 150, 100)
	if r := o.Finish(time.Minute); r.IdealUtil60sMean != 1 || r.Util60sMean != 1 || r.VsIdeal != 6000.0/6100 {
		t.Fatalf("ideal util %v util %v vs ideal %v", r.IdealUtil60sMean, r.Util60sMean, r.VsIdeal)
	}
}

// TestFairnessError: per region, the mean over contended 10 s windows (a
// key offered more than r·10 s) of |admitted − fair share| / (r·10 s);
// a region that offered nothing in a window is not judged in it.
func TestFairnessError(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Duration = 40 * sec })
	perSecond(o, 0, 10, 0, 100, 70) // fair 50/50
	perSecond(o, 0, 10, 1, 100, 30)
	perSecond(o, 10, 20, 0, 60, 60) // exactly r: not contended
	perSecond(o, 10, 20, 1, 40, 10)
	perSecond(o, 20, 30, 0, 150, 90) // b offers nothing: a's fair share is r
	r := o.Finish(40 * sec)
	if len(r.Fairness) != 2 || math.Abs(r.Fairness[0]-0.15) > 1e-12 || math.Abs(r.Fairness[1]-0.2) > 1e-12 ||
		r.FairnessWindows[0] != 2 || r.FairnessWindows[1] != 1 {
		t.Fatalf("fairness %v over %v windows", r.Fairness, r.FairnessWindows)
	}
}

// TestFairnessJudgesARegionThatOfferedOneToken: a region is judged in a
// contended window as soon as it offered anything, a single token too
// (demands 150/s and 0.1/s: fair shares 99.9 and 0.1).
func TestFairnessJudgesARegionThatOfferedOneToken(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Duration = 20 * sec })
	perSecond(o, 0, 10, 0, 150, 100)
	o.Offered(5*sec, 1, 0, 1, 1)
	o.Decided(5*sec, 1, 0, 1, SourceDenied)
	r := o.Finish(20 * sec)
	if math.Abs(r.Fairness[0]-0.001) > 1e-12 || math.Abs(r.Fairness[1]-0.001) > 1e-12 ||
		r.FairnessWindows[0] != 1 || r.FairnessWindows[1] != 1 {
		t.Fatalf("fairness %v over %v windows, want 0.001 each over one", r.Fairness, r.FairnessWindows)
	}
}

// TestOneTokenDeniedIsAFalseReject: a second with a single token offered
// and denied, below the region's fair share (50.5/s: its demand of 1/s
// and half the spare rate), has a false reject of the whole offer, in
// the run's measure and the recovered one; admitted against the ideal
// bucket, which admitted it, is 0.
func TestOneTokenDeniedIsAFalseReject(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Duration = 10 * sec })
	perSecond(o, 5, 6, 0, 1, 0)
	r := o.Finish(10 * sec)
	if r.FalseRejectTokens != 1 || r.FalseRejects != 1 || r.Recovered.FalseRejects != 1 {
		t.Fatalf("false rejects %v tokens, %v of offered, %v recovered: want 1 of 1", r.FalseRejectTokens, r.FalseRejects, r.Recovered.FalseRejects)
	}
	if r.VsIdeal != 0 || r.Recovered.VsIdeal != 0 {
		t.Fatalf("vs ideal %v, recovered %v: want 0", r.VsIdeal, r.Recovered.VsIdeal)
	}
}

// TestVsIdealWithoutIdealAdmissionsIsNaN: admissions counted in seconds
// in which the ideal bucket admitted nothing (their requests arrived
// during the warmup) leave the ratios without a denominator: NaN, which
// a target reads as n/a, not an infinite ratio that passes any minimum.
func TestVsIdealWithoutIdealAdmissionsIsNaN(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Duration, s.Warmup = time.Minute, 10*sec })
	o.Offered(9*sec+sec/2, 0, 0, 50, 1)
	o.Decided(10*sec+sec/2, 0, 0, 50, SourceLease)
	r := o.Finish(time.Minute)
	if r.AfterWarmup.Admitted != 50 || !math.IsNaN(r.VsIdeal) || r.Recovered.Seconds != 50 || !math.IsNaN(r.Recovered.VsIdeal) {
		t.Fatalf("admitted %v after warmup: vs ideal %v, recovered %v over %d s; want NaN over 50 s",
			r.AfterWarmup.Admitted, r.VsIdeal, r.Recovered.VsIdeal, r.Recovered.Seconds)
	}
}

// TestMinuteIdealLineCountsOnlyWhatTheIdealBucketAdmitted: a burst of
// 1000 at once over a minute's 6000 of rate lets the ideal bucket admit
// its burst of 200: its line is 0.2 and Sluice's 0.15, whatever was
// denied.
func TestMinuteIdealLineCountsOnlyWhatTheIdealBucketAdmitted(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Duration = time.Minute })
	perSecond(o, 0, 1, 0, 1000, 150)
	r := o.Finish(time.Minute)
	if r.Windows60 != 1 || r.IdealUtil60sMean != 0.2 || r.Util60sMean != 0.15 {
		t.Fatalf("%d windows, ideal %v, utilization %v: want one, 0.2 and 0.15", r.Windows60, r.IdealUtil60sMean, r.Util60sMean)
	}
}

type grantAt struct {
	at, expiry time.Duration
	region     int
	rate       float64
}

func convergence(t *testing.T, mod func(s *Setup), grants []grantAt) Convergence {
	t.Helper()
	o := twoRegions(t, func(s *Setup) {
		s.Duration = time.Minute
		s.DemandAlpha = 1e-9 // no noise: the tolerance is 5% of r
		mod(s)
	})
	for _, g := range grants {
		o.GrantApplied(g.at, g.region, 0, g.rate, 2*g.rate, g.expiry)
	}
	return o.Finish(time.Minute).Convergence
}

// TestConvergenceEpochsAndHeld: epochs from a shift to the first sample
// with every region at least min(fair share, demand) − tolerance; the
// share of later samples still there is Held.
func TestConvergenceEpochsAndHeld(t *testing.T) {
	c := convergence(t, func(s *Setup) {
		s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{10, 90}}, {At: 40 * sec, Key: 0, Demand: []float64{90, 10}}}
	}, []grantAt{
		{12500 * time.Millisecond, 15500 * time.Millisecond, 1, 85}, // exactly 90 − 5
		{17500 * time.Millisecond, 100 * sec, 1, 85},
		{41500 * time.Millisecond, 100 * sec, 0, 90},
	})
	// First shift: converged at 13 s (3), out at 16 and 17 s, 28 samples
	// from 13 s to 40 s. Second: at 42 s (2), 19 samples to 60 s.
	if c.Shifts != 2 || c.NotConverged != 0 || c.Max != 3 || c.P50 != 3 || math.Abs(c.Held-45.0/47) > 1e-12 || c.FirstMiss != "" {
		t.Fatalf("convergence %+v", c)
	}
	if len(c.Each) != 2 || c.Each[0] != (ShiftOutcome{Key: "t/c", At: 10 * sec, Epochs: 3, Watched: 30}) || c.Each[1] != (ShiftOutcome{Key: "t/c", At: 40 * sec, Epochs: 2, Watched: 20}) {
		t.Fatalf("each %+v", c.Each)
	}
	// A hair below the tolerance is not converged.
	c = convergence(t, func(s *Setup) {
		s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{10, 90}}}
	}, []grantAt{{12500 * time.Millisecond, 100 * sec, 1, 84.999}})
	if c.Shifts != 1 || c.NotConverged != 1 || c.FirstMiss != "t/c at 10s" || c.Held != 0 || c.Each[0].Epochs != -1 {
		t.Fatalf("not converged: %+v", c)
	}
}

// TestConvergenceCutShortIsNoMiss: a shift that has not converged when
// the key's next shift comes, or the run ends, before the horizon is
// superseded or unfinished, not "not converged within the horizon"; the
// horizon is the configured one; a target of fewer epochs than were
// watched is missed all the same.
func TestConvergenceCutShortIsNoMiss(t *testing.T) {
	never := []grantAt{{11 * sec, 100 * sec, 1, 50}} // b stays at 50, under 90 − 5
	for _, c := range []struct {
		name                                   string
		horizon                                int
		shifts                                 []Shift
		notConv, superseded, unfinished        int
		watched                                []int
		text                                   string
		missedWithin2, missedWithin3, missed40 int
	}{
		{"next shift after 2.5 epochs", 0,
			[]Shift{{At: 40 * sec, Demand: []float64{10, 90}}, {At: 42500 * time.Millisecond, Demand: []float64{10, 90}}},
			0, 1, 1, []int{2, 17}, "none of 2 shifts converged; 1 superseded by the key's next shift before converging; 1 still converging when the run ended", 2, 1, 0},
		{"the default horizon", 0, []Shift{{At: 10 * sec, Demand: []float64{10, 90}}},
			1, 0, 0, []int{30}, "none of 1 shifts converged; 1 not converged within 30 epochs (first t/c at 10s)", 1, 1, 0},
		{"a configured horizon", 40, []Shift{{At: 10 * sec, Demand: []float64{10, 90}}},
			1, 0, 0, []int{40}, "none of 1 shifts converged; 1 not converged within 40 epochs (first t/c at 10s)", 1, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cv := convergence(t, func(s *Setup) { s.Shifts, s.ConvergenceHorizon = c.shifts, c.horizon }, never)
			if cv.NotConverged != c.notConv || cv.Superseded != c.superseded || cv.Unfinished != c.unfinished || cv.Converged() != 0 {
				t.Fatalf("convergence %+v", cv)
			}
			for i, w := range c.watched {
				if cv.Each[i].Watched != w || cv.Each[i].Epochs != -1 {
					t.Fatalf("shift %d: %+v, want %d epochs watched", i, cv.Each[i], w)
				}
			}
			if got := cv.String(); got != c.text {
				t.Fatalf("text %q, want %q", got, c.text)
			}
			if m := []int{cv.Missed(2), cv.Missed(3), cv.Missed(40)}; m[0] != c.missedWithin2 || m[1] != c.missedWithin3 || m[2] != c.missed40 {
				t.Fatalf("missed within 2, 3, 40 epochs: %v", m)
			}
		})
	}
}

// TestConvergenceShiftsMeasured: only shifts of a contended key (demand
// above a static share), after the warmup, with at least two epochs before
// the run's end or the key's next shift are measured.
func TestConvergenceShiftsMeasured(t *testing.T) {
	for _, c := range []struct {
		name   string
		warmup time.Duration
		shifts []Shift
		want   int
	}{
		{"demand at the static shares", 0, []Shift{{At: 10 * sec, Demand: []float64{50, 50}}}, 0},
		{"demand just above a static share", 0, []Shift{{At: 10 * sec, Demand: []float64{0, 50.00001}}}, 1},
		{"before the warmup", 10*sec + 1, []Shift{{At: 10 * sec, Demand: []float64{0, 90}}}, 0},
		{"at the warmup", 10 * sec, []Shift{{At: 10 * sec, Demand: []float64{0, 90}}}, 1},
		{"two epochs before the end", 0, []Shift{{At: 58 * sec, Demand: []float64{0, 90}}}, 1},
		{"less than two epochs before the end", 0, []Shift{{At: 58*sec + 1, Demand: []float64{0, 90}}}, 0},
		{"the key's next shift within two epochs", 0, []Shift{{At: 10 * sec, Demand: []float64{0, 90}}, {At: 11 * sec, Demand: []float64{90, 0}}}, 1},
		{"the key's next shift two epochs later", 0, []Shift{{At: 10 * sec, Demand: []float64{0, 90}}, {At: 12 * sec, Demand: []float64{90, 0}}}, 2},
		{"another key's shift does not bound it", 0, []Shift{{At: 10 * sec, Demand: []float64{0, 90}}, {At: 11 * sec, Key: 1, Demand: []float64{9, 0}}}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := twoRegions(t, func(s *Setup) {
				s.Duration, s.Warmup, s.Shifts = time.Minute, c.warmup, c.shifts
				s.Keys = append(s.Keys, Key{Key: quota.Key{Tenant: "v", Class: "c"}, Rate: 10, Burst: 20,
					StaticRate: []float64{5, 5}, StaticBurst: []float64{10, 10}})
			})
			if got := o.Finish(time.Minute).Convergence.Shifts; got != c.want {
				t.Fatalf("%d shifts measured, want %d", got, c.want)
			}
		})
	}
}

// TestConvergenceToleranceAllowsEstimateNoise: a key whose demand reading
// is noisy is allowed three standard deviations of the allocator's EWMA
// estimate, 3·sqrt(α/(2−α)·d/epoch), when that exceeds the fraction of r.
func TestConvergenceToleranceAllowsEstimateNoise(t *testing.T) {
	for _, c := range []struct {
		alpha, tolerance float64
		epoch            time.Duration
		rate             float64
		converged        bool
	}{
		{1, 0.05, sec, 90 - 3*math.Sqrt(90) + 0.001, true},
		{1, 0.05, sec, 90 - 3*math.Sqrt(90) - 0.001, false},
		{0.5, 0.05, sec, 90 - 3*math.Sqrt(30) + 0.001, true},
		{0.5, 0.05, sec, 90 - 3*math.Sqrt(30) - 0.001, false},
		{1, 0.05, 4 * sec, 90 - 3*math.Sqrt(90.0/4) + 0.001, true},
		{1, 0.05, 4 * sec, 90 - 3*math.Sqrt(90.0/4) - 0.001, false},
		{1, 0.3, sec, 60.001, true}, // the fraction of r is the larger
		{1, 0.3, sec, 59.999, false},
		{0, 0, sec, 90 - 3*math.Sqrt(90) + 0.001, true}, // defaults: α 1, 5%
		{0, 0, sec, 90 - 3*math.Sqrt(90) - 0.001, false},
	} {
		o := twoRegions(t, func(s *Setup) {
			s.Duration, s.Epoch, s.DemandAlpha, s.ConvergenceTolerance = time.Minute, c.epoch, c.alpha, c.tolerance
			s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{10, 90}}}
		})
		o.GrantApplied(11*sec, 1, 0, c.rate, 100, time.Hour)
		conv := o.Finish(time.Minute).Convergence
		if got := conv.Converged() == 1; got != c.converged || conv.Shifts != 1 {
			t.Fatalf("α %v tolerance %v epoch %v, b at %v: converged %v, want %v (%+v)", c.alpha, c.tolerance, c.epoch, c.rate, got, c.converged, conv)
		}
	}
	// A default tolerance of 5%: region a's target 10 with no noise.
	o := twoRegions(t, func(s *Setup) {
		s.Duration, s.DemandAlpha = time.Minute, 1e-12
		s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{10, 90}}}
	})
	o.GrantApplied(11*sec, 0, 0, 4.999, 10, time.Hour)
	o.GrantApplied(11*sec, 1, 0, 95, 100, time.Hour)
	if conv := o.Finish(time.Minute).Convergence; conv.NotConverged != 1 {
		t.Fatalf("a region under its target by more than 5%% of r counted as converged: %+v", conv)
	}
}
