package regional

import (
	"context"
	"log/slog"
	"testing"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/luascripts"
)

// TestRollbackReadByACheckFirstIsCountedAsOne: a request's script call
// re-births a data set gone back in time, and the guard's epoch check reads
// the new birth before that call's reply reaches the guard (they race on
// every busy replica). The check counts a data loss; the late reply then
// relabels that loss a rollback instead of counting a second one, and the
// log says the data set went back in time.
func TestRollbackReadByACheckFirstIsCountedAsOne(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	t.Cleanup(func() { rdb.Close() })
	logs := &logtest.Buffer{}
	g := NewRestartGuard(luascripts.DefaultPrefix, ColdStartFull, slog.New(slog.NewTextHandler(logs, nil)))
	born := luascripts.DefaultPrefix + "born"
	check := func(restarts, rollbacks int64) {
		t.Helper()
		if err := g.Check(ctx, rdb); err != nil {
			t.Fatal(err)
		}
		if r, b := g.Restarts(), g.Rollbacks(); r != restarts || b != rollbacks {
			t.Fatalf("%d data losses, %d rollbacks counted, want %d and %d\n%s", r, b, restarts, rollbacks, logs)
		}
	}
	check(0, 0) // a new deployment: born 0, trusted full
	// The data set goes back: its generation is below the one seen.
	if err := rdb.Set(ctx, luascripts.GenKey(born), "5", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// A request's call re-births it; its reply is held back from the guard.
	var late []func()
	g.Generations().OnRebirth(func(b string, us int64) { late = append(late, func() { g.rebirth(b, us) }) })
	if _, err := luascripts.NewWith(g.Generations()).StampBorn(ctx, rdb, []string{born}, false); err != nil {
		t.Fatal(err)
	}
	g.Generations().OnRebirth(g.rebirth)
	if len(late) != 1 {
		t.Fatalf("%d re-births reported by the request's call, want 1", len(late))
	}
	check(1, 0) // the check reads the renewed sentinel first: a loss
	late[0]()
	check(1, 1) // the reply: that loss was a rollback, not a second loss
	check(1, 1)
	if n := logs.Count("went back in time"); n != 1 {
		t.Fatalf("%d rollback warnings logged, want 1:\n%s", n, logs)
	}
}
