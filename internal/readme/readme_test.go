// Package readme checks that README.md's code works as written.
package readme

import (
	"bytes"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// goSnippet returns the first ```go block of README.md's "Using it from Go"
// section.
func goSnippet(t *testing.T) []byte {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Using it from Go\n")
	if !ok {
		t.Fatal(`README.md has no "## Using it from Go" section`)
	}
	if next := strings.Index(section, "\n## "); next >= 0 {
		section = section[:next]
	}
	_, code, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		t.Fatal(`README.md's "Using it from Go" section has no go code block`)
	}
	code, _, ok = strings.Cut(code, "\n```")
	if !ok {
		t.Fatal("README.md's go code block is not closed")
	}
	return []byte(code + "\n")
}

// TestReadmeGoSnippetCompiles type-checks and vets the snippet as a
// package of this module (a directory starting with "_", which ./...
// patterns skip, removed afterwards), and checks it is gofmt-clean and
// passes a Prometheus registerer to the lease client.
func TestReadmeGoSnippetCompiles(t *testing.T) {
	src := goSnippet(t)
	if formatted, err := format.Source(src); err != nil {
		t.Fatalf("the README's Go snippet does not parse: %v", err)
	} else if !bytes.Equal(formatted, src) {
		t.Errorf("the README's Go snippet is not gofmt-formatted")
	}

	f, err := parser.ParseFile(token.NewFileSet(), "snippet.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	registerer := false
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		if sel, ok := lit.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Options" {
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "lease" {
				for _, e := range lit.Elts {
					if kv, ok := e.(*ast.KeyValueExpr); ok {
						if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Registerer" {
							registerer = true
						}
					}
				}
			}
		}
		return true
	})
	if !registerer {
		t.Error("the README's lease.Options sets no Registerer: the sluice_client_* metrics the dashboard and alerts read would not exist")
	}

	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		if _, statErr := os.Stat(goTool); statErr != nil {
			t.Fatalf("no go command to compile the snippet with: %v", err)
		}
	}
	dir, err := os.MkdirTemp(".", "_snippet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool, "vet", "./"+filepath.Base(dir))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's Go snippet does not compile as written (go vet: %v):\n%s", err, out)
	}
}
