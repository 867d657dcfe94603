package report

import (
	"fmt"
	"html"
	"io"
	"strings"
	"time"

	"github.com/sluicehq/sluice/sim/runner"
)

// Charts are the report's charts as standalone SVG documents, keyed by a
// file-name-safe id: "fleet", "regions" (admitted per region), then
// "<key>-shares" (every region's refill rate: how the key's rate is
// divided), "<key>-global" and "<key>-<region>" for every focus key. The
// ideal bucket is drawn last, over the admitted line it is compared with.
func Charts(o *runner.Outcome) (ids []string, svgs map[string]string) {
	svgs = map[string]string{}
	add := func(id string, c *chart) {
		ids = append(ids, id)
		svgs[id] = c.svg()
	}
	r := o.Result
	s := r.Series
	add("fleet", &chart{title: "Fleet: every key, all regions", xs: s.Times, faults: r.Faults, lines: []line{
		{name: "offered", color: colDemand, ys: s.Offered},
		{name: "admitted", color: colAdmitted, ys: s.Admitted},
		{name: "ideal bucket", color: colIdeal, ys: s.Ideal, dash: true, top: true},
	}})
	var perRegion []line
	for i, name := range r.Regions {
		perRegion = append(perRegion, line{name: name, color: regionColor(i), ys: s.RegionAdmitted[i]})
	}
	add("regions", &chart{title: "Fleet: admitted per region", xs: s.Times, faults: r.Faults, lines: perRegion})
	for _, f := range s.Focus {
		slug := strings.NewReplacer("/", "-", ":", "-", "@", "-").Replace(f.Key)
		var shares []line
		for i, rg := range f.Regions {
			shares = append(shares, line{name: r.Regions[i], color: regionColor(i), ys: rg.Rate})
		}
		add(slug+"-shares", &chart{title: fmt.Sprintf("%s: what each region may refill at (grant, else static share or floor)", f.Key),
			xs: s.Times, limit: f.Rate, faults: r.Faults, lines: shares})
		add(slug+"-global", &chart{title: fmt.Sprintf("%s: all regions against the global limit", f.Key), xs: s.Times,
			limit: f.Rate, faults: r.Faults, lines: []line{
				{name: "offered", color: colDemand, ys: f.Offered},
				{name: "admitted", color: colAdmitted, ys: f.Admitted},
				{name: "ideal bucket", color: colIdeal, ys: f.Ideal, dash: true, top: true},
			}})
		for i, rg := range f.Regions {
			add(slug+"-"+r.Regions[i], &chart{title: fmt.Sprintf("%s in %s", f.Key, r.Regions[i]), xs: s.Times,
				faults: r.Faults, w: 900, h: 200, lines: []line{
					{name: "demand", color: colDemand, ys: rg.Offered},
					{name: "grant (refill rate)", color: colGrant, ys: rg.Rate, dash: true},
					{name: "admitted", color: colAdmitted, ys: rg.Admitted},
					{name: "denied", color: colDenied, ys: rg.Denied},
				}})
		}
	}
	return ids, svgs
}

// WriteHTML writes the self-contained report page.
func WriteHTML(w io.Writer, o *runner.Outcome) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	esc := html.EscapeString
	sc, r := o.Scenario, o.Result
	p("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sluice simulation: %s</title>\n", esc(sc.Name))
	p("<style>body{font-family:sans-serif;margin:24px;color:#202124}" +
		"table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #dadce0;padding:4px 8px;text-align:left;vertical-align:top;font-size:13px}" +
		"th{background:#f1f3f4}.pass{color:#188038;font-weight:bold}.fail{color:#d93025;font-weight:bold}.na{color:#5f6368}" +
		"pre{background:#f8f9fa;padding:12px;font-size:12px;overflow-x:auto}h2{margin-top:28px}svg{display:block;margin:8px 0;width:100%%;height:auto}" +
		".answer{font-size:16px;border-left:4px solid #1a73e8;padding:4px 12px}.warn{border-left:4px solid #d93025;padding:4px 12px}</style>\n")
	p("</head><body>\n<h1>Sluice simulation: %s</h1>\n", esc(sc.Name))
	if q := Question(sc.Description); q != "" {
		p("<p class=\"answer\"><strong>%s</strong><br>%s</p>\n", esc(q), esc(Answer(o)))
	} else {
		p("<p class=\"answer\">%s</p>\n", esc(Answer(o)))
	}
	if d := strings.TrimSpace(sc.Description); d != "" {
		p("<p>%s</p>\n", esc(d))
	}
	verdict, cls := "PASS", "pass"
	switch {
	case !o.InvariantsHold():
		verdict, cls = "FAIL: an invariant was violated", "fail"
	case !o.Pass():
		verdict, cls = "FAIL: a target was missed", "fail"
	}
	p("<p>%s mode, seed %d, %v simulated, %d regions, %d instances, %d tenants, %d keys. Result: <span class=\"%s\">%s</span></p>\n",
		esc(o.Mode), o.Seed, r.Duration, len(r.Regions), o.Instances, o.Tenants, r.Keys, cls, esc(verdict))
	for _, warning := range o.Warnings {
		p("<p class=\"warn\"><strong>Warning:</strong> %s</p>\n", esc(warning))
	}
	p("<h2>Invariants and targets</h2>\n<table><tr><th>Check</th><th>What it means</th><th>Result</th><th>Target</th><th>Value</th></tr>\n")
	for _, c := range o.Checks {
		res, cl := c.Result(), "pass"
		if c.Failed() {
			cl = "fail"
		} else if c.NoData {
			cl = "na"
		}
		p("<tr><td>%s</td><td>%s</td><td class=\"%s\">%s</td><td>%s</td><td>%s</td></tr>\n",
			esc(c.Name), esc(CheckMeaning(c.Name)), cl, res, esc(c.Target), esc(c.Value))
	}
	// The measures and faults; the checks are the table above.
	measures := Summary(o)
	if i := strings.Index(measures, "  Measures"); i >= 0 {
		measures = measures[i:]
	}
	p("</table>\n<h2>Measures</h2>\n<pre>%s</pre>\n", esc(measures))
	ids, svgs := Charts(o)
	p("<h2>Charts</h2>\n<p>Shaded bands and dashed red lines mark faults (hover for their names). Offered, admitted, denied and ideal rates are averaged over each %v step; refill rates and burst caps are sampled at each step's end.</p>\n", r.Series.Step)
	for _, id := range ids {
		b.WriteString(svgs[id])
		b.WriteString("\n")
	}
	if len(r.Notes) > 0 {
		p("<h2>Events</h2>\n<table><tr><th>At</th><th>Event</th></tr>\n")
		for _, n := range r.Notes {
			p("<tr><td>%v</td><td>%s</td></tr>\n", n.At.Round(time.Millisecond), esc(n.Text))
		}
		p("</table>\n")
	}
	p("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteCSV writes every time series, one row per (step, series): fleet
// totals (key "*", region "*"), fleet totals per region (key "*"), and
// every focus key globally (region "*") and per region.
func WriteCSV(w io.Writer, o *runner.Outcome) error {
	var b strings.Builder
	r := o.Result
	s := r.Series
	b.WriteString("t_s,key,region,offered_per_s,admitted_per_s,denied_per_s,ideal_per_s,refill_rate,burst_cap,limit_rate\n")
	num := func(v float64) string { return fmt.Sprintf("%.3f", v) }
	empty := ""
	for i, t := range s.Times {
		ts := fmt.Sprintf("%g", t)
		row := func(key, region string, cols ...string) {
			b.WriteString(ts + "," + key + "," + region + "," + strings.Join(cols, ",") + "\n")
		}
		row("*", "*", num(s.Offered[i]), num(s.Admitted[i]), empty, num(s.Ideal[i]), empty, empty, empty)
		for ri, name := range r.Regions {
			row("*", name, num(s.RegionOffered[ri][i]), num(s.RegionAdmitted[ri][i]), empty, empty, empty, empty, empty)
		}
		for _, f := range s.Focus {
			row(f.Key, "*", num(f.Offered[i]), num(f.Admitted[i]), empty, num(f.Ideal[i]), empty, num(f.Burst), num(f.Rate))
			for ri, rg := range f.Regions {
				row(f.Key, r.Regions[ri], num(rg.Offered[i]), num(rg.Admitted[i]), num(rg.Denied[i]), empty, num(rg.Rate[i]), num(rg.Cap[i]), empty)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
