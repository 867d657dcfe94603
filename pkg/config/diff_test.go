package config

import (
	"fmt"
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

func TestLineEditsFallBackWhenTooDifferent(t *testing.T) {
	var a, b []string
	for i := range 3 * maxDiffEdits {
		a = append(a, fmt.Sprintf("old %d\n", i))
		b = append(b, fmt.Sprintf("new %d\n", i))
	}
	edits := lineEdits(a, b)
	if len(edits) != len(a)+len(b) {
		t.Fatalf("got %d edits, want %d", len(edits), len(a)+len(b))
	}
	for i, e := range edits {
		want := byte('-')
		if i >= len(a) {
			want = '+'
		}
		if e.op != want {
			t.Fatalf("edit %d is %q, want %q", i, e.op, want)
		}
	}
}
