package main

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"strconv"
	"strings"
)

// An edit replaces src[off:end] with text. Mutants are applied as byte
// edits on the original source rather than by printing a changed AST, so a
// mutant keeps every line and column of the original: the positions a
// failing test or the compiler reports are the original file's.
type edit struct {
	off, end int
	text     string
}

// A mutant is one small change to one file.
type mutant struct {
	file  *srcFile
	pos   token.Position
	kind  string
	orig  string // what the site reads now, for the report
	repl  string // what the mutant reads
	edits []edit
}

func (m *mutant) String() string {
	return fmt.Sprintf("%s:%d:%d: %s -> %s", m.file.rel, m.pos.Line, m.pos.Column, m.orig, m.repl)
}

// apply returns the mutant's source. Edits never overlap and are kept in
// ascending order of offset.
func (m *mutant) apply() []byte {
	src := m.file.src
	var b strings.Builder
	b.Grow(len(src) + 16)
	last := 0
	for _, e := range m.edits {
		b.Write(src[last:e.off])
		b.WriteString(e.text)
		last = e.end
	}
	b.Write(src[last:])
	return []byte(b.String())
}

// The operator replacements. Relational operators get their boundary
// (< to <=) and their mirror (< to >); the other binary operators swap
// with their counterpart.
var binaryMutations = map[token.Token][]token.Token{
	token.LSS:  {token.LEQ, token.GTR},
	token.LEQ:  {token.LSS, token.GEQ},
	token.GTR:  {token.GEQ, token.LSS},
	token.GEQ:  {token.GTR, token.LEQ},
	token.EQL:  {token.NEQ},
	token.NEQ:  {token.EQL},
	token.ADD:  {token.SUB},
	token.SUB:  {token.ADD},
	token.MUL:  {token.QUO},
	token.QUO:  {token.MUL},
	token.LAND: {token.LOR},
	token.LOR:  {token.LAND},
}

var assignMutations = map[token.Token]token.Token{
	token.ADD_ASSIGN: token.SUB_ASSIGN,
	token.SUB_ASSIGN: token.ADD_ASSIGN,
	token.MUL_ASSIGN: token.QUO_ASSIGN,
	token.QUO_ASSIGN: token.MUL_ASSIGN,
}

// maxOffByOne is the largest integer literal that also gets its n-1 and
// n+1 mutants: small literals are counts, indices and limits where an
// off-by-one matters; large ones are scales (1e9, 1000) whose
// neighbours no test can tell apart.
const maxOffByOne = 64

// sites lists every mutant of f. info may be nil (no type information):
// then mutants that need types (returning a zero value, keeping string
// concatenation) are not produced or not filtered, and more of them fail
// to compile.
func sites(fset *token.FileSet, f *srcFile, info *types.Info) []*mutant {
	var out []*mutant
	tf := fset.File(f.ast.Pos())
	off := func(p token.Pos) int { return tf.Offset(p) }
	text := func(a, b token.Pos) string { return string(f.src[off(a):off(b)]) }
	add := func(at token.Pos, kind, orig, repl string, edits ...edit) {
		out = append(out, &mutant{file: f, pos: fset.Position(at), kind: kind, orig: orig, repl: repl, edits: edits})
	}
	isString := func(e ast.Expr) bool {
		if info == nil {
			return false
		}
		t := info.TypeOf(e)
		if t == nil {
			return false
		}
		b, ok := t.Underlying().(*types.Basic)
		return ok && b.Info()&types.IsString != 0
	}

	var stack []ast.Node
	ast.Inspect(f.ast, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		stack = append(stack, n)
		switch n := n.(type) {
		case *ast.GenDecl:
			// Imports have nothing to mutate, and mutating a type's
			// array lengths only breaks the build.
			if n.Tok == token.IMPORT || n.Tok == token.TYPE {
				stack = stack[:len(stack)-1]
				return false
			}
		case *ast.BinaryExpr:
			for _, to := range binaryMutations[n.Op] {
				if (n.Op == token.ADD || to == token.ADD) && isString(n.X) {
					continue
				}
				p := off(n.OpPos)
				add(n.OpPos, "binary", n.Op.String(), to.String(), edit{p, p + len(n.Op.String()), to.String()})
			}
		case *ast.AssignStmt:
			if to, ok := assignMutations[n.Tok]; ok && !(n.Tok == token.ADD_ASSIGN && len(n.Lhs) == 1 && isString(n.Lhs[0])) {
				p := off(n.TokPos)
				add(n.TokPos, "assign", n.Tok.String(), to.String(), edit{p, p + len(n.Tok.String()), to.String()})
			}
		case *ast.IncDecStmt:
			to := token.DEC
			if n.Tok == token.DEC {
				to = token.INC
			}
			p := off(n.TokPos)
			add(n.TokPos, "incdec", n.Tok.String(), to.String(), edit{p, p + 2, to.String()})
		case *ast.IfStmt:
			c := short(text(n.Cond.Pos(), n.Cond.End()))
			add(n.Cond.Pos(), "negate", "if "+c, "if !("+c+")",
				edit{off(n.Cond.Pos()), off(n.Cond.Pos()), "!("},
				edit{off(n.Cond.End()), off(n.Cond.End()), ")"})
		case *ast.UnaryExpr:
			if n.Op == token.NOT {
				x := short(text(n.X.Pos(), n.X.End()))
				p := off(n.OpPos)
				add(n.OpPos, "not", "!"+x, x, edit{p, p + 1, ""})
			}
		case *ast.BasicLit:
			for _, to := range literalMutations(n) {
				add(n.Pos(), "literal", n.Value, to, edit{off(n.Pos()), off(n.End()), to})
			}
		case *ast.Ident:
			if n.Name != "true" && n.Name != "false" {
				break
			}
			if info != nil {
				if _, ok := info.Uses[n].(*types.Const); !ok || info.Uses[n].Parent() != types.Universe {
					break
				}
			}
			to := "false"
			if n.Name == "false" {
				to = "true"
			}
			add(n.Pos(), "bool", n.Name, to, edit{off(n.Pos()), off(n.End()), to})
		case *ast.BranchStmt:
			if n.Tok != token.CONTINUE && n.Tok != token.BREAK {
				break
			}
			// An unlabelled break directly in a switch or select case
			// only ends a case that ends anyway: removing it is an
			// equivalent mutant, so it is not made.
			if n.Tok == token.BREAK && n.Label == nil && !breaksLoop(stack) {
				break
			}
			add(n.Pos(), "branch", text(n.Pos(), n.End()), "(removed)", edit{off(n.Pos()), off(n.End()), ""})
		case *ast.ReturnStmt:
			if info == nil {
				break
			}
			for _, r := range n.Results {
				if !isNumeric(info.TypeOf(r)) {
					continue
				}
				if tv, ok := info.Types[r]; ok && tv.Value != nil && constant.Sign(tv.Value) == 0 {
					continue // already zero
				}
				add(r.Pos(), "return", "return "+short(text(r.Pos(), r.End())), "return 0", edit{off(r.Pos()), off(r.End()), "0"})
			}
		}
		return true
	})
	return out
}

// breaksLoop reports whether an unlabelled break at the top of stack
// leaves a for loop (rather than a switch or select).
func breaksLoop(stack []ast.Node) bool {
	for i := len(stack) - 1; i >= 0; i-- {
		switch stack[i].(type) {
		case *ast.ForStmt, *ast.RangeStmt:
			return true
		case *ast.SwitchStmt, *ast.TypeSwitchStmt, *ast.SelectStmt, *ast.FuncLit, *ast.FuncDecl:
			return false
		}
	}
	return false
}

func isNumeric(t types.Type) bool {
	if t == nil {
		return false
	}
	b, ok := t.Underlying().(*types.Basic)
	return ok && b.Info()&types.IsNumeric != 0 && b.Info()&types.IsComplex == 0
}

// intMutations moves a non-negative integer literal by one: 0 becomes 1,
// 1 becomes 0 and 2, and others up to maxOffByOne one down and one up
// (larger ones are scales; see maxOffByOne).
func intMutations(v int64) []string {
	switch {
	case v == 0:
		return []string{"1"}
	case v == 1:
		return []string{"0", "2"}
	case v <= maxOffByOne:
		return []string{strconv.FormatInt(v-1, 10), strconv.FormatInt(v+1, 10)}
	}
	return nil
}

// literalMutations: 0 and 1 swap; other small integers move by one; other
// floats become 0.
func literalMutations(l *ast.BasicLit) []string {
	switch l.Kind {
	case token.INT:
		v, err := strconv.ParseInt(strings.ReplaceAll(l.Value, "_", ""), 0, 64)
		if err != nil {
			return nil
		}
		return intMutations(v)
	case token.FLOAT:
		v, err := strconv.ParseFloat(strings.ReplaceAll(l.Value, "_", ""), 64)
		if err != nil {
			return nil
		}
		switch v {
		case 0:
			return []string{"1.0"}
		case 1:
			return []string{"0.0"}
		default:
			return []string{"0.0"}
		}
	}
	return nil
}

// short keeps a source excerpt to one line of reasonable length for the
// report.
func short(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}
