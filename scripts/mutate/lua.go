package main

import (
	"go/token"
	"strconv"
	"strings"
)

// Lua sources (the Redis scripts a package embeds) are mutated from a
// token stream rather than a syntax tree: comments and string literals
// never reach the mutator, and the few constructs a mutant needs to know
// the extent of (an if condition, a return's expressions, the block a
// return or break ends) are found by counting brackets and block
// keywords. Lua 5.1's grammar (the one Redis embeds) is small enough for
// that to be exact for the constructs mutated here.

// luaCompileError is what Redis answers (after ERR) to a script it cannot
// compile; a mutant whose tests fail with it counts as not compiling.
const luaCompileError = "Error compiling script"

type luaKind int

const (
	luaName luaKind = iota // identifiers and keywords
	luaNumber
	luaString
	luaOp // operators and punctuation
)

type luaTok struct {
	kind     luaKind
	text     string
	off, end int
}

// luaLex splits src into tokens, dropping whitespace, comments (-- to the
// end of the line, --[[ ]] and --[==[ ]==]) and keeping string literals
// ('…' and "…" with escapes, [[ ]] and [==[ ]==]) as single tokens. It does not
// reject malformed input: an unterminated string or comment runs to the
// end of the source, which then offers no more mutants.
func luaLex(src []byte) []luaTok {
	var toks []luaTok
	n := len(src)
	i := 0
	for i < n {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v':
			i++
		case c == '-' && i+1 < n && src[i+1] == '-':
			i += 2
			if lvl, ok := longBracket(src, i); ok {
				i = closeLong(src, i+lvl+2, lvl)
				break
			}
			for i < n && src[i] != '\n' {
				i++
			}
		case c == '\'' || c == '"':
			start := i
			i++
			for i < n && src[i] != c && src[i] != '\n' {
				if src[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i+1, n)
			toks = append(toks, luaTok{luaString, string(src[start:i]), start, i})
		case c == '[':
			if lvl, ok := longBracket(src, i); ok {
				start := i
				i = closeLong(src, i+lvl+2, lvl)
				toks = append(toks, luaTok{luaString, string(src[start:i]), start, i})
				break
			}
			toks = append(toks, luaTok{luaOp, "[", i, i + 1})
			i++
		case isDigit(c) || (c == '.' && i+1 < n && isDigit(src[i+1])):
			start := i
			if c == '0' && i+1 < n && (src[i+1] == 'x' || src[i+1] == 'X') {
				i += 2
				for i < n && isHex(src[i]) {
					i++
				}
			} else {
				for i < n && (isDigit(src[i]) || src[i] == '.') {
					i++
				}
				if i < n && (src[i] == 'e' || src[i] == 'E') {
					i++
					if i < n && (src[i] == '+' || src[i] == '-') {
						i++
					}
					for i < n && isDigit(src[i]) {
						i++
					}
				}
			}
			toks = append(toks, luaTok{luaNumber, string(src[start:i]), start, i})
		case isNameStart(c):
			start := i
			for i < n && (isNameStart(src[i]) || isDigit(src[i])) {
				i++
			}
			toks = append(toks, luaTok{luaName, string(src[start:i]), start, i})
		default:
			op := string(c)
			for _, long := range []string{"...", "..", "==", "~=", "<=", ">="} {
				if strings.HasPrefix(string(src[i:min(i+len(long), n)]), long) {
					op = long
					break
				}
			}
			toks = append(toks, luaTok{luaOp, op, i, i + len(op)})
			i += len(op)
		}
	}
	return toks
}

// longBracket reports whether a long bracket [[ or [=*[ opens at src[i],
// and its level (the number of '=').
func longBracket(src []byte, i int) (int, bool) {
	if i >= len(src) || src[i] != '[' {
		return 0, false
	}
	j := i + 1
	for j < len(src) && src[j] == '=' {
		j++
	}
	if j < len(src) && src[j] == '[' {
		return j - i - 1, true
	}
	return 0, false
}

// closeLong returns the offset just past the ]=*] of level lvl that
// closes a long bracket whose contents start at i.
func closeLong(src []byte, i, lvl int) int {
	end := "]" + strings.Repeat("=", lvl) + "]"
	if k := strings.Index(string(src[i:]), end); k >= 0 {
		return i + k + len(end)
	}
	return len(src)
}

func isDigit(c byte) bool     { return '0' <= c && c <= '9' }
func isHex(c byte) bool       { return isDigit(c) || ('a' <= c && c <= 'f') || ('A' <= c && c <= 'F') }
func isNameStart(c byte) bool { return c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') }

// endsOperand reports whether an expression can end with t, so that a -
// after it is binary (a - b) rather than unary (-b, which has no + to
// become: Lua has no unary plus).
func endsOperand(t luaTok) bool {
	switch t.kind {
	case luaNumber, luaString:
		return true
	case luaName:
		switch t.text {
		case "nil", "true", "false":
			return true
		}
		return !luaKeywords[t.text]
	}
	switch t.text {
	case ")", "]", "}", "...":
		return true
	}
	return false
}

var luaKeywords = map[string]bool{
	"and": true, "break": true, "do": true, "else": true, "elseif": true, "end": true,
	"false": true, "for": true, "function": true, "if": true, "in": true, "local": true,
	"nil": true, "not": true, "or": true, "repeat": true, "return": true, "then": true,
	"true": true, "until": true, "while": true,
}

// luaBinary are the operator replacements, as binaryMutations for Go.
var luaBinary = map[string][]string{
	"<":   {"<=", ">"},
	"<=":  {"<", ">="},
	">":   {">=", "<"},
	">=":  {">", "<="},
	"==":  {"~="},
	"~=":  {"=="},
	"+":   {"-"},
	"-":   {"+"},
	"*":   {"/"},
	"/":   {"*"},
	"and": {"or"},
	"or":  {"and"},
}

// luaSites lists the mutants of one Lua file.
func luaSites(f *srcFile) []*mutant {
	src := f.src
	toks := luaLex(src)
	lines := lineStarts(src)
	pos := func(off int) token.Position {
		// The last line starting at or before off.
		lo, hi := 0, len(lines)
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			if lines[mid] <= off {
				lo = mid
			} else {
				hi = mid
			}
		}
		return token.Position{Filename: f.abs, Offset: off, Line: lo + 1, Column: off - lines[lo] + 1}
	}
	var out []*mutant
	add := func(off int, kind, orig, repl string, edits ...edit) {
		out = append(out, &mutant{file: f, pos: pos(off), kind: kind, orig: orig, repl: repl, edits: edits})
	}
	text := func(from, to int) string { return short(string(src[toks[from].off:toks[to].end])) }

	// blocks is the stack of open blocks, by the keyword that opened
	// each: function, if, for, while, do (alone) or repeat. A for or
	// while's do belongs to it and opens nothing more.
	var blocks []string
	loopDo := 0 // for/while keywords whose do is still to come
	for i, t := range toks {
		switch t.kind {
		case luaNumber:
			for _, to := range luaLiteral(t.text) {
				add(t.off, "literal", t.text, to, edit{t.off, t.end, to})
			}
			continue
		case luaString:
			continue
		}
		if tos, ok := luaBinary[t.text]; ok {
			if (t.text == "-" || t.text == "+") && (i == 0 || !endsOperand(toks[i-1])) {
				continue // unary minus
			}
			for _, to := range tos {
				add(t.off, "binary", t.text, to, edit{t.off, t.end, to})
			}
			continue
		}
		switch t.text {
		case "function", "if", "repeat":
			blocks = append(blocks, t.text)
		case "for", "while":
			blocks = append(blocks, t.text)
			loopDo++
		case "do":
			if loopDo > 0 {
				loopDo--
			} else {
				blocks = append(blocks, "do")
			}
		case "end", "until":
			if len(blocks) > 0 {
				blocks = blocks[:len(blocks)-1]
			}
		}
		switch t.text {
		case "true", "false":
			to := map[string]string{"true": "false", "false": "true"}[t.text]
			add(t.off, "bool", t.text, to, edit{t.off, t.end, to})
		case "not":
			if i+1 < len(toks) {
				x := text(i+1, luaOperandEnd(toks, i+1))
				add(t.off, "not", "not "+x, x, edit{t.off, toks[i+1].off, ""})
			}
		case "if", "elseif":
			// The condition runs to the first then outside brackets; a
			// condition holding a function literal (which may hold an if
			// of its own) is left alone.
			j, depth := i+1, 0
			for ; j < len(toks); j++ {
				tj := toks[j]
				if tj.kind != luaOp && tj.kind != luaName {
					continue
				}
				switch tj.text {
				case "(", "[", "{":
					depth++
				case ")", "]", "}":
					depth--
				}
				if (tj.text == "then" && depth == 0) || tj.text == "function" {
					break
				}
			}
			if j < len(toks) && j > i+1 && toks[j].text == "then" {
				c := text(i+1, j-1)
				add(toks[i+1].off, "negate", t.text+" "+c, t.text+" not ("+c+")",
					edit{toks[i+1].off, toks[i+1].off, "not ("},
					edit{toks[j-1].end, toks[j-1].end, ")"})
			}
		case "math":
			if i+2 < len(toks) && toks[i+1].text == "." && (toks[i+2].text == "min" || toks[i+2].text == "max") {
				to := map[string]string{"min": "max", "max": "min"}[toks[i+2].text]
				add(t.off, "minmax", "math."+toks[i+2].text, "math."+to, edit{toks[i+2].off, toks[i+2].end, to})
			}
		case "break":
			add(t.off, "branch", "break", "(removed)", edit{t.off, t.end, ""})
		case "return":
			// Only an early return: one that ends an if, loop or do
			// block, not the function (or the chunk) it is in.
			if len(blocks) == 0 || blocks[len(blocks)-1] == "function" {
				break
			}
			end := luaReturnEnd(toks, i)
			if end < 0 {
				break
			}
			last := end - 1
			if last < i {
				last = i
			}
			if end < len(toks) && toks[end].text == ";" {
				last = end
			}
			// The removed text's newlines stay, so every later line
			// keeps its number in Redis's error messages.
			removed := string(src[t.off:toks[last].end])
			add(t.off, "branch", short(removed), "(removed)",
				edit{t.off, toks[last].end, strings.Repeat("\n", strings.Count(removed, "\n"))})
		}
	}
	return out
}

// luaReturnEnd returns the index of the token that ends the return at
// toks[i]: a return is a block's last statement, so its expressions run
// to the end, else, elseif or until that closes the block (or a ;). A
// return of a function literal, whose body has blocks of its own, is left
// alone (-1).
func luaReturnEnd(toks []luaTok, i int) int {
	for j := i + 1; j < len(toks); j++ {
		t := toks[j]
		if t.kind != luaName && t.kind != luaOp {
			continue
		}
		switch t.text {
		case "function":
			return -1
		case "end", "else", "elseif", "until", ";":
			return j
		}
	}
	return len(toks)
}

// luaOperandEnd returns the index of the last token of the simple operand
// starting at toks[i] (a name with its fields, indices and calls, or a
// bracketed expression), for the report only.
func luaOperandEnd(toks []luaTok, i int) int {
	j := i
	if toks[i].text == "(" || toks[i].kind == luaName {
		if toks[i].text == "(" {
			j = luaClose(toks, i)
		}
		for j+1 < len(toks) {
			switch toks[j+1].text {
			case ".", ":":
				j += 2
			case "(", "[":
				j = luaClose(toks, j+1)
			default:
				return min(j, len(toks)-1)
			}
		}
	}
	return min(j, len(toks)-1)
}

// luaClose returns the index of the bracket closing the one at toks[i].
func luaClose(toks []luaTok, i int) int {
	depth := 0
	for j := i; j < len(toks); j++ {
		switch toks[j].text {
		case "(", "[", "{":
			depth++
		case ")", "]", "}":
			if depth--; depth == 0 {
				return j
			}
		}
	}
	return len(toks) - 1
}

// luaLiteral: as literalMutations, for a Lua number: integers up to
// maxOffByOne move by one (0 and 1 swap), other fractions become 0.
func luaLiteral(lit string) []string {
	var v float64
	if strings.HasPrefix(lit, "0x") || strings.HasPrefix(lit, "0X") {
		u, err := strconv.ParseUint(lit[2:], 16, 64)
		if err != nil {
			return nil
		}
		v = float64(u)
	} else {
		var err error
		if v, err = strconv.ParseFloat(lit, 64); err != nil {
			return nil
		}
	}
	if v != float64(int64(v)) {
		return []string{"0"}
	}
	return intMutations(int64(v))
}

// lineStarts is the offset of each line's first byte.
func lineStarts(src []byte) []int {
	starts := []int{0}
	for i, c := range src {
		if c == '\n' {
			starts = append(starts, i+1)
		}
	}
	return starts
}
