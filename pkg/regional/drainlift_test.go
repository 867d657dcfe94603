package regional

import (
	"log/slog"
	"testing"

	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/luascripts"
)

// TestDrainLiftedWarnsOnlyWhenItsRiseWriteFails: the leader that stores
// the rise of a drain lifted warns when the write fails (a replica started
// later may then credit idle keys at the restored share), and only then.
func TestDrainLiftedWarnsOnlyWhenItsRiseWriteFails(t *testing.T) {
	const warning = "storing the rise of a drain lifted failed"
	for _, fails := range []bool{false, true} {
		rdb := redistest.Start(t).Client()
		if fails {
			rdb = refusingRedis(t)
		}
		logs := &logtest.Buffer{}
		s, err := New(Options{Region: "us", Redis: rdb, Config: configtest.NewSource(euWeighted(t, "", 1), 1),
			Logger: slog.New(slog.NewTextHandler(logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		s.drainLifted(t.Context(), true)
		s.Close()
		if got, want := logs.Count(warning), map[bool]int{false: 0, true: 1}[fails]; got != want {
			t.Errorf("a rise write that fails=%v: %q logged %d times, want %d\n%s", fails, warning, got, want, logs)
		}
		if !fails {
			if n, err := rdb.Exists(t.Context(), shardRiseKey(luascripts.DefaultPrefix, 0)).Result(); err != nil || n != 1 {
				t.Errorf("shard 0's rise not stored (%d, %v)", n, err)
			}
		}
	}
}
