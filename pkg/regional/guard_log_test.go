package regional_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestColdStartSaysWhyRequestsAreDenied: a process that finds Redis empty
// under the conservative cold start denies its first requests; it says so
// once, at WARN, naming the way out. Later connections, a Redis another
// process already initialised, and -cold-start full log nothing.
func TestColdStartSaysWhyRequestsAreDenied(t *testing.T) {
	rs := redistest.Start(t)
	ctx := context.Background()
	rdb := rs.Client()
	t.Cleanup(func() { rdb.Close() })
	guard := func(mode regional.ColdStart) (*regional.RestartGuard, *bytes.Buffer) {
		var buf bytes.Buffer
		return regional.NewRestartGuard(luascripts.DefaultPrefix, mode, slog.New(slog.NewTextHandler(&buf, nil))), &buf
	}

	g, log := guard(regional.ColdStartConservative)
	for range 3 { // every new connection checks the sentinel
		if err := g.Check(ctx, rdb); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Count(log.String(), "level=WARN"); got != 1 {
		t.Fatalf("want one WARN, got %d:\n%s", got, log)
	}
	for _, w := range []string{"cold start", "denied", "-cold-start full"} {
		if !strings.Contains(log.String(), w) {
			t.Fatalf("log lacks %q:\n%s", w, log)
		}
	}

	// Another replica of the region finds the sentinel: nothing to say.
	g2, log2 := guard(regional.ColdStartConservative)
	if err := g2.Check(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	if log2.Len() != 0 {
		t.Fatalf("a replica that found the sentinel logged:\n%s", log2)
	}

	// A fresh deployment trusted to start full denies nothing.
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	g3, log3 := guard(regional.ColdStartFull)
	if err := g3.Check(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	if log3.Len() != 0 {
		t.Fatalf("-cold-start full logged:\n%s", log3)
	}
}
