package config

import (
	"errors"
	"fmt"
	"strings"
)

const (
	// diffContext is the number of unchanged lines shown around a change.
	diffContext = 3
	// maxDiffEdits bounds the work of the minimal diff (memory grows with
	// its square). Past it the differing middle is shown as all removed
	// then all added: still a correct diff, just not a minimal one.
	maxDiffEdits = 1000
)

// Diff is a unified line diff from old's YAML rendering to new's, for
// reviewing a change before applying it. It is deterministic and empty
// when both render the same. A nil config renders as nothing.
//
// When the two configs list more than DiffWholeTenants tenants together,
// the tenants are left out of the line diff and listed after it instead,
// one line per added, changed or removed tenant (at most
// DiffTenantLines), so the diff takes time linear in the configs.
func Diff(old, new *Config) string {
	if tenantCount(old)+tenantCount(new) > DiffWholeTenants {
		return diffTenantsApart(old, new)
	}
	return diffLines(old, new)
}

func diffLines(old, new *Config) string {
	a, b := renderLines(old), renderLines(new)
	edits := lineEdits(a, b)
	changed := false
	for _, e := range edits {
		if e.op != ' ' {
			changed = true
			break
		}
	}
	if !changed {
		return ""
	}
	var out strings.Builder
	out.WriteString("--- current\n+++ proposed\n")
	writeHunks(&out, edits)
	return out.String()
}

func renderLines(c *Config) []string {
	if c == nil {
		return nil
	}
	data, err := c.Marshal()
	if err != nil {
		return []string{"# cannot render this config: " + err.Error() + "\n"}
	}
	lines := strings.SplitAfter(string(data), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// edit is one line of an edit script: ' ' kept, '-' removed, '+' added.
type edit struct {
	op   byte
	line string
}

// lineEdits returns an edit script turning a into b: common prefix and
// suffix kept, the middle diffed with Myers' O(ND) algorithm.
func lineEdits(a, b []string) []edit {
	prefix := 0
	for prefix < len(a) && prefix < len(b) && a[prefix] == b[prefix] {
		prefix++
	}
	suffix := 0
	for suffix < len(a)-prefix && suffix < len(b)-prefix && a[len(a)-1-suffix] == b[len(b)-1-suffix] {
		suffix++
	}
	edits := make([]edit, 0, len(a)+len(b))
	for _, l := range a[:prefix] {
		edits = append(edits, edit{' ', l})
	}
	edits = append(edits, myers(a[prefix:len(a)-suffix], b[prefix:len(b)-suffix])...)
	for _, l := range a[len(a)-suffix:] {
		edits = append(edits, edit{' ', l})
	}
	return edits
}

// myers finds a shortest edit script. trace[d] keeps the furthest x on
// each diagonal k in [-d, d] reached with d edits, which backtracking
// walks in reverse.
func myers(a, b []string) []edit {
	n, m := len(a), len(b)
	if n == 0 || m == 0 {
		return replaceAll(a, b)
	}
	maxD := min(n+m, maxDiffEdits)
	// v[k+offset] is the furthest x on diagonal k; diagonals run -maxD-1..maxD+1.
	offset := maxD + 1
	v := make([]int, 2*maxD+3)
	var trace [][]int
	for d := 0; d <= maxD; d++ {
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[offset+k-1] < v[offset+k+1]) {
				x = v[offset+k+1] // down: insert from b
			} else {
				x = v[offset+k-1] + 1 // right: delete from a
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x++
				y++
			}
			v[offset+k] = x
			if x >= n && y >= m {
				trace = append(trace, append([]int(nil), v[offset-d:offset+d+1]...))
				return backtrack(a, b, trace)
			}
		}
		trace = append(trace, append([]int(nil), v[offset-d:offset+d+1]...))
	}
	return replaceAll(a, b)
}

// backtrack turns the Myers trace into an edit script, walking from (n, m)
// back to (0, 0).
func backtrack(a, b []string, trace [][]int) []edit {
	at := func(d, k int) int { return trace[d][k+d] }
	x, y := len(a), len(b)
	var rev []edit
	for d := len(trace) - 1; d > 0; d-- {
		k := x - y
		var prevK int
		if k == -d || (k != d && at(d-1, k-1) < at(d-1, k+1)) {
			prevK = k + 1
		} else {
			prevK = k - 1
		}
		prevX := at(d-1, prevK)
		prevY := prevX - prevK
		for x > prevX && y > prevY {
			x--
			y--
			rev = append(rev, edit{' ', a[x]})
		}
		if x == prevX {
			y--
			rev = append(rev, edit{'+', b[y]})
		} else {
			x--
			rev = append(rev, edit{'-', a[x]})
		}
	}
	for x > 0 && y > 0 {
		x--
		y--
		rev = append(rev, edit{' ', a[x]})
	}
	edits := make([]edit, len(rev))
	for i, e := range rev {
		edits[len(rev)-1-i] = e
	}
	return edits
}

func replaceAll(a, b []string) []edit {
	edits := make([]edit, 0, len(a)+len(b))
	for _, l := range a {
		edits = append(edits, edit{'-', l})
	}
	for _, l := range b {
		edits = append(edits, edit{'+', l})
	}
	return edits
}

// writeHunks writes the edit script as unified-diff hunks with
// diffContext kept lines around each change.
func writeHunks(out *strings.Builder, edits []edit) {
	// aLine[i] and bLine[i] are the 0-based old and new line numbers at
	// which edits[i] starts.
	aLine, bLine := make([]int, len(edits)+1), make([]int, len(edits)+1)
	for i, e := range edits {
		aLine[i+1], bLine[i+1] = aLine[i], bLine[i]
		if e.op != '+' {
			aLine[i+1]++
		}
		if e.op != '-' {
			bLine[i+1]++
		}
	}
	for i := 0; i < len(edits); {
		if edits[i].op == ' ' {
			i++
			continue
		}
		start := max(0, i-diffContext)
		end := i // one past the last change of the hunk
		for j := i; j < len(edits); j++ {
			if edits[j].op != ' ' {
				end = j + 1
			} else if j-end >= 2*diffContext {
				break
			}
		}
		stop := min(len(edits), end+diffContext)
		aCount, bCount := aLine[stop]-aLine[start], bLine[stop]-bLine[start]
		fmt.Fprintf(out, "@@ -%s +%s @@\n", hunkRange(aLine[start], aCount), hunkRange(bLine[start], bCount))
		for _, e := range edits[start:stop] {
			out.WriteByte(e.op)
			out.WriteString(e.line)
			if !strings.HasSuffix(e.line, "\n") {
				out.WriteString("\n\\ No newline at end of file\n")
			}
		}
		i = stop
	}
}

// hunkRange is "start,count" with 1-based start, as unified diffs write it
// (an empty range names the line before it).
func hunkRange(start, count int) string {
	if count == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	if count == 1 {
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, count)
}

// RemovalProblems lists what replacing current by next would take from a
// running deployment without warning, which Validate (one config at a
// time) cannot see: each region next removes while current does not
// drain it, as a *FieldError on regions.<name>, joined (errors.Join), or
// nil. Such a region may still serve traffic: once its replicas adopt a
// config without it they refuse every request (the instances decide with
// their on_failure policy), and the global tier re-divides its share at
// once. Draining first moves its share to the others fenced, and leaves it
// on its floor until it is stopped (docs/operations.md, "Region drained").
// A nil current removes nothing.
func RemovalProblems(current, next *Config) error {
	if current == nil || next == nil {
		return nil
	}
	var p problems
	for _, name := range sortedKeys(current.Regions) {
		if _, kept := next.Regions[name]; kept || current.Regions[name].Drained {
			continue
		}
		p.add("regions."+name, "removed while not drained: drain it first (sluicectl region drain %s), stop its replicas, then remove it", name)
	}
	return errors.Join(p...)
}
