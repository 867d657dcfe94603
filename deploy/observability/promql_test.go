package observability

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
)

// PromQL is read by Prometheus's own parser
// (github.com/prometheus/prometheus/promql/parser), run by the small
// program in ./promql: a module of its own, so that the Prometheus module's
// requirements (a newer Go, newer versions of modules Sluice uses) stay out
// of Sluice's go.mod. The tests build it once and send it every expression;
// it answers with the selectors (name, matchers, the functions around them)
// and the grouping labels. An expression it cannot parse fails the tests.

// selector is one series selector of an expression.
type selector struct {
	name string
	// matchers are its label matchers, in order.
	matchers []matcher
	// fn is the innermost function or aggregation it is an argument of ("" at top level).
	fn string
	// enclosing are all the functions and aggregations it is an argument
	// of, outermost first.
	enclosing []string
	pos       int
}

// matcher is one label matcher of a selector: label op "value".
type matcher struct {
	label, op, value string
}

// parsed is what an expression selects and groups on.
type parsed struct {
	selectors []selector
	// grouping are label names of by, without, on, ignoring and group_x clauses.
	grouping []string
}

// functions around a selector that only make sense on counters (and the
// counter series of histograms).
var counterFunctions = map[string]bool{"rate": true, "irate": true, "increase": true, "resets": true}

// parse reads expr into its selectors and grouping labels with the real
// PromQL parser, checking that every selector has a metric name, that
// histogram_quantile is given only _bucket series, and that it selects
// something. Grafana variables outside strings ($__rate_interval in a
// range) are read as a duration.
func parse(expr string) (parsed, error) {
	r, err := promqlReader()
	if err != nil {
		return parsed{}, err
	}
	ans, err := r.read(withoutVariables(expr))
	if err != nil {
		return parsed{}, err
	}
	if ans.Error != "" {
		return parsed{}, errors.New(ans.Error)
	}
	var out parsed
	for _, s := range ans.Selectors {
		if s.Name == "" {
			return out, fmt.Errorf("offset %d: selector without a metric name", s.Pos)
		}
		sel := selector{name: s.Name, pos: s.Pos, enclosing: s.Enclosing}
		if n := len(s.Enclosing); n > 0 {
			sel.fn = s.Enclosing[n-1]
		}
		for _, m := range s.Matchers {
			sel.matchers = append(sel.matchers, matcher{m.Label, m.Op, m.Value})
		}
		if slices.Contains(s.Enclosing, "histogram_quantile") && !strings.HasSuffix(s.Name, "_bucket") {
			return out, fmt.Errorf("offset %d: histogram_quantile without a _bucket series (given %s)", s.Pos, s.Name)
		}
		out.selectors = append(out.selectors, sel)
	}
	out.grouping = ans.Grouping
	if len(out.selectors) == 0 {
		return out, errors.New("selects no series")
	}
	return out, nil
}

// variableRefRE matches a Grafana variable: $name or ${name...}.
var variableRefRE = regexp.MustCompile(`^\$(\{[^}]*\}|[A-Za-z0-9_]+)`)

// withoutVariables replaces every Grafana variable outside a string with
// the duration 5m (they stand for ranges: [$__rate_interval]); variables
// inside strings are label values and stay.
func withoutVariables(expr string) string {
	var b strings.Builder
	var quote byte
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case quote != 0:
			b.WriteByte(c)
			if c == '\\' && quote != '`' && i+1 < len(expr) {
				i++
				b.WriteByte(expr[i])
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'' || c == '`':
			quote = c
			b.WriteByte(c)
		case c == '$':
			if m := variableRefRE.FindString(expr[i:]); m != "" {
				b.WriteString("5m")
				i += len(m) - 1
				continue
			}
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// promqlAnswer is the reader's answer for one expression (see ./promql).
type promqlAnswer struct {
	Selectors []struct {
		Name     string `json:"name"`
		Matchers []struct {
			Label string `json:"label"`
			Op    string `json:"op"`
			Value string `json:"value"`
		} `json:"matchers"`
		Enclosing []string `json:"enclosing"`
		Pos       int      `json:"pos"`
	} `json:"selectors"`
	Grouping []string `json:"grouping"`
	Error    string   `json:"error"`
}

// promqlProc is the running reader. Safe for concurrent use.
type promqlProc struct {
	mu  sync.Mutex
	in  io.Writer
	out *json.Decoder
}

func (p *promqlProc) read(expr string) (promqlAnswer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	req, err := json.Marshal(map[string]string{"expr": expr})
	if err != nil {
		return promqlAnswer{}, err
	}
	if _, err := p.in.Write(append(req, '\n')); err != nil {
		return promqlAnswer{}, fmt.Errorf("PromQL reader: %w", err)
	}
	var ans promqlAnswer
	if err := p.out.Decode(&ans); err != nil {
		return promqlAnswer{}, fmt.Errorf("PromQL reader: %w", err)
	}
	return ans, nil
}

// promqlReader builds ./promql once and starts it; it runs until the test
// binary exits (its stdin closes).
var promqlReader = sync.OnceValues(func() (*promqlProc, error) {
	dir, err := os.MkdirTemp("", "sluice-promql-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir) // a started program runs on without its file
	bin := filepath.Join(dir, "promql")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = "promql"
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the PromQL reader (deploy/observability/promql): %w\n%s", err, out)
	}
	cmd := exec.Command(bin)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &promqlProc{in: in, out: json.NewDecoder(bufio.NewReader(out))}, nil
})

// family is one metric family a component exports.
type family struct {
	name string
	// kind is counter, gauge, histogram, summary or untyped; "" when the
	// collector neither is a typed vector nor emitted a sample to tell.
	kind   string
	labels map[string]bool
	// sources name the components that export it.
	sources []string
}

// targetLabels are attached by the Prometheus scrape configuration, not by
// the code: job and instance always, namespace and pod by the Kubernetes
// relabelling the deployment guide asks for.
var targetLabels = map[string]bool{"job": true, "instance": true, "namespace": true, "pod": true}

// catalog resolves names: the families the code exports and the series
// recording rules produce.
type catalog struct {
	families map[string]*family
	// recorded maps a recording rule's name to the labels it keeps.
	recorded map[string]map[string]bool
	// recordedSources maps a recording rule's name to the packages behind
	// the series it reads.
	recordedSources map[string][]string
	// literals maps a package (like "pkg/regional") to the string literals
	// of its code: the label values it can write.
	literals map[string]map[string]bool
}

// resolved is what a selected series name turned out to be.
type resolved struct {
	fam    *family
	suffix string // _bucket, _sum or _count of a histogram or summary; "" otherwise
	// labels the series carries.
	labels map[string]bool
	// counter says the series only ever grows (rate and increase apply).
	counter bool
	// sources are the packages whose code writes the series' label values.
	sources []string
}

func (c *catalog) resolve(name string) (resolved, error) {
	if f, ok := c.families[name]; ok {
		switch f.kind {
		case "histogram", "summary":
			return resolved{}, fmt.Errorf("%s is a %s: select %s_bucket, %s_sum or %s_count", name, f.kind, name, name, name)
		}
		// A family whose kind the collectors did not reveal is a counter
		// by the naming convention Prometheus tooling relies on.
		counter := f.kind == "counter" || (f.kind == "" && strings.HasSuffix(name, "_total"))
		return resolved{fam: f, labels: f.labels, counter: counter, sources: f.sources}, nil
	}
	if labels, ok := c.recorded[name]; ok {
		return resolved{labels: labels, sources: c.recordedSources[name]}, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		f, ok := c.families[base]
		if !ok {
			break
		}
		switch {
		case f.kind == "histogram", f.kind == "summary" && suffix != "_bucket":
			labels := copySet(f.labels)
			if suffix == "_bucket" {
				labels["le"] = true
			}
			return resolved{fam: f, suffix: suffix, labels: labels, counter: true, sources: f.sources}, nil
		case f.kind == "":
			return resolved{}, fmt.Errorf("%s: cannot tell whether %s (exported by %s) is a histogram", name, base, strings.Join(f.sources, ", "))
		default:
			return resolved{}, fmt.Errorf("%s: %s is a %s, it has no %s series", name, base, f.kind, suffix)
		}
	}
	return resolved{}, fmt.Errorf("%s is not exported by any component", name)
}

func copySet(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// checked is the outcome of checking one expression: the labels its series
// carry (for legends and annotations) and every problem found.
type checked struct {
	parsed
	labels map[string]bool
	errs   []error
}

// check parses expr and checks every selector against the catalog: the
// name must be exported (or recorded), matcher labels must exist on it,
// rate-like functions must get counters, and grouping labels must exist on
// some selected series.
func (c *catalog) check(expr string) checked {
	var out checked
	p, err := parse(expr)
	if err != nil {
		out.errs = append(out.errs, err)
		return out
	}
	out.parsed = p
	out.labels = copySet(targetLabels)
	for _, s := range p.selectors {
		r, err := c.resolve(s.name)
		if err != nil {
			out.errs = append(out.errs, err)
			continue
		}
		for l := range r.labels {
			out.labels[l] = true
		}
		for _, m := range s.matchers {
			if !r.labels[m.label] && !targetLabels[m.label] {
				out.errs = append(out.errs, fmt.Errorf("%s has no label %q (it has %s)", s.name, m.label, sortedKeys(r.labels)))
				continue
			}
			for _, v := range c.unknownValues(r, m) {
				out.errs = append(out.errs, fmt.Errorf("%s{%s%s%q}: no code in %s writes the value %q",
					s.name, m.label, m.op, m.value, strings.Join(r.sources, ", "), v))
			}
		}
		if counterFunctions[s.fn] && !r.counter {
			kind := "a recorded series"
			if r.fam != nil {
				kind = "a " + r.fam.kind
			}
			out.errs = append(out.errs, fmt.Errorf("%s(%s): %s is %s, not a counter", s.fn, s.name, s.name, kind))
		}
	}
	for _, l := range p.grouping {
		if !out.labels[l] {
			out.errs = append(out.errs, fmt.Errorf("grouping by %q, a label none of the selected series carries", l))
		}
	}
	return out
}

func sortedKeys(m map[string]bool) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return "{" + strings.Join(keys, ",") + "}"
}

// dataLabels take their values from the config or the deployment (class,
// tier and region names, scrape targets), not from the code.
var dataLabels = map[string]bool{
	"class": true, "tier": true, "region": true, "le": true,
	"job": true, "instance": true, "namespace": true, "pod": true,
}

// computedValues are label values the code writes without spelling them
// out: gRPC code names (status.Code(err).String()) and booleans
// (strconv.FormatBool).
var computedValues = func() map[string]bool {
	out := map[string]bool{"true": true, "false": true}
	for code := range 17 {
		out[codes.Code(code).String()] = true
	}
	return out
}()

// plainAlternatives matches a regex that is only a list of literal values.
var plainAlternatives = regexp.MustCompile(`^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$`)

// unknownValues returns the values a matcher names that no source of the
// series writes. Matchers on data labels, with Grafana variables, or with
// real regular expressions are not checked.
func (c *catalog) unknownValues(r resolved, m matcher) []string {
	if dataLabels[m.label] || strings.Contains(m.value, "$") || len(r.sources) == 0 {
		return nil
	}
	values := []string{m.value}
	if m.op == "=~" || m.op == "!~" {
		if !plainAlternatives.MatchString(m.value) {
			return nil
		}
		values = strings.Split(m.value, "|")
	}
	var unknown []string
	for _, v := range values {
		if v == "" || computedValues[v] {
			continue
		}
		known := false
		for _, src := range r.sources {
			if c.literals[src][v] {
				known = true
				break
			}
		}
		if !known {
			unknown = append(unknown, v)
		}
	}
	return unknown
}
