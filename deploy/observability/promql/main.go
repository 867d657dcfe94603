// Command promql reads PromQL expressions with Prometheus's own parser
// (github.com/prometheus/prometheus/promql/parser) for the tests of
// deploy/observability: one JSON request a line on stdin, one JSON answer
// a line on stdout, until stdin closes.
//
//	{"expr": "sum by (job) (rate(x_total{code!=\"OK\"}[5m]))"}
//	{"selectors": [{"name": "x_total", "matchers": [{"label": "code", "op": "!=", "value": "OK"}],
//	  "enclosing": ["sum", "rate"]}], "grouping": ["job"]}
//
// It is its own module so the Prometheus module's requirements (a newer Go
// and newer versions of modules Sluice also uses) stay out of Sluice's
// go.mod: the tests build it once and talk to it.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// Request is one expression to read.
type Request struct {
	Expr string `json:"expr"`
}

// Matcher is one label matcher of a selector.
type Matcher struct {
	Label string `json:"label"`
	Op    string `json:"op"`
	Value string `json:"value"`
}

// Selector is one series selector of the expression.
type Selector struct {
	Name     string    `json:"name"`
	Matchers []Matcher `json:"matchers,omitempty"`
	// Enclosing are the functions and aggregations the selector is an
	// argument of, outermost first.
	Enclosing []string `json:"enclosing,omitempty"`
	// Pos is the selector's byte offset in the expression.
	Pos int `json:"pos"`
}

// Answer is what an expression selects and groups on, or why it could not
// be read.
type Answer struct {
	Selectors []Selector `json:"selectors,omitempty"`
	// Grouping are the label names of by, without, on, ignoring and
	// group_left/group_right clauses.
	Grouping []string `json:"grouping,omitempty"`
	Error    string   `json:"error,omitempty"`
}

func main() {
	if err := serve(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "promql:", err)
		os.Exit(1)
	}
}

func serve(in io.Reader, out io.Writer) error {
	p := parser.NewParser(parser.Options{})
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	for sc.Scan() {
		var req Request
		var ans Answer
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			ans.Error = "bad request: " + err.Error()
		} else {
			ans = Read(p, req.Expr)
		}
		if err := enc.Encode(ans); err != nil {
			return err
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	return sc.Err()
}

// Read parses expr and lists its selectors and grouping labels.
func Read(p parser.Parser, expr string) Answer {
	e, err := p.ParseExpr(expr)
	if err != nil {
		return Answer{Error: err.Error()}
	}
	var ans Answer
	parser.Inspect(e, func(node parser.Node, path []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			sel := Selector{Name: n.Name, Pos: int(n.PosRange.Start)}
			for _, m := range n.LabelMatchers {
				if m.Name == labels.MetricName {
					if sel.Name == "" && m.Type == labels.MatchEqual {
						sel.Name = m.Value
					}
					continue
				}
				sel.Matchers = append(sel.Matchers, Matcher{Label: m.Name, Op: m.Type.String(), Value: m.Value})
			}
			for _, a := range path {
				switch a := a.(type) {
				case *parser.Call:
					sel.Enclosing = append(sel.Enclosing, a.Func.Name)
				case *parser.AggregateExpr:
					sel.Enclosing = append(sel.Enclosing, strings.ToLower(a.Op.String()))
				}
			}
			ans.Selectors = append(ans.Selectors, sel)
		case *parser.AggregateExpr:
			ans.Grouping = append(ans.Grouping, n.Grouping...)
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil {
				ans.Grouping = append(ans.Grouping, vm.MatchingLabels...)
				ans.Grouping = append(ans.Grouping, vm.Include...)
			}
		}
		return nil
	})
	return ans
}
