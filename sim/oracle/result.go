package oracle

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// Result is everything the oracle found in one run.
type Result struct {
	Duration time.Duration
	Regions  []string
	Keys     int

	Conformance Conformance
	Rates       SumCheck // invariant 2
	Bursts      SumCheck // invariant 3
	// Holding checks every region's bucket after every script call: what
	// it holds (tokens + unspent leased tokens) within its cap, and grown
	// since the last call by no more than its refill.
	Holding RegionCheck
	// Books checks exactly-once accounting: a bucket's admitted and
	// denied counters never exceed what the instances decided.
	Books RegionCheck
	// GrantOrder counts grants a region's Redis applied although it had
	// applied one issued later.
	GrantOrder RegionCheck

	// Tokens.
	Offered, Admitted, Denied float64
	Strict, Degraded, Shadow  float64
	Unserved                  float64
	IdealAdmitted             float64
	GrantsApplied             int64
	// GrantsSent is the grants the global tier's answers carried, applied
	// or not: a region drops an answer that comes after its report's
	// deadline or after it lost its leadership, and a global leader in
	// learning mode re-issues only what the regions hold, so a run whose
	// global tier never led long enough sends none.
	GrantsSent int64
	// AfterWarmup are the same tokens counted from the end of warmup on.
	AfterWarmup Tokens

	// Utilization (after warmup).
	Util1sMean, Util1sMin   float64
	Util60sMean, Util60sMin float64
	IdealUtil60sMean        float64
	Windows60               int
	// VsIdeal is admitted / admitted by the ideal centralized bucket over
	// every whole second after warmup (NaN when the ideal bucket admitted
	// nothing there).
	VsIdeal float64

	// FalseRejects is a fraction of offered tokens (after warmup).
	FalseRejects      float64
	FalseRejectTokens float64
	// Fairness is the mean weighted max-min fairness error per region
	// (fraction of the key's rate), over contended 10 s windows.
	Fairness        []float64
	FairnessWindows []int

	Convergence Convergence
	Reclaim     Reclaim
	// Recovered are the measures outside every change's recovery window.
	Recovered Recovered
	RPC       [numTiers]int64

	Faults []Fault
	Notes  []Note
	Series Series
}

// Tokens are token totals of a part of the run.
type Tokens struct {
	Offered, Admitted, Denied, Strict, IdealAdmitted float64
	// Unserved are the denied tokens of requests that found no live
	// instance in their region.
	Unserved float64
}

// Conformance is invariant 1.
type Conformance struct {
	// Checks is the number of admission batches checked.
	Checks int64
	// Violations counts episodes in which a key's admissions exceeded
	// b + r·Δt + ε (beyond the tolerance).
	Violations int
	FirstAt    time.Duration
	FirstKey   string
	// MaxExcess is the largest excess beyond b + ε (tokens); WorstKey its
	// key.
	MaxExcess float64
	WorstKey  string
	// MaxExcessRaw is the largest excess beyond b alone, ε included.
	MaxExcessRaw float64
	// CoveredByEps counts admission batches above b but within ε.
	CoveredByEps int64
	// CrashError is ε summed over keys, CrashKeys the keys with ε > 0.
	CrashError float64
	CrashKeys  int
	// MaxExcessWithDegraded counts degraded-mode admissions too.
	MaxExcessWithDegraded float64
	// ClosedAdmitted is tokens of classes that fail closed admitted in
	// degraded mode (each batch is a violation).
	ClosedAdmitted float64
}

// RegionCheck is a check of one region's bucket of one key.
type RegionCheck struct {
	Checks      int64
	Violations  int
	FirstAt     time.Duration
	FirstKey    string
	FirstRegion string
	FirstDetail string
	// MaxOver is the largest excess found (tokens).
	MaxOver float64
}

func (c *RegionCheck) note(t time.Duration, k quota.Key, region string, over float64, detail string) {
	c.Violations++
	c.MaxOver = max(c.MaxOver, over)
	if c.Violations == 1 {
		c.FirstAt, c.FirstKey, c.FirstRegion, c.FirstDetail = t, k.String(), region, detail
	}
}

// SumCheck is invariant 2 or 3: Σ over regions ≤ the global value.
type SumCheck struct {
	Checks     int64
	Violations int
	MaxRatio   float64
	FirstAt    time.Duration
	FirstKey   string
	FirstSum   float64
	FirstLimit float64
	// FirstParts is what each region could use of the first violation's
	// key at that instant, and why (a grant, its static share, its floor).
	FirstParts string
}

// note counts a violation and says whether it was the first.
func (s *SumCheck) note(t time.Duration, k quota.Key, sum, limit float64) bool {
	s.Violations++
	if s.Violations == 1 {
		s.FirstAt, s.FirstKey, s.FirstSum, s.FirstLimit = t, k.String(), sum, limit
		return true
	}
	return false
}

// Convergence after demand shifts of contended keys.
type Convergence struct {
	// Shifts measured; those that converged are Shifts − NotConverged −
	// Superseded − Unfinished.
	Shifts   int
	Max, P50 float64 // epochs, over the converged shifts
	// Horizon is how many epochs a shift was watched for, at most.
	Horizon int
	// NotConverged shifts were watched for the whole Horizon and did not
	// converge; FirstMiss names the first.
	NotConverged int
	FirstMiss    string
	// Superseded shifts had not converged when the key's next shift came,
	// before the Horizon; Unfinished ones when the run ended. Neither says
	// the shift would not have converged within the Horizon.
	Superseded, Unfinished int
	// Held is the share of epoch samples after convergence at which the
	// allocation was still within the tolerance (jitter from the demand
	// estimate shows here, not in the convergence time).
	Held float64
	// Each is every measured shift, in time order.
	Each []ShiftOutcome
}

// Converged is how many shifts converged within the epochs watched.
func (c Convergence) Converged() int {
	return c.Shifts - c.NotConverged - c.Superseded - c.Unfinished
}

// Missed is how many shifts did not converge within epochs epochs, as
// far as the run shows: those watched for the whole horizon, and those
// superseded or cut by the run's end after more than epochs epochs.
func (c Convergence) Missed(epochs float64) int {
	n := 0
	for _, s := range c.Each {
		if s.Epochs < 0 && float64(s.Watched) >= epochs {
			n++
		}
	}
	return n
}

// String describes the convergence times: of the shifts that converged,
// and how many did not within the horizon or were cut short.
func (c Convergence) String() string {
	var s string
	if n := c.Converged(); n > 0 {
		s = fmt.Sprintf("max %.0f, median %.0f epochs over %d of %d shifts; held within tolerance after: %.2f%%",
			c.Max, c.P50, n, c.Shifts, 100*c.Held)
	} else {
		s = fmt.Sprintf("none of %d shifts converged", c.Shifts)
	}
	if c.NotConverged > 0 {
		s += fmt.Sprintf("; %d not converged within %d epochs (first %s)", c.NotConverged, c.Horizon, c.FirstMiss)
	}
	if c.Superseded > 0 {
		s += fmt.Sprintf("; %d superseded by the key's next shift before converging", c.Superseded)
	}
	if c.Unfinished > 0 {
		s += fmt.Sprintf("; %d still converging when the run ended", c.Unfinished)
	}
	return s
}

// ShiftOutcome is one measured demand shift.
type ShiftOutcome struct {
	Key string
	At  time.Duration
	// Epochs until converged; -1 when it did not within the epochs
	// watched.
	Epochs int
	// Watched is how many epochs after the shift were watched.
	Watched int
	// End is what ended the watch of a shift that did not converge.
	End ShiftEnd
}

// ShiftEnd is what ended the watch of a shift that did not converge.
type ShiftEnd uint8

const (
	// ShiftWatched: the whole horizon was watched (or the shift converged).
	ShiftWatched ShiftEnd = iota
	// ShiftSuperseded: the key's next shift came first.
	ShiftSuperseded
	// ShiftRunEnded: the run ended first.
	ShiftRunEnded
)

// Reclaim of crashed instances' leases.
type Reclaim struct {
	Crashes int
	Max     time.Duration
	Tokens  float64
}

// RPCs returns the calls on a tier.
func (r *Result) RPCs(t Tier) int64 { return r.RPC[t] }

// Pass reports whether the three invariants held.
func (r *Result) Pass() bool {
	return r.Conformance.Violations == 0 && r.Rates.Violations == 0 && r.Bursts.Violations == 0 &&
		r.Holding.Violations == 0 && r.Books.Violations == 0 && r.GrantOrder.Violations == 0
}

// String is a one-line digest.
func (r *Result) String() string {
	return fmt.Sprintf("inv1 %d inv2 %d inv3 %d util60 %.4f conv %.0f/%d", r.Conformance.Violations,
		r.Rates.Violations, r.Bursts.Violations, r.Util60sMin, r.Convergence.Max, r.Convergence.NotConverged)
}
