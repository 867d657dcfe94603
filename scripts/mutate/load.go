package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// A srcFile is one non-test file of the package under test.
type srcFile struct {
	rel string // path as printed (relative to the working directory)
	abs string // the path the overlay replaces
	src []byte
	ast *ast.File // nil for a Lua file
	// lua: an embedded Lua source (a Redis script), mutated from its
	// tokens (see lua.go) and never type-checked.
	lua bool
}

// A pkg is the package under test, parsed and (when its dependencies'
// export data could be listed) type-checked.
type pkg struct {
	path  string // import path
	fset  *token.FileSet
	files []*srcFile
	// luaFiles are the package's embedded .lua files: cmd/go honours
	// -overlay for //go:embed, so a mutated script reaches the test
	// binary the same way a mutated Go file does.
	luaFiles []*srcFile
	info     *types.Info
	conf     *types.Config
	// usesRapid: the tests import pgregory.net/rapid.
	usesRapid bool
}

// load lists dir's package with the go command (so build constraints pick
// the same files the build does), parses its non-test files and
// type-checks them against its dependencies' export data.
func load(ctx context.Context, dir string, nice []string) (*pkg, error) {
	out, err := goCmd(ctx, nice, "list", "-f", "{{.ImportPath}}\n{{.Dir}}\n{{range .GoFiles}}{{.}} {{end}}\n{{range .CgoFiles}}{{.}} {{end}}\n{{range .TestImports}}{{.}} {{end}}{{range .XTestImports}}{{.}} {{end}}\n{{range .EmbedFiles}}{{.}} {{end}}", dir)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	lines := strings.Split(string(out), "\n")
	if len(lines) < 6 {
		return nil, fmt.Errorf("listing %s: unexpected output %q", dir, out)
	}
	if strings.TrimSpace(lines[3]) != "" {
		return nil, fmt.Errorf("%s uses cgo, which the overlay cannot mutate reliably", dir)
	}
	p := &pkg{path: lines[0], fset: token.NewFileSet(), usesRapid: slices.Contains(strings.Fields(lines[4]), "pgregory.net/rapid")}
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	read := func(name string) (*srcFile, error) {
		abs := filepath.Join(lines[1], name)
		src, err := os.ReadFile(abs)
		if err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(wd, abs)
		if err != nil || strings.HasPrefix(rel, "..") {
			rel = abs
		}
		return &srcFile{rel: rel, abs: abs, src: src}, nil
	}
	for _, name := range strings.Fields(lines[2]) {
		f, err := read(name)
		if err != nil {
			return nil, err
		}
		if f.ast, err = parser.ParseFile(p.fset, f.abs, f.src, parser.ParseComments|parser.SkipObjectResolution); err != nil {
			return nil, err
		}
		p.files = append(p.files, f)
	}
	for _, name := range strings.Fields(lines[5]) {
		if !strings.HasSuffix(name, ".lua") {
			continue
		}
		f, err := read(name)
		if err != nil {
			return nil, err
		}
		f.lua = true
		p.luaFiles = append(p.luaFiles, f)
	}
	if len(p.files) == 0 {
		return nil, fmt.Errorf("%s has no Go files", dir)
	}
	p.typecheck(ctx, dir, nice)
	return p, nil
}

// typecheck fills p.info. Without it the tool still works: mutants are
// only filtered less and more of them are counted as not compiling.
func (p *pkg) typecheck(ctx context.Context, dir string, nice []string) {
	out, err := goCmd(ctx, nice, "list", "-export", "-deps", "-json=ImportPath,Export", dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mutate: no type information (%v); continuing without\n", err)
		return
	}
	exports := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var e struct{ ImportPath, Export string }
		if err := dec.Decode(&e); err == io.EOF {
			break
		} else if err != nil {
			fmt.Fprintf(os.Stderr, "mutate: reading go list -export: %v; continuing without types\n", err)
			return
		}
		exports[e.ImportPath] = e.Export
	}
	imp := importer.ForCompiler(p.fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	conf := &types.Config{Importer: imp}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}}
	asts := make([]*ast.File, len(p.files))
	for i, f := range p.files {
		asts[i] = f.ast
	}
	if _, err := conf.Check(p.path, p.fset, asts, info); err != nil {
		fmt.Fprintf(os.Stderr, "mutate: type-checking %s: %v; continuing without types\n", p.path, err)
		return
	}
	p.info, p.conf = info, conf
}

// compiles reports whether the package still type-checks with m applied,
// so a mutant that cannot build costs no go test run. Without type
// information, or for a Lua mutant, it answers true and go test finds out
// (for Lua, through Redis refusing to load the script: see runner.try).
func (p *pkg) compiles(m *mutant) bool {
	if p.conf == nil || m.file.lua {
		return true
	}
	var asts []*ast.File
	for _, f := range p.files {
		a := f.ast
		if f == m.file {
			var err error
			// The other files' syntax trees are reused: the checker
			// only reads them.
			a, err = parser.ParseFile(p.fset, f.abs, m.apply(), parser.SkipObjectResolution)
			if err != nil {
				return false
			}
		}
		asts = append(asts, a)
	}
	conf := *p.conf
	conf.Error = func(error) {} // collect nothing; the first error decides
	_, err := conf.Check(p.path, p.fset, asts, nil)
	return err == nil
}

// goCmd runs the go command (under nice) and returns its stdout.
func goCmd(ctx context.Context, nice []string, args ...string) ([]byte, error) {
	argv := append(append([]string{}, nice...), append([]string{"go"}, args...)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, firstLines(stderr.String(), 5))
	}
	return out, nil
}

func firstLines(s string, n int) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(s))
	for i := 0; i < n && sc.Scan(); i++ {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(sc.Text())
	}
	return b.String()
}
