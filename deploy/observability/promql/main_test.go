package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

func TestRead(t *testing.T) {
	p := parser.NewParser(parser.Options{})
	a := Read(p, `histogram_quantile(0.99, sum by (job, le) (rate(x_bucket{code!="OK"}[5m])))
		/ on (job) group_left (method) y`)
	if a.Error != "" {
		t.Fatal(a.Error)
	}
	if len(a.Selectors) != 2 {
		t.Fatalf("selectors %+v", a.Selectors)
	}
	s := a.Selectors[0]
	if s.Name != "x_bucket" || !slices.Equal(s.Enclosing, []string{"histogram_quantile", "sum", "rate"}) ||
		len(s.Matchers) != 1 || s.Matchers[0] != (Matcher{"code", "!=", "OK"}) {
		t.Fatalf("first selector %+v", s)
	}
	if a.Selectors[1].Name != "y" || len(a.Selectors[1].Enclosing) != 0 {
		t.Fatalf("second selector %+v", a.Selectors[1])
	}
	if !slices.Equal(a.Grouping, []string{"job", "method", "job", "le"}) && !slices.Equal(a.Grouping, []string{"job", "le", "job", "method"}) {
		t.Fatalf("grouping %q", a.Grouping)
	}
	for _, bad := range []string{`sum(rate(x[5m])`, `nosuchfunction(x)`, `x{a="b"`, `rate(x)`} {
		if a := Read(p, bad); a.Error == "" {
			t.Errorf("%s: read without error: %+v", bad, a)
		}
	}
}

func TestServe(t *testing.T) {
	in := strings.NewReader(`{"expr": "up == 0"}` + "\n" + `{"expr": "up{"}` + "\nnot json\n")
	var out bytes.Buffer
	if err := serve(in, &out); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&out)
	var answers []Answer
	for dec.More() {
		var a Answer
		if err := dec.Decode(&a); err != nil {
			t.Fatal(err)
		}
		answers = append(answers, a)
	}
	if len(answers) != 3 || answers[0].Error != "" || answers[0].Selectors[0].Name != "up" ||
		answers[1].Error == "" || !strings.HasPrefix(answers[2].Error, "bad request") {
		t.Fatalf("answers %+v", answers)
	}
}
