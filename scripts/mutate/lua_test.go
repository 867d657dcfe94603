package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const tinyLuaDir = "./testdata/tinylua"

// TestLuaSites checks the mutants of a Lua source: each kind is made,
// nothing in a comment or string literal is touched, a unary minus gets
// no + and a removed return keeps the lines after it where they were.
func TestLuaSites(t *testing.T) {
	src := `-- a < b and not c
--[==[ if x then return 1 end ]==]
local s, t = 'x < y -- not a comment', [[ 1 + 2 ]]
local n = -1
for i = 1, 3 do
  if n <= i and not s then
    return f(i,
      n)
  elseif i == 2 then break end
end
while true do if x then return end end
local function g() return math.max(n * 2, 0.5) end
return g() ~= 3 or false
`
	f := &srcFile{rel: "x.lua", abs: "/x.lua", src: []byte(src), lua: true}
	ms := luaSites(f)
	got := map[string]bool{}
	for _, m := range ms {
		got[m.String()] = true
		if m.pos.Line < 4 {
			t.Errorf("mutant in a comment or string: %s", m)
		}
	}
	for _, want := range []string{
		"x.lua:4:12: 1 -> 0",
		"x.lua:5:9: 1 -> 2",
		"x.lua:6:6: if n <= i and not s -> if not (n <= i and not s)",
		"x.lua:6:8: <= -> <",
		"x.lua:6:8: <= -> >=",
		"x.lua:6:13: and -> or",
		"x.lua:6:17: not s -> s",
		"x.lua:7:5: return f(i, n) -> (removed)",
		"x.lua:9:10: elseif i == 2 -> elseif not (i == 2)",
		"x.lua:9:12: == -> ~=",
		"x.lua:9:22: break -> (removed)",
		"x.lua:11:18: if x -> if not (x)",
		"x.lua:11:25: return -> (removed)",
		"x.lua:11:7: true -> false",
		"x.lua:12:27: math.max -> math.min",
		"x.lua:12:38: * -> /",
		"x.lua:12:43: 0.5 -> 0",
		"x.lua:13:12: ~= -> ==",
		"x.lua:13:17: or -> and",
	} {
		if !got[want] {
			t.Errorf("no mutant %q", want)
		}
	}
	for _, m := range ms {
		switch {
		case m.pos.Line == 4 && m.orig == "-":
			t.Errorf("unary minus mutated: %s", m)
		case m.pos.Line == 12 && m.kind == "branch", m.pos.Line == 13 && m.kind == "branch":
			t.Errorf("a function's last return removed: %s", m)
		}
	}
	for _, m := range ms {
		if m.String() != "x.lua:7:5: return f(i, n) -> (removed)" {
			continue
		}
		out := string(m.apply())
		if strings.Contains(out, "return f") || strings.Count(out, "\n") != strings.Count(src, "\n") {
			t.Errorf("removed return:\n%s", out)
		}
		if !strings.Contains(out, "not s then\n    \n\n  elseif") {
			t.Errorf("the return's lines are not kept:\n%s", out)
		}
	}
}

// TestLuaRunThroughOverlay runs the tool on the embedded script of
// tinylua on a real Redis: the overlay reaches //go:embed, the mirrored
// operator, the removed early return and math.max are killed, the
// boundary survives (it is equivalent), and the script is left as it was.
func TestLuaRunThroughOverlay(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test five times")
	}
	out := runLeavingSourceAlone(t, tinyLuaDir, filepath.Join(tinyLuaDir, "lua", "clamp.lua"), "clamp.lua:7:6,clamp.lua:8:3,clamp.lua:10:8")
	if !strings.Contains(out, "clamp.lua:7:6: < -> <=\n") {
		t.Error("the boundary mutant is not reported as surviving")
	}
	if !strings.Contains(out, "4 mutants run: 3 killed, 0 timed out, 1 survived (0 more not compiling); score 75.0%") {
		t.Error("wrong summary")
	}
}

// TestLuaSyntaxErrorDoesNotCompile: a mutated script Redis refuses to
// load counts as not compiling, not as killed.
func TestLuaSyntaxErrorDoesNotCompile(t *testing.T) {
	p := loadTinyLua(t, "runs go test")
	if len(p.luaFiles) != 1 {
		t.Fatalf("lua files %v, want clamp.lua", p.luaFiles)
	}
	f := p.luaFiles[0]
	then := bytes.Index(f.src, []byte("lo then")) + len("lo ")
	m := &mutant{file: f, kind: "test", edits: []edit{{then, then + len("then"), ""}}}
	r := &runner{pkgDir: tinyLuaDir, timeout: time.Minute, tmp: t.TempDir()}
	res, text, err := r.try(context.Background(), 0, m)
	if err != nil {
		t.Fatal(err)
	}
	if res != notCompiling {
		t.Errorf("a script without then: %s, want not compiling\n%s", res, text)
	}
}

// TestLuaBuildFailureIsAnError: a build that fails with only a Lua file
// changed is the machine's failure, not the mutant's: it is tried again
// and then stops the run instead of counting as not compiling. The
// failure is staged by marking a broken Go file as Lua.
func TestLuaBuildFailureIsAnError(t *testing.T) {
	p := loadTinyLua(t, "runs go test twice")
	f := *p.files[0]
	f.lua = true
	m := &mutant{file: &f, kind: "test", edits: []edit{{0, len("// Package"), "broken"}}}
	r := &runner{pkgDir: tinyLuaDir, timeout: time.Minute, tmp: t.TempDir()}
	res, text, err := r.try(context.Background(), 0, m)
	if err == nil || !strings.Contains(err.Error(), "only a Lua file changed") {
		t.Errorf("a build failure of a Lua mutant: %s, %v; want an error\n%s", res, err, text)
	}
}

// loadTinyLua loads the Lua test package for a test that runs go test on
// it, skipped under -short for why.
func loadTinyLua(t *testing.T, why string) *pkg {
	t.Helper()
	if testing.Short() {
		t.Skip(why)
	}
	p, err := load(context.Background(), tinyLuaDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
