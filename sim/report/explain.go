package report

import (
	"fmt"
	"math"
	"strings"

	"github.com/sluicehq/sluice/sim/runner"
)

// meanings explain the checks in one line each, keyed by a word of the
// check's name.
var meanings = []struct{ match, text string }{
	{"conformance (GCRA", "every key's admissions, replayed through GCRA (the generic cell rate algorithm, an exact token bucket of rate r and burst b), never exceed what one bucket allows, beyond ε: the tokens crashed instances took with them"},
	{"Σ regional rates", "at every instant the sum (Σ) over regions of a key's refill rates is at most its global rate r"},
	{"Σ regional caps", "at every instant the sum (Σ) over regions of a key's burst caps is at most its global burst b"},
	{"each region holds", "no region's bucket ever holds more tokens than its burst cap"},
	{"exactly-once", "every instance report is booked once, however often it is retried"},
	{"grants applied in order", "a region never applies an older grant of the global tier after a newer one"},
	{"region report retries", "the region leader's reports to the global tier are not retried beyond the protocol's bound"},
	{"admitted vs ideal", "admitted as a share of what a single ideal token bucket, fed the same arrivals, admits, over every whole second after warmup except the recovery time after each change (a fault's start or end, a failover, an operator's event)"},
	{"fairness error", "how far each region's admissions were from its weighted max-min fair share of a contended key, over 10 s windows, as a share of the key's rate"},
	{"utilization", "over each window, what was admitted, up to min(offered, r·window) per key (the most a key's rate r allows of the window's arrivals, its burst left aside), as a share of that sum over the keys"},
	{"convergence", "epochs until the regions' shares follow a shift in demand"},
	{"false rejects", "tokens denied in a second in which their region admitted less than its weighted max-min fair share of the key's rate r for that second's demand, as a share of those offered"},
	{"reclaim after instance crash", "time until the tokens a crashed instance held on lease are back in its region's bucket"},
	{"crash error ε", "ε: tokens admitted beyond one bucket's allowance because instances crashed holding leases"},
	{"simulator sanity", "the simulator itself found nothing inconsistent in its run"},
}

// CheckMeaning is a one-line explanation of the check named name, or "".
func CheckMeaning(name string) string {
	for _, m := range meanings {
		if strings.Contains(name, m.match) {
			return m.text
		}
	}
	return ""
}

// Question is the question a scenario's description asks ("The question:
// ..."), up to its first question mark or full stop, or "".
func Question(description string) string {
	d := strings.Join(strings.Fields(description), " ")
	i := strings.Index(strings.ToLower(d), "question:")
	if i < 0 {
		return ""
	}
	q := strings.TrimSpace(d[i+len("question:"):])
	if j := strings.IndexAny(q, "?."); j >= 0 {
		q = q[:j+1]
	}
	if q == "" {
		return ""
	}
	return strings.ToUpper(q[:1]) + q[1:]
}

// Answer answers the scenario's question from the outcome: every target
// with its measured value, whether it was met, and whether the invariants
// held (each invariant's figures when the scenario sets no target).
func Answer(o *runner.Outcome) string {
	var targets, invariants, violated, unchecked []string
	for _, c := range o.Checks {
		verdict := "met"
		switch {
		case c.NoData:
			verdict = "no data"
		case c.Failed():
			verdict = "missed"
		}
		if !c.Invariant {
			targets = append(targets, fmt.Sprintf("%s: %s (target %s, %s)", c.Name, c.Value, c.Target, verdict))
			continue
		}
		switch {
		case c.Failed():
			violated = append(violated, fmt.Sprintf("%s: %s", c.Name, c.Value))
		case c.NoData:
			unchecked = append(unchecked, c.Name)
		default:
			invariants = append(invariants, fmt.Sprintf("%s: %s", c.Name, c.Value))
		}
	}
	var parts []string
	parts = append(parts, targets...)
	switch {
	case len(violated) > 0:
		parts = append(parts, "an invariant was violated ("+strings.Join(violated, "; ")+")")
	case len(targets) == 0:
		parts = append(parts, "every invariant held ("+strings.Join(invariants, "; ")+")")
	default:
		parts = append(parts, "every invariant held")
	}
	if len(unchecked) > 0 {
		parts = append(parts, "not checked in this run: "+strings.Join(unchecked, ", "))
	}
	if v := o.Result.VsIdeal; !math.IsNaN(v) && v > 0 {
		parts = append(parts, fmt.Sprintf("the fleet admitted %s of what a single ideal token bucket would after warmup", pct(v)))
	}
	if len(o.Warnings) > 0 {
		parts = append(parts, "but the machine did not keep up with the run, so these figures are partly the machine's (see the warnings)")
	}
	a := strings.Join(parts, "; ")
	return strings.ToUpper(a[:1]) + a[1:] + "."
}
