package report

import (
	"fmt"
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
	{"utilization", "admitted as a share of what a single ideal token bucket would admit over the same windows"},
	{"convergence", "epochs until the regions' shares follow a shift in demand"},
	{"false rejects", "tokens denied that a single ideal token bucket would have admitted, as a share of those offered"},
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

// Answer answers the scenario's question in one sentence from the outcome.
func Answer(o *runner.Outcome) string {
	var failed []string
	for _, c := range o.Checks {
		if !c.Pass {
			failed = append(failed, c.Name)
		}
	}
	ideal := ""
	if v := o.Result.VsIdeal; v > 0 {
		ideal = fmt.Sprintf("; the fleet admitted %s of what a single ideal token bucket would", pct(v))
	}
	switch {
	case !o.InvariantsHold():
		return fmt.Sprintf("No: an invariant was violated (%s)%s.", strings.Join(failed, ", "), ideal)
	case !o.Pass():
		return fmt.Sprintf("Partly: every invariant held, but a target was missed (%s)%s.", strings.Join(failed, ", "), ideal)
	}
	return fmt.Sprintf("Yes: every invariant held and every target was met%s.", ideal)
}
