package report_test

import (
	"bytes"
	"encoding/csv"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/report"
	"github.com/sluicehq/sluice/sim/runner"
	"github.com/sluicehq/sluice/sim/scenario"
	"github.com/sluicehq/sluice/sim/scenarios"
)

func outcome(t *testing.T) *runner.Outcome {
	t.Helper()
	sc, err := scenarios.Load("instance-crash")
	if err != nil {
		t.Fatal(err)
	}
	out, err := runner.Run(sc, runner.Options{Duration: 95 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRendering runs one short scenario with a fault and checks every
// rendering of it.
func TestRendering(t *testing.T) {
	o := outcome(t)
	t.Run("summary", func(t *testing.T) { summaryNamesEveryCheckAndMeasure(t, o) })
	t.Run("html", func(t *testing.T) { htmlIsSelfContained(t, o) })
	t.Run("svg", func(t *testing.T) { chartsAreWellFormedSVG(t, o) })
	t.Run("csv", func(t *testing.T) { csvHasEverySeriesAtEveryStep(t, o) })
	t.Run("page reads well", func(t *testing.T) { pageReadsWell(t, o) })
	t.Run("warnings", func(t *testing.T) { warningsAreShownFirst(t, o) })
	t.Run("live Redis count", func(t *testing.T) {
		// The real daemons count round trips to Redis, not scripts.
		live := *o
		live.Mode = "live"
		if s := report.Summary(&live); !strings.Contains(s, "Redis round trips") || strings.Contains(s, "Redis scripts") {
			t.Errorf("live summary:\n%s", s)
		}
		if s := report.Summary(o); !strings.Contains(s, "Redis scripts") {
			t.Errorf("virtual summary:\n%s", s)
		}
	})
}

// warningsAreShownFirst: a run's warnings (a live run the machine could
// not keep up with) head the summary and the page, and the answer says
// the figures are partly the machine's; a run without any shows none.
func warningsAreShownFirst(t *testing.T, o *runner.Outcome) {
	for _, s := range []string{report.Summary(o), page(t, o)} {
		if strings.Contains(s, "WARNING") || strings.Contains(s, "Warning:") || strings.Contains(report.Answer(o), "did not keep up") {
			t.Fatalf("a run without warnings shows one:\n%s", s)
		}
	}
	warned := *o
	warned.Warnings = []string{"the driver fell behind the traffic plan: <see>"}
	sum := report.Summary(&warned)
	if w, c := strings.Index(sum, "WARNING: the driver fell behind"), strings.Index(sum, "Check"); w < 0 || w > c {
		t.Errorf("summary does not head its checks with the warning:\n%s", sum)
	}
	html := page(t, &warned)
	if w, c := strings.Index(html, "<strong>Warning:</strong> the driver fell behind the traffic plan: &lt;see&gt;"), strings.Index(html, "<h2>Invariants"); w < 0 || w > c {
		t.Errorf("page does not head its checks with the escaped warning:\n%s", html)
	}
	if a := report.Answer(&warned); !strings.HasSuffix(a, "so these figures are partly the machine's (see the warnings).") {
		t.Errorf("answer %q does not say the figures are partly the machine's", a)
	}
}

func page(t *testing.T, o *runner.Outcome) string {
	t.Helper()
	var b strings.Builder
	if err := report.WriteHTML(&b, o); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// pageReadsWell: the page uses the full width, answers the scenario's
// question in a sentence before anything else, explains each check in a
// line, lists the checks once (not again as text) and draws the ideal
// bucket over the admitted line.
func pageReadsWell(t *testing.T, o *runner.Outcome) {
	var b bytes.Buffer
	if err := report.WriteHTML(&b, o); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if strings.Contains(page, "max-width") {
		t.Error("the page is narrower than the window (max-width)")
	}
	answer := strings.Index(page, `<p class="answer">`)
	if answer < 0 || answer > strings.Index(page, "<h2>") ||
		!strings.Contains(page, report.Question(o.Scenario.Description)) || report.Question(o.Scenario.Description) == "" {
		t.Errorf("the scenario's question is not answered at the top:\n%.600s", page)
	}
	// The answer gives the figures the question asks for: every target
	// with its measured value, not a bare yes.
	got := report.Answer(o)
	if !strings.Contains(page, html.EscapeString(got)) {
		t.Errorf("answer %q is not on the page", got)
	}
	for _, c := range o.Checks {
		if !c.Invariant && !strings.Contains(got, c.Value+" (target "+c.Target) {
			t.Errorf("answer %q does not give %s: %s against its target %s", got, c.Name, c.Value, c.Target)
		}
	}
	if strings.HasPrefix(got, "Yes") || !strings.Contains(got, "every invariant held") {
		t.Errorf("answer %q: want the figures and whether the invariants held", got)
	}
	pre := page[strings.Index(page, "<pre>"):]
	if strings.Contains(pre, "Result Target") {
		t.Error("the checks table is repeated as text below it")
	}
	for _, c := range o.Checks {
		if report.CheckMeaning(c.Name) == "" {
			t.Errorf("check %q is not explained", c.Name)
		}
		for _, l := range strings.Split(pre, "\n") {
			if strings.Contains(l, c.Name) && (strings.Contains(l, " PASS ") || strings.Contains(l, " FAIL ")) {
				t.Errorf("check %q is repeated as text below the table: %q", c.Name, l)
			}
		}
	}
	for _, w := range []string{"GCRA (the generic cell rate", "ε:", "sum (Σ)"} {
		if !strings.Contains(page, w) {
			t.Errorf("page does not explain %q", w)
		}
	}
	_, svgs := report.Charts(o)
	fleet := svgs["fleet"]
	admitted, ideal := strings.Index(fleet, `<polyline fill="none" stroke="`+report.ColorAdmitted), strings.Index(fleet, `<polyline fill="none" stroke="`+report.ColorIdeal)
	if admitted < 0 || ideal < admitted {
		t.Errorf("the ideal bucket (at %d) is not drawn over the admitted line (at %d)", ideal, admitted)
	}
}

// TestEveryShippedScenarioAsksAQuestion: the report's answer box has a
// question to answer for every shipped scenario, and it is a question.
func TestEveryShippedScenarioAsksAQuestion(t *testing.T) {
	for _, n := range scenarios.Names() {
		sc, err := scenarios.Load(n)
		if err != nil {
			t.Fatal(err)
		}
		if q := report.Question(sc.Description); !strings.HasSuffix(q, "?") {
			t.Errorf("%s: question %q", n, q)
		}
	}
}

// TestAnswerWithoutTargetsGivesTheInvariants: a scenario that sets no
// target is answered by the invariants' own figures; one with a target
// without data says so.
func TestAnswerWithoutTargetsGivesTheInvariants(t *testing.T) {
	o := &runner.Outcome{Result: &oracle.Result{VsIdeal: 0.5}, Checks: []runner.Check{
		{Name: "5 exactly-once counters", Value: "0 violations in 7 checks", Target: "<= 0", Pass: true, Invariant: true},
		{Name: "2 grants applied in order", Value: "n/a (nothing checked)", Target: "<= 0", Pass: true, Invariant: true, NoData: true},
	}}
	want := "Every invariant held (5 exactly-once counters: 0 violations in 7 checks); not checked in this run: 2 grants applied in order; " +
		"the fleet admitted 50.00% of what a single ideal token bucket would after warmup."
	if got := report.Answer(o); got != want {
		t.Errorf("answer\n%q, want\n%q", got, want)
	}
	o.Checks = append(o.Checks, runner.Check{Name: "reclaim after instance crash", Value: "n/a (no crash)", Target: "<= 6s", NoData: true})
	if got := report.Answer(o); !strings.HasPrefix(got, "Reclaim after instance crash: n/a (no crash) (target <= 6s, no data); every invariant held;") {
		t.Errorf("answer %q", got)
	}
}

func TestQuestionAndAnswer(t *testing.T) {
	for in, want := range map[string]string{
		"Load. The question: does the\n fleet admit what a bucket would? More.": "Does the fleet admit what a bucket would?",
		"Outage. The question: no split brain, no oversubscription.":            "No split brain, no oversubscription.",
		"No question here.": "",
	} {
		if got := report.Question(in); got != want {
			t.Errorf("Question(%q) = %q, want %q", in, got, want)
		}
	}
}

func summaryNamesEveryCheckAndMeasure(t *testing.T, o *runner.Outcome) {
	s := report.Summary(o)
	for _, c := range o.Checks {
		if !strings.Contains(s, c.Name) {
			t.Errorf("summary misses check %q", c.Name)
		}
	}
	for _, want := range []string{"utilization, 60 s windows", "admitted vs ideal, whole seconds", "false rejects", "fairness error", "convergence",
		"reclaim after instance crash", "crash error ε", "control plane (RPC/s)", "instance-crash us-east ×2", "Result: "} {
		if !strings.Contains(s, want) {
			t.Errorf("summary misses %q:\n%s", want, s)
		}
	}
}

func htmlIsSelfContained(t *testing.T, o *runner.Outcome) {
	var b bytes.Buffer
	if err := report.WriteHTML(&b, o); err != nil {
		t.Fatal(err)
	}
	doc, err := html.Parse(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	svgs, cells := 0, 0
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			switch n.Data {
			case "script", "link", "iframe", "img", "object", "embed":
				t.Errorf("page has a <%s> element", n.Data)
			case "svg":
				svgs++
			case "td":
				cells++
			}
			for _, a := range n.Attr {
				if (a.Key == "href" || a.Key == "src" || strings.HasPrefix(a.Key, "on")) && a.Val != "" {
					t.Errorf("<%s %s=%q>: the page must not load or run anything", n.Data, a.Key, a.Val)
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	ids, _ := report.Charts(o)
	if svgs != len(ids) || svgs < 1+len(o.Result.Regions) {
		t.Fatalf("%d inline charts, want %d", svgs, len(ids))
	}
	if cells < 4*len(o.Checks) {
		t.Fatalf("checks table has %d cells", cells)
	}
	if strings.Contains(b.String(), "@import") || strings.Contains(b.String(), "url(") {
		t.Fatal("styles load something")
	}
}

func chartsAreWellFormedSVG(t *testing.T, o *runner.Outcome) {
	ids, svgs := report.Charts(o)
	if ids[0] != "fleet" {
		t.Fatalf("first chart %q", ids[0])
	}
	for _, id := range ids {
		d := xml.NewDecoder(strings.NewReader(svgs[id]))
		root := ""
		for {
			tok, err := d.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("chart %s: %v", id, err)
			}
			if se, ok := tok.(xml.StartElement); ok && root == "" {
				root = se.Name.Local
				if se.Name.Space != "http://www.w3.org/2000/svg" {
					t.Fatalf("chart %s: root namespace %q", id, se.Name.Space)
				}
			}
		}
		if root != "svg" || !strings.Contains(svgs[id], "<polyline") {
			t.Fatalf("chart %s: root %q, no lines", id, root)
		}
	}
}

func csvHasEverySeriesAtEveryStep(t *testing.T, o *runner.Outcome) {
	var b bytes.Buffer
	if err := report.WriteCSV(&b, o); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	s := o.Result.Series
	nr := len(o.Result.Regions)
	want := 1 + len(s.Times)*(1+nr+len(s.Focus)*(1+nr))
	if len(rows) != want {
		t.Fatalf("%d rows, want %d", len(rows), want)
	}
	if rows[0][0] != "t_s" || len(rows[0]) != 10 {
		t.Fatalf("header %v", rows[0])
	}
	for _, r := range rows[1:] {
		if len(r) != len(rows[0]) {
			t.Fatalf("row %v has %d fields", r, len(r))
		}
	}
}

// TestEveryCheckIsExplained: every check Evaluate can make, with every
// target set, has its line of explanation on the page.
func TestEveryCheckIsExplained(t *testing.T) {
	sc, err := scenarios.Load("region-drain")
	if err != nil {
		t.Fatal(err)
	}
	p, d := 0.5, 3.0
	e := &sc.Expect
	e.Utilization60sMin, e.Utilization1sMeanMin, e.ConvergenceEpochsMax, e.FalseRejectsMax = &p, &p, &d, &p
	e.RecoveredVsIdealMin, e.RecoveredFalseRejectsMax, e.FairnessErrorMax, e.CrashErrorMax = &p, &p, &p, &p
	e.ReclaimMax = scenario.Duration(time.Second)
	checks := runner.Evaluate(sc, &oracle.Result{Fairness: []float64{0}, FairnessWindows: []int{1}})
	if len(checks) != 15 {
		t.Errorf("%d checks, want 6 invariants and 9 targets", len(checks))
	}
	for _, c := range checks {
		if report.CheckMeaning(c.Name) == "" {
			t.Errorf("check %q is not explained", c.Name)
		}
	}
}

// TestEventTimesInMilliseconds: the events table gives times to the
// millisecond, as the faults list does.
func TestEventTimesInMilliseconds(t *testing.T) {
	o := outcome(t)
	res := *o.Result
	res.Notes = append(append([]oracle.Note(nil), res.Notes...), oracle.Note{At: 3*time.Minute + 8412538260, Text: "leader elected"})
	o.Result = &res
	var b bytes.Buffer
	if err := report.WriteHTML(&b, o); err != nil {
		t.Fatal(err)
	}
	if page := b.String(); !strings.Contains(page, "<td>3m8.413s</td>") || strings.Contains(page, "3m8.41253826s") {
		t.Errorf("event time not in milliseconds")
	}
}

// TestCheckMeaningsSayWhatIsComputed: the report explains each measure by
// what the oracle computes (sim/README, "The oracle"). Utilization is
// against min(offered, r·window) per key, not the ideal bucket, whose
// share the summary prints beside it; a false reject is a denial in a
// region below its weighted max-min fair share, which an ideal bucket,
// having no regions, does not know.
func TestCheckMeaningsSayWhatIsComputed(t *testing.T) {
	for _, c := range []struct {
		name      string
		want, not []string
	}{
		{"utilization, worst 60 s window", []string{"min(offered, r", "per key"}, []string{"ideal token bucket"}},
		{"utilization, mean of 1 s windows", []string{"min(offered, r"}, []string{"ideal token bucket"}},
		{"false rejects (share of offered)", []string{"fair share", "share of those offered"}, []string{"ideal token bucket"}},
		{"false rejects, recovered", []string{"fair share"}, []string{"ideal token bucket"}},
		{"admitted vs ideal, recovered", []string{"ideal token bucket"}, nil},
	} {
		m := report.CheckMeaning(c.name)
		for _, w := range c.want {
			if !strings.Contains(m, w) {
				t.Errorf("%s: meaning %q lacks %q", c.name, m, w)
			}
		}
		for _, n := range c.not {
			if strings.Contains(m, n) {
				t.Errorf("%s: meaning %q says %q", c.name, m, n)
			}
		}
	}
}

// TestUnservedTokensAreSaid: requests that found no live instance (a
// region down whose users did not fail over) are denied without the
// limiter deciding them; the tokens lines say how many of the denied
// they were, and a run without any says nothing of them.
func TestUnservedTokensAreSaid(t *testing.T) {
	o := outcome(t)
	if s := report.Summary(o); strings.Contains(s, "no live instance") {
		t.Errorf("a run with every request served speaks of unserved ones:\n%s", s)
	}
	res := *o.Result
	res.Unserved, res.AfterWarmup.Unserved = 1234, 567
	o.Result = &res
	s := report.Summary(o)
	for _, want := range []string{"(567 found no live instance)", "(1234 found no live instance)"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
}
