package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestDiffOfEqualConfigsIsEmpty(t *testing.T) {
	if d := Diff(Default(), Default()); d != "" {
		t.Fatalf("diff of equal configs:\n%s", d)
	}
	if d := Diff(nil, nil); d != "" {
		t.Fatalf("diff of two nils:\n%s", d)
	}
}

func TestDiffShowsAChangedRate(t *testing.T) {
	old, new := Default(), Default()
	new.Tenants["acme"].Overrides["write"] = LimitSpec{Rate: 900, Burst: 1600}
	want := `--- current
+++ proposed
@@ -50,7 +50,7 @@
     tier: pro
     overrides:
       write:
-        rate: 800/s
+        rate: 900/s
         burst: 1600
 default_tier: free
 envoy:
`
	if got := Diff(old, new); got != want {
		t.Fatalf("diff =\n%s\nwant\n%s", got, want)
	}
	if again := Diff(old, new); again != want {
		t.Fatal("diff is not deterministic")
	}
}

func TestDiffFromNothingAddsEveryLine(t *testing.T) {
	c := Default()
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(string(data), "\n")
	d := Diff(nil, c)
	if !strings.HasPrefix(d, fmt.Sprintf("--- current\n+++ proposed\n@@ -0,0 +1,%d @@\n", lines)) {
		t.Fatalf("diff from nil starts:\n%s", d[:min(len(d), 200)])
	}
	if got := strings.Count(d, "\n+"); got != lines+1 { // +1: the "+++" header
		t.Fatalf("diff from nil has %d added lines, want %d", got-1, lines)
	}
}

func TestDiffSeparatesDistantChangesIntoHunks(t *testing.T) {
	old, new := Default(), Default()
	new.Epoch = Duration(2 * DefaultEpoch)
	new.GrantValidity = Duration(10 * DefaultEpoch)
	new.DefaultTier = "pro"
	d := Diff(old, new)
	if got := strings.Count(d, "\n@@ "); got != 2 {
		t.Fatalf("want 2 hunks, got %d:\n%s", got, d)
	}
	for _, want := range []string{"-epoch: 1s\n", "+epoch: 2s\n", "-grant_validity: 5s\n", "+grant_validity: 10s\n", "-default_tier: free\n", "+default_tier: pro\n"} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q:\n%s", want, d)
		}
	}
}

// TestLineEditsTransformOldIntoNew checks that every edit script is valid
// (kept and removed lines spell old, kept and added lines spell new) and,
// for small inputs, minimal against a longest-common-subsequence count.
func TestLineEditsTransformOldIntoNew(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		alphabet := []string{"a\n", "b\n", "c\n", "d\n"}
		a := rapid.SliceOfN(rapid.SampledFrom(alphabet), 0, 30).Draw(t, "a")
		b := rapid.SliceOfN(rapid.SampledFrom(alphabet), 0, 30).Draw(t, "b")
		edits := lineEdits(a, b)
		var gotA, gotB []string
		changes := 0
		for _, e := range edits {
			switch e.op {
			case ' ':
				gotA, gotB = append(gotA, e.line), append(gotB, e.line)
			case '-':
				gotA = append(gotA, e.line)
				changes++
			case '+':
				gotB = append(gotB, e.line)
				changes++
			default:
				t.Fatalf("bad op %q", e.op)
			}
		}
		if strings.Join(gotA, "") != strings.Join(a, "") || strings.Join(gotB, "") != strings.Join(b, "") {
			t.Fatalf("edit script does not turn %q into %q: %v", a, b, edits)
		}
		if want := len(a) + len(b) - 2*lcs(a, b); changes != want {
			t.Fatalf("edit script has %d changes, minimal is %d", changes, want)
		}
	})
}

func lcs(a, b []string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			if a[i] == b[j] {
				cur[j+1] = prev[j] + 1
			} else {
				cur[j+1] = max(prev[j+1], cur[j])
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// TestLineEditsKeepTheCommonPrefixFirst: when one side's lines all
// begin the other's, the lines they share are matched from the start
// and the rest is added or removed at the end, rather than the common
// suffix being looked for inside the prefix already matched.
func TestLineEditsKeepTheCommonPrefixFirst(t *testing.T) {
	for _, tc := range []struct {
		a, b string // one line per character
		want string // the script's ops
	}{
		{"x", "xx", " +"},
		{"xx", "x", " -"},
		{"xy", "xyxy", "  ++"},
		{"xyxy", "xy", "  --"},
		{"xyx", "x", " --"},
		{"x", "xyx", " ++"},
	} {
		lines := func(s string) []string {
			var out []string
			for _, c := range s {
				out = append(out, string(c)+"\n")
			}
			return out
		}
		var got strings.Builder
		for _, e := range lineEdits(lines(tc.a), lines(tc.b)) {
			got.WriteByte(e.op)
		}
		if got.String() != tc.want {
			t.Errorf("lineEdits(%q, %q) ops %q, want %q", tc.a, tc.b, got.String(), tc.want)
		}
	}
}

// TestLineEditsFallBackWhenTooDifferent: a middle that takes more than
// maxDiffEdits changes is shown as all removed then all added, and the
// lines both ends share stay kept around it (a reviewer sees them as
// context, not as removed and added again).
func TestLineEditsFallBackWhenTooDifferent(t *testing.T) {
	for _, tc := range []struct{ prefix, suffix int }{{0, 0}, {2, 0}, {0, 2}, {3, 1}} {
		var a, b, want []string
		for i := range tc.prefix {
			a, b = append(a, fmt.Sprintf("head %d\n", i)), append(b, fmt.Sprintf("head %d\n", i))
			want = append(want, " ")
		}
		for i := range 3 * maxDiffEdits {
			a = append(a, fmt.Sprintf("old %d\n", i))
			want = append(want, "-")
		}
		for i := range 3 * maxDiffEdits {
			b = append(b, fmt.Sprintf("new %d\n", i))
			want = append(want, "+")
		}
		for i := range tc.suffix {
			a, b = append(a, fmt.Sprintf("tail %d\n", i)), append(b, fmt.Sprintf("tail %d\n", i))
			want = append(want, " ")
		}
		edits := lineEdits(a, b)
		if len(edits) != len(want) {
			t.Fatalf("%+v: got %d edits, want %d", tc, len(edits), len(want))
		}
		for i, e := range edits {
			if string(e.op) != want[i] {
				t.Fatalf("%+v: edit %d (%q) is %q, want %q", tc, i, e.line, e.op, want[i])
			}
		}
	}
}

// TestHunksApplyAndKeepTheirContext checks writeHunks against a reader of
// unified diffs: applying the hunks to old gives new, every header counts
// its lines, each hunk has diffContext kept lines before its first change
// and after its last (fewer only at either end of the file), a hunk holds
// no run of more than 2×diffContext kept lines, and consecutive hunks
// leave at least one line out between them.
func TestHunksApplyAndKeepTheirContext(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		alphabet := []string{"a\n", "b\n", "c\n", "d\n", "e\n", "f\n"}
		a := rapid.SliceOfN(rapid.SampledFrom(alphabet), 0, 40).Draw(t, "a")
		b := slices.Clone(a)
		for range rapid.IntRange(0, 4).Draw(t, "changes") {
			i := rapid.IntRange(0, len(b)).Draw(t, "at")
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				b = slices.Insert(b, i, rapid.SampledFrom(alphabet).Draw(t, "line"))
			case 1:
				if i < len(b) {
					b = slices.Delete(b, i, i+1)
				}
			case 2:
				if i < len(b) {
					b[i] = rapid.SampledFrom(alphabet).Draw(t, "line")
				}
			}
		}
		if len(b) > 0 && rapid.Bool().Draw(t, "no final newline") {
			b[len(b)-1] = strings.TrimSuffix(b[len(b)-1], "\n")
		}
		var out strings.Builder
		writeHunks(&out, lineEdits(a, b))
		text := out.String()
		if slices.Equal(a, b) {
			if text != "" {
				t.Fatalf("hunks for equal files:\n%s", text)
			}
			return
		}
		lines := strings.SplitAfter(text, "\n")
		lines = lines[:len(lines)-1] // the empty string after the last \n
		var got []string
		pos, prevEnd := 0, -1
		for i := 0; i < len(lines); {
			var aStart, aCount, bStart, bCount int
			if _, err := fmt.Sscanf(lines[i], "@@ -%s +%s @@\n", new(string), new(string)); err != nil {
				t.Fatalf("line %d: %q is not a hunk header:\n%s", i, lines[i], text)
			}
			f := strings.Fields(lines[i])
			aStart, aCount = hunkStart(t, f[1][1:])
			bStart, bCount = hunkStart(t, f[2][1:])
			i++
			var body []string
			for i < len(lines) && !strings.HasPrefix(lines[i], "@@ ") {
				if lines[i] == "\\ No newline at end of file\n" {
					body[len(body)-1] = strings.TrimSuffix(body[len(body)-1], "\n")
				} else {
					body = append(body, lines[i])
				}
				i++
			}
			if aStart <= prevEnd {
				t.Fatalf("a hunk starting at old line %d follows one ending at %d with no line between:\n%s", aStart, prevEnd, text)
			}
			got = append(got, a[pos:aStart]...)
			pos = aStart
			if len(got) != bStart {
				t.Fatalf("hunk header says new line %d, it is %d:\n%s", bStart, len(got), text)
			}
			kept, na, nb, first, last := 0, 0, 0, -1, -1
			for j, l := range body {
				op, line := l[0], l[1:]
				if op != ' ' {
					if first < 0 {
						first = j
					}
					last, kept = j, 0
				}
				switch op {
				case ' ':
					kept++
					if first >= 0 && kept > 2*diffContext && j < len(body)-1 {
						t.Fatalf("a hunk holds %d kept lines in a row:\n%s", kept, text)
					}
					if a[pos] != line {
						t.Fatalf("kept line %q is %q in old:\n%s", line, a[pos], text)
					}
					got, pos, na, nb = append(got, line), pos+1, na+1, nb+1
				case '-':
					if a[pos] != line {
						t.Fatalf("removed line %q is %q in old:\n%s", line, a[pos], text)
					}
					pos, na = pos+1, na+1
				case '+':
					got, nb = append(got, line), nb+1
				default:
					t.Fatalf("bad op %q:\n%s", op, text)
				}
			}
			if na != aCount || nb != bCount {
				t.Fatalf("header counts %d,%d, the hunk has %d,%d:\n%s", aCount, bCount, na, nb, text)
			}
			if first < 0 {
				t.Fatalf("a hunk without a change:\n%s", text)
			}
			if first != diffContext && !(aStart == 0 && bStart == 0 && first < diffContext) {
				t.Fatalf("%d kept lines before the first change of a hunk at old line %d:\n%s", first, aStart, text)
			}
			if after := len(body) - 1 - last; after != diffContext && pos != len(a) {
				t.Fatalf("%d kept lines after the last change of a hunk ending at old line %d of %d:\n%s", after, pos, len(a), text)
			}
			prevEnd = pos
		}
		got = append(got, a[pos:]...)
		if !slices.Equal(got, b) {
			t.Fatalf("the hunks turn %q into %q, want %q:\n%s", a, got, b, text)
		}
	})
}

// hunkStart reads a unified diff range "start,count" or "start" (count 1,
// always written so) as the 0-based line it starts at and its count.
func hunkStart(t *rapid.T, r string) (start, count int) {
	s, c, ok := strings.Cut(r, ",")
	var err error
	if start, err = strconv.Atoi(s); err != nil {
		t.Fatalf("range %q: %v", r, err)
	}
	count = 1
	if ok {
		if count, err = strconv.Atoi(c); err != nil {
			t.Fatalf("range %q: %v", r, err)
		}
		if count == 1 {
			t.Fatalf("range %q: a range of one line is written without its count", r)
		}
	}
	if count == 0 {
		return start, 0 // an empty range names the line before it
	}
	return start - 1, count
}

// TestDiffListsTenantsApartPastDiffWholeTenants: up to DiffWholeTenants
// tenants in the two configs together are diffed inside the rendering;
// one more and they are listed apart.
func TestDiffListsTenantsApartPastDiffWholeTenants(t *testing.T) {
	withTenants := func(n int) *Config {
		c := Default()
		c.Tenants = map[string]Tenant{}
		for i := range n {
			c.Tenants[fmt.Sprintf("t%05d", i)] = Tenant{Tier: "free"}
		}
		return c
	}
	old := withTenants(DiffWholeTenants / 2)
	at := withTenants(DiffWholeTenants / 2)
	at.Tenants["t00000"] = Tenant{Tier: "pro"}
	d := Diff(old, at)
	if strings.Contains(d, "@@ tenants:") || !strings.Contains(d, "-    tier: free\n+    tier: pro\n") {
		t.Errorf("%d tenants together: not one line diff:\n%s", DiffWholeTenants, d)
	}
	past := withTenants(DiffWholeTenants/2 + 1)
	past.Tenants["t00000"] = Tenant{Tier: "pro"}
	d = Diff(old, past)
	if want := fmt.Sprintf("--- current\n+++ proposed\n@@ tenants: 1 added, 1 changed, 0 removed (%d listed before, %d after) @@\n", DiffWholeTenants/2, DiffWholeTenants/2+1); !strings.HasPrefix(d, want) {
		t.Errorf("%d tenants together: diff starts\n%s\nwant\n%s", DiffWholeTenants+1, d[:min(len(d), 300)], want)
	}
}

// TestLineEditsFindAScriptOfExactlyMaxDiffEdits: a middle that takes
// exactly maxDiffEdits changes still gets the minimal script, keeping the
// line the two sides share, rather than the fallback.
func TestLineEditsFindAScriptOfExactlyMaxDiffEdits(t *testing.T) {
	var a, b []string
	for i := range maxDiffEdits / 2 {
		a = append(a, fmt.Sprintf("old %d\n", i))
	}
	a = append(a, "shared\n")
	b = append(b, "shared\n")
	for i := range maxDiffEdits / 2 {
		b = append(b, fmt.Sprintf("new %d\n", i))
	}
	kept, changes := 0, 0
	for _, e := range lineEdits(a, b) {
		if e.op == ' ' {
			kept++
		} else {
			changes++
		}
	}
	if kept != 1 || changes != maxDiffEdits {
		t.Fatalf("%d kept lines, %d changes; want 1, %d", kept, changes, maxDiffEdits)
	}
}

func TestRemovalProblemsNameEachRegionRemovedWhileNotDrained(t *testing.T) {
	regions := func(spec map[string]bool) *Config { // name → drained
		c := &Config{Regions: map[string]Region{}}
		for name, drained := range spec {
			c.Regions[name] = Region{Weight: 1, Drained: drained}
		}
		return c
	}
	for _, tc := range []struct {
		name          string
		current, next *Config
		want          []string // problem paths, in order
	}{
		{"nothing removed", regions(map[string]bool{"a": false, "b": false}), regions(map[string]bool{"a": false, "b": false}), nil},
		{"a region added", regions(map[string]bool{"a": false}), regions(map[string]bool{"a": false, "b": false}), nil},
		{"a drained region removed", regions(map[string]bool{"a": false, "b": true}), regions(map[string]bool{"a": false}), nil},
		{"a region removed as it is drained", regions(map[string]bool{"a": false, "b": false}), regions(map[string]bool{"a": false}), []string{"regions.b"}},
		{"two removed, in name order", regions(map[string]bool{"c": false, "a": false, "b": false}), regions(map[string]bool{"b": false}), []string{"regions.a", "regions.c"}},
		{"drained only in the next config", regions(map[string]bool{"a": false, "b": false}), regions(map[string]bool{"a": true}), []string{"regions.b"}},
		{"no current config", nil, regions(map[string]bool{"a": false}), nil},
		{"no next config", regions(map[string]bool{"a": false}), nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := RemovalProblems(tc.current, tc.next)
			var got []string
			if err != nil {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					fe, ok := e.(*FieldError)
					if !ok {
						t.Fatalf("problem %v is a %T, want *FieldError", e, e)
					}
					if !strings.Contains(fe.Message, "drain it first") {
						t.Errorf("%s: %q does not say to drain first", fe.Path, fe.Message)
					}
					if drain := "sluicectl region drain " + strings.TrimPrefix(fe.Path, "regions."); !strings.Contains(fe.Message, drain) {
						t.Errorf("%s: %q does not name the command that drains it (%s)", fe.Path, fe.Message, drain)
					}
					got = append(got, fe.Path)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("problems at %v, want %v", got, tc.want)
			}
		})
	}
}
