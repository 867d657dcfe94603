package runner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/scenario"
	"github.com/sluicehq/sluice/sim/traffic"
	"github.com/sluicehq/sluice/sim/world"
)

// Options adjust a run.
type Options struct {
	// Seed overrides the scenario's seed when non-zero.
	Seed uint64
	// Duration overrides the scenario's duration when non-zero (faults
	// after it are dropped).
	Duration time.Duration
	// Skipped says why the mode playing the run does not play a fault
	// ("" when it does). What is not played is no change for the
	// recovered measures. Optional: virtual mode plays everything.
	Skipped func(scenario.Fault) string
}

// Outcome is one finished run.
type Outcome struct {
	Scenario *scenario.Scenario
	Seed     uint64
	Mode     string // "virtual" or "live"
	Result   *oracle.Result
	Checks   []Check
	Counters world.Counters
	// Instances and Tenants describe the deployment.
	Instances, Tenants int
	// Warnings say what makes the run's figures less trustworthy than its
	// checks read: in live mode, a machine that could not keep up with the
	// traffic plan (sim/live). None in virtual mode, whose clock waits for
	// the work.
	Warnings []string
	// Wall is how long the run took on the wall clock (never part of the
	// summary, which must be reproducible).
	Wall time.Duration
}

// Check is one judged line of the summary.
type Check struct {
	Name      string
	Value     string
	Target    string
	Pass      bool
	Invariant bool
	// NoData says the run gave the check nothing to judge (no full 60 s
	// window after warmup, no crash, no sample): it reads n/a, neither
	// passes nor fails, and does not fail the run.
	NoData bool
}

// Result is the check's verdict: "PASS", "FAIL" or "n/a".
func (c Check) Result() string {
	switch {
	case c.NoData:
		return "n/a"
	case c.Pass:
		return "PASS"
	}
	return "FAIL"
}

// Failed says whether the check failed (a check without data did not).
func (c Check) Failed() bool { return !c.NoData && !c.Pass }

// InvariantsHold reports whether no invariant check failed.
func (o *Outcome) InvariantsHold() bool {
	for _, c := range o.Checks {
		if c.Invariant && c.Failed() {
			return false
		}
	}
	return true
}

// Pass reports whether no check failed.
func (o *Outcome) Pass() bool {
	for _, c := range o.Checks {
		if c.Failed() {
			return false
		}
	}
	return true
}

// Prepare applies the options to a scenario.
func Prepare(sc *scenario.Scenario, opts Options) (*scenario.Scenario, uint64, error) {
	seed := sc.Seed
	if opts.Seed != 0 {
		seed = opts.Seed
	}
	if opts.Duration > 0 && opts.Duration != time.Duration(sc.Duration) {
		var err error
		if sc, err = sc.WithDuration(opts.Duration); err != nil {
			return nil, 0, err
		}
	}
	return sc, seed, nil
}

// ErrInterrupted is RunContext's error when its context ended first.
var ErrInterrupted = errors.New("run interrupted")

// Run simulates sc in virtual time.
func Run(sc *scenario.Scenario, opts Options) (*Outcome, error) {
	return RunContext(context.Background(), sc, opts)
}

// RunContext is Run, stopped when ctx ends (a Ctrl-C): it then returns
// ErrInterrupted and no outcome, since a partial run's measures would
// read as the scenario's.
func RunContext(ctx context.Context, sc *scenario.Scenario, opts Options) (*Outcome, error) {
	start := time.Now()
	s, err := NewSetup(sc, opts)
	if err != nil {
		return nil, err
	}
	w, err := world.New(s.Scenario, s.Seed, s.Oracle, s.Plan)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, w.Stop)
	counters := w.Run()
	stop()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%w after %v of %v simulated: %w", ErrInterrupted, w.Elapsed(), time.Duration(s.Scenario.Duration), context.Cause(ctx))
	}
	out := s.Outcome("virtual", s.Oracle.Finish(time.Duration(s.Scenario.Duration)))
	out.Counters = counters
	if counters.InvalidDecisions > 0 || counters.AllocatorErrors > 0 {
		out.Checks = append(out.Checks, Check{Name: "simulator sanity", Target: "0 errors",
			Value: fmt.Sprintf("%d invalid decisions, %d allocator errors", counters.InvalidDecisions, counters.AllocatorErrors)})
	}
	out.CheckReplays()
	out.Wall = time.Since(start)
	return out, nil
}

// CheckReplays adds the failed check of invariant 5 when some region
// report delivered again was answered differently (Counters).
func (out *Outcome) CheckReplays() {
	if c := out.Counters; c.ReplayMismatches > 0 {
		out.Checks = append(out.Checks, Check{Name: "5 region report retries", Target: "0", Invariant: true,
			Value: fmt.Sprintf("%d of %d replays answered differently", c.ReplayMismatches, c.Replays)})
	}
}

// Instances is the initial instance count of a scenario.
func Instances(sc *scenario.Scenario) int {
	n := 0
	for _, r := range sc.Topology.Regions {
		n += r.Instances
	}
	return n
}

// Tenants is the number of distinct tenants a plan drives.
func Tenants(p *traffic.Plan) int {
	seen := map[string]bool{}
	for _, k := range p.Keys {
		seen[k.Tenant] = true
	}
	return len(seen)
}

// unchecked says a per-region check saw no sample.
func unchecked(c oracle.RegionCheck) bool { return c.Checks == 0 && c.Violations == 0 }

// noData is pct(v), or "n/a (why)" when v is NaN.
func noData(v float64, why string) string {
	if math.IsNaN(v) {
		return "n/a (" + why + ")"
	}
	return pct(v)
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f%%", 100*v)
}

// Evaluate judges a result against the invariants (always) and the
// scenario's targets (those it sets).
func Evaluate(sc *scenario.Scenario, r *oracle.Result) []Check {
	e := sc.Expect
	limit := func(p *int) int {
		if p == nil {
			return 0
		}
		return *p
	}
	c1, c2, c3 := limit(e.ConformanceViolationsMax), limit(e.RateViolationsMax), limit(e.BurstViolationsMax)
	conf := r.Conformance
	v1 := fmt.Sprintf("%d violations in %d batches; max excess %.3f tokens; ε %.0f tokens (%d keys)",
		conf.Violations, conf.Checks, conf.MaxExcess, conf.CrashError, conf.CrashKeys)
	if conf.Violations > 0 {
		v1 += fmt.Sprintf("; first %s at %v", conf.FirstKey, conf.FirstAt.Round(time.Millisecond))
	}
	sum := func(s oracle.SumCheck) string {
		v := fmt.Sprintf("%d violations in %d checks; max Σ/limit %.6f", s.Violations, s.Checks, s.MaxRatio)
		if s.Violations > 0 {
			v += fmt.Sprintf("; first %s at %v (%.4f > %.4f: %s)", s.FirstKey, s.FirstAt.Round(time.Millisecond), s.FirstSum, s.FirstLimit, s.FirstParts)
		}
		return v
	}
	if conf.ClosedAdmitted > 0 {
		v1 += fmt.Sprintf("; %.0f tokens of classes failing closed admitted in degraded mode", conf.ClosedAdmitted)
	}
	region := func(c oracle.RegionCheck) string {
		if c.Checks == 0 && c.Violations == 0 {
			return "n/a (nothing checked)"
		}
		v := fmt.Sprintf("%d violations in %d checks", c.Violations, c.Checks)
		if c.Violations > 0 {
			v += fmt.Sprintf("; first %s in %s at %v: %s", c.FirstKey, c.FirstRegion, c.FirstAt.Round(time.Millisecond), c.FirstDetail)
		}
		return v
	}
	checks := []Check{
		{Name: "1 conformance (GCRA, every key)", Value: v1, Target: fmt.Sprintf("<= %d", c1), Pass: conf.Violations <= c1, Invariant: true},
		{Name: "2 Σ regional rates <= r", Value: sum(r.Rates), Target: fmt.Sprintf("<= %d", c2), Pass: r.Rates.Violations <= c2, Invariant: true},
		{Name: "3 Σ regional caps <= b", Value: sum(r.Bursts), Target: fmt.Sprintf("<= %d", c3), Pass: r.Bursts.Violations <= c3, Invariant: true},
		{Name: "3 each region holds <= its cap", Value: region(r.Holding), Target: "<= 0", Pass: r.Holding.Violations == 0, Invariant: true, NoData: unchecked(r.Holding)},
		{Name: "5 exactly-once counters", Value: region(r.Books), Target: "<= 0", Pass: r.Books.Violations == 0, Invariant: true, NoData: unchecked(r.Books)},
		{Name: "2 grants applied in order", Value: region(r.GrantOrder), Target: "<= 0", Pass: r.GrantOrder.Violations == 0, Invariant: true, NoData: unchecked(r.GrantOrder)},
	}
	if conf.Checks == 0 && conf.Violations == 0 {
		checks[0].Value, checks[0].NoData = "n/a (nothing admitted)", true
	}
	for i, s := range []oracle.SumCheck{r.Rates, r.Bursts} {
		if s.Checks == 0 && s.Violations == 0 {
			checks[1+i].Value, checks[1+i].NoData = "n/a (nothing checked)", true
		}
	}
	if p := e.Utilization60sMin; p != nil {
		c := Check{Name: "utilization, worst 60 s window", Value: pct(r.Util60sMin),
			Target: ">= " + pct(*p), Pass: r.Util60sMin >= *p}
		if r.Windows60 == 0 {
			c.Value, c.NoData = "n/a (no full window after warmup)", true
		}
		checks = append(checks, c)
	}
	if p := e.Utilization1sMeanMin; p != nil {
		checks = append(checks, Check{Name: "utilization, mean of 1 s windows", Value: noData(r.Util1sMean, "no full window after warmup"),
			Target: ">= " + pct(*p), Pass: r.Util1sMean >= *p, NoData: math.IsNaN(r.Util1sMean)})
	}
	if p := e.ConvergenceEpochsMax; p != nil {
		// A shift superseded by the key's next one (or cut by the run's
		// end) before it converged and before *p epochs says nothing
		// about the target; one watched longer than *p is a miss.
		cv := r.Convergence
		missed := cv.Missed(*p)
		v := cv.String()
		noData := cv.Converged() == 0 && missed == 0
		if cv.Shifts == 0 {
			v = "n/a (no shift of a contended key after warmup)"
		} else if noData {
			v = "n/a (" + v + ")"
		}
		checks = append(checks, Check{Name: "convergence after demand shifts", Value: v,
			Target: fmt.Sprintf("<= %.0f epochs", *p), Pass: !noData && missed == 0 && cv.Max <= *p, NoData: noData})
	}
	if p := e.FalseRejectsMax; p != nil {
		c := Check{Name: "false rejects (share of offered)", Value: pct(r.FalseRejects),
			Target: "<= " + pct(*p), Pass: r.FalseRejects <= *p}
		if r.AfterWarmup.Offered == 0 {
			// A share of nothing: no data, not a pass.
			c.Value, c.NoData = "n/a (nothing offered after warmup)", true
		}
		checks = append(checks, c)
	}
	if p := e.RecoveredVsIdealMin; p != nil {
		rc := r.Recovered
		c := Check{Name: "admitted vs ideal, recovered", Value: fmt.Sprintf("%s over %d s (%v after each change left out)", pct(rc.VsIdeal), rc.Seconds, rc.Recovery),
			Target: ">= " + pct(*p), Pass: rc.Seconds > 0 && rc.VsIdeal >= *p}
		if rc.Seconds == 0 || math.IsNaN(rc.VsIdeal) {
			c.Value, c.NoData = fmt.Sprintf("n/a (no second after warmup outside the %v after each change)", rc.Recovery), true
		}
		checks = append(checks, c)
	}
	if p := e.RecoveredFalseRejectsMax; p != nil {
		rc := r.Recovered
		c := Check{Name: "false rejects, recovered", Value: fmt.Sprintf("%s of offered over %d s", pct(rc.FalseRejects), rc.Seconds),
			Target: "<= " + pct(*p), Pass: rc.Seconds > 0 && rc.FalseRejects <= *p}
		if rc.Seconds == 0 {
			c.Value, c.NoData = fmt.Sprintf("n/a (no second after warmup outside the %v after each change)", rc.Recovery), true
		}
		checks = append(checks, c)
	}
	if p := e.FairnessErrorMax; p != nil {
		worst, windows := 0.0, 0
		for i, f := range r.Fairness {
			worst = math.Max(worst, f)
			windows += r.FairnessWindows[i]
		}
		c := Check{Name: "fairness error, worst region", Value: pct(worst),
			Target: "<= " + pct(*p), Pass: worst <= *p}
		if windows == 0 {
			c.Value, c.NoData = "n/a (no contended 10 s window after warmup)", true
		}
		checks = append(checks, c)
	}
	if d := time.Duration(e.ReclaimMax); d > 0 {
		rc := r.Reclaim
		c := Check{Name: "reclaim after instance crash", Value: fmt.Sprintf("max %v over %d crashes", rc.Max.Round(time.Millisecond), rc.Crashes),
			Target: fmt.Sprintf("<= %v", d), Pass: rc.Crashes > 0 && rc.Max <= d}
		if rc.Crashes == 0 {
			c.Value, c.NoData = "n/a (no crash)", true
		}
		checks = append(checks, c)
	}
	if p := e.CrashErrorMax; p != nil {
		share := 0.0
		if r.Admitted > 0 {
			share = r.Conformance.CrashError / r.Admitted
		}
		checks = append(checks, Check{Name: "crash error ε (share of admitted)", Value: pct(share),
			Target: "<= " + pct(*p), Pass: share <= *p})
	}
	return checks
}
