package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const tinyDir = "./testdata/tiny"

func loadTiny(t *testing.T) *pkg {
	t.Helper()
	p, err := load(context.Background(), tinyDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.info == nil {
		t.Fatal("tiny did not type-check")
	}
	return p
}

func find(ms []*mutant, s string) *mutant {
	for _, m := range ms {
		if strings.HasSuffix(m.String(), s) {
			return m
		}
	}
	return nil
}

// TestSites checks the mutants of the tiny package: the ones it must
// make, the string + it must not, and that edits keep positions.
func TestSites(t *testing.T) {
	p := loadTiny(t)
	ms := enumerate(p, options{})
	for _, want := range []string{
		"tiny.go:8:7: < -> <=",
		"tiny.go:8:7: < -> >",
		"tiny.go:8:5: if v < lo -> if !(v < lo)",
		"tiny.go:14:9: return v -> return 0",
		"tiny.go:21:38: 1 -> 2",
	} {
		if find(ms, want) == nil {
			t.Errorf("no mutant %q", want)
		}
	}
	for _, m := range ms {
		if m.pos.Line == 18 && m.kind == "binary" {
			t.Errorf("string concatenation mutated: %s", m)
		}
	}
	neg := find(ms, "tiny.go:8:5: if v < lo -> if !(v < lo)")
	src := string(neg.apply())
	if !strings.Contains(src, "\tif !(v < lo) {\n") {
		t.Errorf("negated source lacks the negation:\n%s", src)
	}
	if got, want := strings.Count(src, "\n"), strings.Count(string(neg.file.src), "\n"); got != want {
		t.Errorf("mutant has %d lines, original %d", got, want)
	}
	if p.compiles(find(ms, "tiny.go:21:38: 1 -> 2")) {
		t.Error("an out-of-range index compiles")
	}
	if !p.compiles(find(ms, "tiny.go:8:7: < -> <=")) {
		t.Error("< -> <= does not compile")
	}
}

// TestRunThroughOverlay runs the tool on Clamp's first condition: the
// mirrored operator and the negation are killed, the boundary survives
// (it is equivalent), and the source file is left as it was.
func TestRunThroughOverlay(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test four times")
	}
	out := runLeavingSourceAlone(t, tinyDir, filepath.Join(tinyDir, "tiny.go"), "tiny.go:8:7,tiny.go:8:5")
	if !strings.Contains(out, "tiny.go:8:7: < -> <=\n") {
		t.Error("the boundary mutant is not reported as surviving")
	}
	if strings.Contains(out, "< -> >\n") {
		t.Error("the mirrored mutant survived")
	}
	if !strings.Contains(out, "3 mutants run: 2 killed, 0 timed out, 1 survived (0 more not compiling); score 66.7%") {
		t.Error("wrong summary")
	}
}

// runLeavingSourceAlone runs the tool on the mutants at of the package in
// dir and returns its output; it fails the test when the run fails or
// changes file, the source the mutants are made from.
func runLeavingSourceAlone(t *testing.T, dir, file, at string) string {
	t.Helper()
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code, err := run(context.Background(), []string{"-nice", "0", "-timeout", "1m", "-at", at, dir}, &out, &errOut)
	if err != nil || code != 0 {
		t.Fatalf("run: code %d, %v\n%s%s", code, err, out.String(), errOut.String())
	}
	t.Log(out.String())
	after, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("%s was changed", file)
	}
	return out.String()
}
