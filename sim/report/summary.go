package report

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/runner"
)

// Summary is the plain-text summary of an outcome.
func Summary(o *runner.Outcome) string {
	var b strings.Builder
	WriteSummary(&b, o)
	return b.String()
}

// WriteSummary writes Summary to w.
func WriteSummary(w io.Writer, o *runner.Outcome) {
	sc, r := o.Scenario, o.Result
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("Sluice simulation: scenario %s (%s mode), seed %d\n", sc.Name, o.Mode, o.Seed)
	if d := strings.TrimSpace(sc.Description); d != "" {
		for _, line := range Wrap(d, 76) {
			p("  %s\n", line)
		}
	}
	p("  %v simulated (warmup %v) · %d regions · %d instances · %d tenants · %d keys · %d faults\n",
		r.Duration, time.Duration(sc.Warmup), len(r.Regions), o.Instances, o.Tenants, r.Keys, len(r.Faults))
	for _, warning := range o.Warnings {
		for i, line := range Wrap("WARNING: "+warning, 76) {
			if i > 0 {
				line = "  " + line
			}
			p("  %s\n", line)
		}
	}
	p("\n")

	p("  %-36s %-6s %-12s %s\n", "Check", "Result", "Target", "Value")
	for _, c := range o.Checks {
		p("  %-36s %-6s %-12s %s\n", c.Name, c.Result(), c.Target, c.Value)
	}

	p("\n  Measures (after warmup)\n")
	row := func(name, format string, a ...any) { p("    %-34s %s\n", name, fmt.Sprintf(format, a...)) }
	row("utilization, 1 s windows", "mean %s, worst %s", pct(r.Util1sMean), pct(r.Util1sMin))
	if r.Windows60 > 0 {
		row("utilization, 60 s windows", "mean %s, worst %s over %s from %v (ideal bucket: mean %s)",
			pct(r.Util60sMean), pct(r.Util60sMin), plural(r.Windows60, "window"), time.Duration(sc.Warmup), pct(r.IdealUtil60sMean))
	} else {
		row("utilization, 60 s windows", "n/a (no full window after warmup)")
	}
	// Whole seconds, as the recovered measures count: the tokens line
	// below counts every decision after warmup, the run's last partial
	// second and its last instant included, so the two may differ there.
	row("admitted vs ideal, whole seconds", "%s", pct(r.VsIdeal))
	if r.AfterWarmup.Offered > 0 {
		row("false rejects", "%s of offered (%.0f tokens)", pct(r.FalseRejects), r.FalseRejectTokens)
	} else {
		row("false rejects", "n/a (nothing offered after warmup)")
	}
	var fair []string
	for i, name := range r.Regions {
		if r.FairnessWindows[i] == 0 {
			fair = append(fair, name+" n/a")
			continue
		}
		fair = append(fair, fmt.Sprintf("%s %s", name, pct(r.Fairness[i])))
	}
	row("fairness error (10 s, contended)", "%s", strings.Join(fair, ", "))
	if cv := r.Convergence; cv.Shifts > 0 {
		row("convergence after demand shifts", "%s", cv.String())
	} else {
		row("convergence after demand shifts", "n/a (no shift of a contended key)")
	}
	if rc := r.Reclaim; rc.Crashes > 0 {
		row("reclaim after instance crash", "max %v over %d crashes (%.0f tokens)", rc.Max.Round(time.Millisecond), rc.Crashes, rc.Tokens)
	} else {
		row("reclaim after instance crash", "n/a (no crash)")
	}
	if rc := r.Recovered; rc.Recovery > 0 || len(rc.Each) > 0 {
		if rc.Recovery > 0 {
			row("recovered (after "+rc.Recovery.String()+")", "admitted vs ideal %s, false rejects %s, over %d s",
				pct(rc.VsIdeal), pct(rc.FalseRejects), rc.Seconds)
		}
		for _, ch := range rc.Each {
			took := "not within the time to the next change"
			if ch.Took >= 0 {
				took = ch.Took.String()
			}
			row("recovery to "+pct(rc.Level)+" of ideal", "%v after %s at %v", took, ch.Label, ch.At.Round(time.Millisecond))
		}
	}
	aw := r.AfterWarmup
	row("tokens", "offered %.0f, admitted %.0f (strict %.0f), denied %.0f%s, ideal bucket %.0f",
		aw.Offered, aw.Admitted, aw.Strict, aw.Denied, unserved(aw.Unserved), aw.IdealAdmitted)

	p("\n  Whole run (warmup included)\n")
	c := r.Conformance
	row("crash error ε", "%.0f tokens over %d keys (max excess over b: %.1f tokens)", c.CrashError, c.CrashKeys, c.MaxExcessRaw)
	row("degraded-mode admissions", "%.0f tokens (max excess over b with them: %.1f)", r.Degraded, math.Max(0, c.MaxExcessWithDegraded))
	row("tokens", "offered %.0f, admitted %.0f (strict %.0f), denied %.0f%s, ideal bucket %.0f",
		r.Offered, r.Admitted, r.Strict, r.Denied, unserved(r.Unserved), r.IdealAdmitted)
	secs := r.Duration.Seconds()
	// Virtual mode counts every script call; the real daemons' metrics
	// count a round trip to Redis once (a Sync's pipelined scripts are one),
	// with their own pings and reads.
	redis := "Redis scripts"
	if o.Mode == "live" {
		redis = "Redis round trips"
	}
	if r.Duration >= time.Second {
		row("control plane (RPC/s)", "instance→region %.1f, region→global %.1f, %s %.1f; grants applied %d",
			float64(r.RPCs(oracle.TierInstance))/secs, float64(r.RPCs(oracle.TierGlobal))/secs,
			redis, float64(r.RPCs(oracle.TierRedis))/secs, r.GrantsApplied)
	} else {
		// A rate over less than a second (the calls a run makes at its
		// start, over 1ns) would be a meaningless large number: counts.
		row("control plane (RPCs)", "instance→region %d, region→global %d, %s %d in %v (too short for a rate); grants applied %d",
			r.RPCs(oracle.TierInstance), r.RPCs(oracle.TierGlobal), redis, r.RPCs(oracle.TierRedis), r.Duration, r.GrantsApplied)
	}
	if len(r.Faults) > 0 {
		p("\n  Faults\n")
		for _, f := range r.Faults {
			if f.Until > f.At {
				p("    %9v – %-9v %s\n", f.At.Round(time.Millisecond), f.Until.Round(time.Millisecond), f.Label)
			} else {
				p("    %9v   %-9s %s\n", f.At.Round(time.Millisecond), "", f.Label)
			}
		}
	}
	verdict := "PASS"
	switch {
	case !o.InvariantsHold():
		verdict = "FAIL: an invariant was violated"
	case !o.Pass():
		verdict = "FAIL: a target was missed"
	}
	p("\n  Result: %s\n", verdict)
}

// plural is "1 window", "2 windows".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f%%", 100*v)
}

// Wrap breaks s into lines of at most width bytes at spaces (a word
// longer than width stands alone on its line).
func Wrap(s string, width int) []string {
	var lines []string
	cur := ""
	for _, word := range strings.Fields(s) {
		if cur != "" && len(cur)+1+len(word) > width {
			lines = append(lines, cur)
			cur = ""
		}
		if cur != "" {
			cur += " "
		}
		cur += word
	}
	if cur != "" {
		lines = append(lines, cur)
	}
	return lines
}

// unserved says how many of the denied tokens found no live instance (a
// region down whose users did not fail over): the limiter decided none of
// them, though they count as denied, and as false rejects while their
// region is below its fair share. "" when there were none.
func unserved(tokens float64) string {
	if tokens <= 0 {
		return ""
	}
	return fmt.Sprintf(" (%.0f found no live instance)", tokens)
}
