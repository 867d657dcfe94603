package observability

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
)

// This file holds a small PromQL reader: enough of the language to find
// every series name an expression selects, the label names it matches and
// groups on, and the function each selector is an argument of. It is no
// evaluator; it refuses what it does not understand instead of guessing,
// so an expression it cannot read fails the tests rather than passing them
// unchecked.

type tokenKind int

const (
	tokIdent    tokenKind = iota // metric, label, function or keyword
	tokNumber                    // number or duration outside brackets
	tokString                    // quoted string (text without quotes)
	tokVariable                  // Grafana variable: $name or ${name...}
	tokRange                     // [ ... ] (range or subquery), text between brackets
	tokPunct                     // ( ) { } ,
	tokOperator                  // arithmetic, comparison and matcher operators
)

type lexeme struct {
	kind tokenKind
	text string
	pos  int // byte offset in the expression
}

// operators longest first so "==" wins over "=".
var operators = []string{"==", "!=", "=~", "!~", ">=", "<=", ">", "<", "=", "+", "-", "*", "/", "%", "^", "@"}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentPart(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// lex splits a PromQL expression (possibly holding Grafana variables) into
// tokens. Comments (# to the end of the line) are dropped.
func lex(expr string) ([]lexeme, error) {
	var toks []lexeme
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'':
			j := i + 1
			for ; j < len(expr) && expr[j] != c; j++ {
				if expr[j] == '\\' {
					j++
				}
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("offset %d: unterminated string", i)
			}
			toks = append(toks, lexeme{tokString, expr[i+1 : j], i})
			i = j + 1
		case c == '`':
			j := strings.IndexByte(expr[i+1:], '`')
			if j < 0 {
				return nil, fmt.Errorf("offset %d: unterminated raw string", i)
			}
			toks = append(toks, lexeme{tokString, expr[i+1 : i+1+j], i})
			i += j + 2
		case c == '[':
			j := strings.IndexByte(expr[i+1:], ']')
			if j < 0 {
				return nil, fmt.Errorf("offset %d: unterminated [", i)
			}
			body := strings.TrimSpace(expr[i+1 : i+1+j])
			if body == "" || strings.ContainsAny(body, "[(){}\"'") {
				return nil, fmt.Errorf("offset %d: [%s] is not a range or subquery", i, body)
			}
			toks = append(toks, lexeme{tokRange, body, i})
			i += j + 2
		case c == ']':
			return nil, fmt.Errorf("offset %d: unexpected ]", i)
		case c == '$':
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("offset %d: unterminated ${", i)
				}
				j += k + 1
			} else {
				for j < len(expr) && isIdentPart(expr[j]) {
					j++
				}
			}
			if j == i+1 {
				return nil, fmt.Errorf("offset %d: lone $", i)
			}
			toks = append(toks, lexeme{tokVariable, expr[i:j], i})
			i = j
		case isDigit(c) || (c == '.' && i+1 < len(expr) && isDigit(expr[i+1])):
			// Numbers, durations (5m, 1h30m) and exponents (1e3): a run of
			// digits, dots and letters. A sign after an exponent is lexed
			// as an operator, which does not matter for name extraction.
			j := i
			for j < len(expr) && (isIdentPart(expr[j]) && expr[j] != ':' || expr[j] == '.') {
				j++
			}
			toks = append(toks, lexeme{tokNumber, expr[i:j], i})
			i = j
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdentPart(expr[j]) {
				j++
			}
			toks = append(toks, lexeme{tokIdent, expr[i:j], i})
			i = j
		case strings.IndexByte("(){},", c) >= 0:
			toks = append(toks, lexeme{tokPunct, string(c), i})
			i++
		default:
			op := ""
			for _, o := range operators {
				if strings.HasPrefix(expr[i:], o) {
					op = o
					break
				}
			}
			if op == "" {
				return nil, fmt.Errorf("offset %d: unexpected character %q", i, c)
			}
			toks = append(toks, lexeme{tokOperator, op, i})
			i += len(op)
		}
	}
	return toks, nil
}

// functions are the PromQL functions this repository may call; a name
// outside the list is refused, so a typo cannot pass as a function.
var functions = map[string]bool{
	"abs": true, "absent": true, "absent_over_time": true, "avg_over_time": true,
	"ceil": true, "changes": true, "clamp": true, "clamp_max": true, "clamp_min": true,
	"count_over_time": true, "delta": true, "deriv": true, "exp": true, "floor": true,
	"histogram_quantile": true, "idelta": true, "increase": true, "irate": true,
	"last_over_time": true, "max_over_time": true, "min_over_time": true,
	"predict_linear": true, "present_over_time": true, "quantile_over_time": true,
	"rate": true, "resets": true, "round": true, "scalar": true, "sgn": true,
	"sort": true, "sort_desc": true, "sqrt": true, "stddev_over_time": true,
	"sum_over_time": true, "time": true, "timestamp": true, "vector": true,
}

// aggregations may carry a by/without clause before their parenthesis.
var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "count": true,
	"stddev": true, "stdvar": true, "topk": true, "bottomk": true, "quantile": true,
	"count_values": true,
}

// counterFunctions only make sense on counters (and the counter series of
// histograms).
var counterFunctions = map[string]bool{"rate": true, "irate": true, "increase": true, "resets": true}

// labelListKeywords are followed by a parenthesised list of label names.
var labelListKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// binaryKeywords are the word operators and modifiers that are not names.
var binaryKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true}

// selector is one series selector of an expression.
type selector struct {
	name string
	// matchers are its label matchers, in order.
	matchers []matcher
	// fn is the innermost function or aggregation it is an argument of ("" at top level).
	fn  string
	pos int
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

type frame struct {
	fn        string // function or aggregation this parenthesis belongs to; "" for grouping
	hasBucket bool   // a _bucket series was selected inside (for histogram_quantile)
}

// parse reads expr into its selectors and grouping labels, checking that
// brackets balance, that every function is known, that every selector has
// a metric name, and that histogram_quantile is given a _bucket series.
func parse(expr string) (parsed, error) {
	toks, err := lex(expr)
	if err != nil {
		return parsed{}, err
	}
	if len(toks) == 0 {
		return parsed{}, errors.New("empty expression")
	}
	var (
		out     parsed
		stack   []frame
		pending string // aggregation waiting for its ( after a by/without clause
	)
	peek := func(i int) lexeme {
		if i < len(toks) {
			return toks[i]
		}
		return lexeme{kind: tokPunct, text: "", pos: len(expr)}
	}
	innermost := func() string {
		for k := len(stack) - 1; k >= 0; k-- {
			if stack[k].fn != "" {
				return stack[k].fn
			}
		}
		return ""
	}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch t.kind {
		case tokIdent:
			next := peek(i + 1)
			switch {
			case labelListKeywords[t.text]:
				if next.text != "(" {
					if t.text == "group_left" || t.text == "group_right" {
						continue
					}
					return out, fmt.Errorf("offset %d: %s needs a label list", t.pos, t.text)
				}
				j := i + 2
				for ; j < len(toks) && toks[j].text != ")"; j++ {
					switch {
					case toks[j].kind == tokIdent:
						out.grouping = append(out.grouping, toks[j].text)
					case toks[j].text == ",":
					default:
						return out, fmt.Errorf("offset %d: %q in the label list of %s", toks[j].pos, toks[j].text, t.text)
					}
				}
				if j >= len(toks) {
					return out, fmt.Errorf("offset %d: unclosed label list of %s", t.pos, t.text)
				}
				i = j
			case binaryKeywords[t.text]:
			case next.kind == tokPunct && next.text == "(":
				if !functions[t.text] && !aggregations[t.text] {
					return out, fmt.Errorf("offset %d: unknown function %q", t.pos, t.text)
				}
				stack = append(stack, frame{fn: t.text})
				i++
			case aggregations[t.text] && (next.text == "by" || next.text == "without"):
				pending = t.text
			case functions[t.text] || aggregations[t.text]:
				return out, fmt.Errorf("offset %d: function %q without arguments", t.pos, t.text)
			default:
				sel := selector{name: t.text, fn: innermost(), pos: t.pos}
				if next.text == "{" {
					j := i + 2
					for ; j < len(toks) && toks[j].text != "}"; j++ {
						if toks[j].text == "," {
							continue
						}
						if j+2 >= len(toks) || toks[j].kind != tokIdent || toks[j+1].kind != tokOperator ||
							!slices.Contains([]string{"=", "!=", "=~", "!~"}, toks[j+1].text) ||
							(toks[j+2].kind != tokString) {
							return out, fmt.Errorf("offset %d: malformed matcher in the selector of %s", toks[j].pos, t.text)
						}
						sel.matchers = append(sel.matchers, matcher{toks[j].text, toks[j+1].text, toks[j+2].text})
						j += 2
					}
					if j >= len(toks) {
						return out, fmt.Errorf("offset %d: unclosed selector of %s", t.pos, t.text)
					}
					i = j
				}
				if strings.HasSuffix(sel.name, "_bucket") {
					for k := range stack {
						stack[k].hasBucket = true
					}
				}
				out.selectors = append(out.selectors, sel)
			}
		case tokPunct:
			switch t.text {
			case "(":
				stack = append(stack, frame{fn: pending})
				pending = ""
			case ")":
				if len(stack) == 0 {
					return out, fmt.Errorf("offset %d: unbalanced )", t.pos)
				}
				top := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				if top.fn == "histogram_quantile" && !top.hasBucket {
					return out, fmt.Errorf("offset %d: histogram_quantile without a _bucket series", t.pos)
				}
			case "{":
				return out, fmt.Errorf("offset %d: selector without a metric name", t.pos)
			case "}":
				return out, fmt.Errorf("offset %d: unbalanced }", t.pos)
			}
		}
	}
	if len(stack) > 0 {
		return out, errors.New("unbalanced (: missing )")
	}
	if pending != "" {
		return out, fmt.Errorf("aggregation %s has no argument", pending)
	}
	if len(out.selectors) == 0 {
		return out, errors.New("selects no series")
	}
	return out, nil
}

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
