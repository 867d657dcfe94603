package report

import (
	"fmt"
	"html"
	"math"
	"strings"

	"github.com/sluicehq/sluice/sim/oracle"
)

// line is one series of a chart.
type line struct {
	name  string
	color string
	ys    []float64
	dash  bool
	// top is a reference line drawn over the others (listed last) and
	// thicker, so it stays visible where they coincide.
	top bool
}

// chart is a line chart over time with fault bands.
type chart struct {
	title  string
	xs     []float64 // seconds
	lines  []line
	limit  float64 // horizontal reference line (0: none)
	faults []oracle.Fault
	w, h   int
}

const (
	padL, padR, padT, padB = 64, 16, 34, 34
)

// tickStep is a round tick interval (1, 2, 2.5 or 5 times a power of
// ten) giving at most about five intervals up to v.
func tickStep(v float64) float64 {
	if !(v > 0) {
		return 1
	}
	raw := v / 5
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func fmtNum(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", math.Round(v/1e5)/10)
	case v >= 1e4:
		return fmt.Sprintf("%gk", math.Round(v/1e2)/10)
	}
	return fmt.Sprintf("%g", math.Round(v*100)/100)
}

// timeStep is a round tick interval giving 5 to 12 ticks over span
// seconds.
func timeStep(span float64) float64 {
	for _, st := range []float64{1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200} {
		if span/st <= 12 {
			return st
		}
	}
	return span / 10
}

func fmtTime(s float64, span float64) string {
	if span > 600 {
		return fmt.Sprintf("%gm", math.Round(s/6)/10)
	}
	return fmt.Sprintf("%gs", math.Round(s))
}

// svg renders the chart as a standalone SVG element.
func (c *chart) svg() string {
	w, h := c.w, c.h
	if w == 0 {
		w, h = 900, 240
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`, w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`, w, h)
	fmt.Fprintf(&b, `<text x="%d" y="18" font-size="13" font-weight="bold">%s</text>`, padL, html.EscapeString(c.title))
	if len(c.xs) == 0 {
		b.WriteString(`</svg>`)
		return b.String()
	}
	xmax := c.xs[len(c.xs)-1]
	ymax := c.limit
	for _, l := range c.lines {
		for _, y := range l.ys {
			if y > ymax && !math.IsInf(y, 0) {
				ymax = y
			}
		}
	}
	ystep := tickStep(ymax * 1.05)
	ymax = ystep * math.Ceil(ymax*1.05/ystep)
	if ymax == 0 {
		ymax = ystep
	}
	pw, ph := float64(w-padL-padR), float64(h-padT-padB)
	X := func(x float64) float64 { return float64(padL) + pw*x/xmax }
	Y := func(y float64) float64 { return float64(padT) + ph*(1-y/ymax) }
	for _, f := range c.faults {
		x0 := X(f.At.Seconds())
		if f.Until > f.At {
			x1 := X(math.Min(f.Until.Seconds(), xmax))
			fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%.1f" fill="#f4c7c3" opacity="0.55"><title>%s</title></rect>`,
				x0, padT, math.Max(x1-x0, 1), ph, html.EscapeString(f.Label))
		} else {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#d93025" stroke-dasharray="3,3"><title>%s</title></line>`,
				x0, padT, x0, float64(padT)+ph, html.EscapeString(f.Label))
		}
	}
	for v := 0.0; v <= ymax+ystep/2; v += ystep {
		y := Y(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e0e0e0"/>`, padL, y, float64(padL)+pw, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-6, y+4, fmtNum(v))
	}
	step := timeStep(xmax)
	for v := 0.0; v <= xmax+1e-9; v += step {
		x := X(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#bdbdbd"/>`, x, float64(padT)+ph, x, float64(padT)+ph+4)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x, float64(padT)+ph+16, fmtTime(v, xmax))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="#9e9e9e"/>`, padL, padT, pw, ph)
	fmt.Fprintf(&b, `<text x="12" y="%.1f" transform="rotate(-90 12 %.1f)" text-anchor="middle">tokens/s</text>`, float64(padT)+ph/2, float64(padT)+ph/2)
	if c.limit > 0 {
		y := Y(c.limit)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000000" stroke-width="1" stroke-dasharray="6,4"/>`, padL, y, float64(padL)+pw, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">limit r = %s</text>`, float64(padL)+pw-4, y-4, fmtNum(c.limit))
	}
	for _, l := range c.lines {
		var pts strings.Builder
		for i, y := range l.ys {
			if i >= len(c.xs) {
				break
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", X(c.xs[i]), Y(y))
		}
		dash := ""
		if l.dash {
			dash = ` stroke-dasharray="4,3"`
		}
		width := 1.6
		if l.top {
			width = 2.4
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%.1f"%s points="%s"/>`, l.color, width, dash, strings.TrimSpace(pts.String()))
	}
	lx := float64(w - padR)
	for i := len(c.lines) - 1; i >= 0; i-- {
		l := c.lines[i]
		label := html.EscapeString(l.name)
		tw := float64(7*len(l.name) + 34)
		lx -= tw
		fmt.Fprintf(&b, `<line x1="%.1f" y1="14" x2="%.1f" y2="14" stroke="%s" stroke-width="3"/>`, lx, lx+16, l.color)
		fmt.Fprintf(&b, `<text x="%.1f" y="18">%s</text>`, lx+20, label)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// Colors of the series kinds.
const (
	colDemand   = "#9e9e9e"
	colAdmitted = "#1a73e8"
	colIdeal    = "#188038"
	colGrant    = "#e37400"
	colDenied   = "#d93025"
)

// regionPalette tells regions apart in charts with one line per region.
var regionPalette = []string{"#1a73e8", "#e37400", "#188038", "#9334e6", "#d93025", "#12b5cb", "#795548", "#f538a0"}

func regionColor(i int) string { return regionPalette[i%len(regionPalette)] }
