package live

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestKeyTraceKeepsTheLatestAndDumpsAWindow: a key's trace keeps its
// latest traceEvents events and prints those within the window asked, in
// scenario time, naming the region.
func TestKeyTraceKeepsTheLatestAndDumpsAWindow(t *testing.T) {
	var kt keyTrace
	start := time.Unix(100, 0)
	for i := range traceEvents + 10 {
		kt.add(7, i%2, start.Add(time.Duration(i)*time.Second), fmt.Sprintf("event %d", i))
	}
	kt.add(8, 0, start, "another key")
	virtual := func(at time.Time) time.Duration { return at.Sub(start) * 2 } // scale 2
	var b strings.Builder
	kt.dump(&b, 7, []string{"us", "eu"}, virtual, 0, 1000*time.Hour)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != traceEvents || !strings.Contains(lines[0], "event 10") || strings.Contains(b.String(), "another key") {
		t.Fatalf("%d lines, first %q; want the latest %d of key 7 only", len(lines), lines[0], traceEvents)
	}
	b.Reset()
	kt.dump(&b, 7, []string{"us", "eu"}, virtual, 40*time.Second, 44*time.Second)
	want := "     40.000s us        event 20\n     42.000s eu        event 21\n     44.000s us        event 22\n"
	if b.String() != want {
		t.Fatalf("window 40s-44s:\n%s\nwant\n%s", b.String(), want)
	}
}
