package regional_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestDaemonStartsFromItsRegionsHistory: a regional daemon started on
// revision B of the config, with its Redis holding A as the revision last
// confirmed to the region and a static lease, starts bounded by A (eu's
// old 50/s, not B's 75/s) and says so; once etcd compacted A's history it
// starts on B alone, logs a warning naming A and counts the start.
func TestDaemonStartsFromItsRegionsHistory(t *testing.T) {
	for _, compacted := range []bool{false, true} {
		t.Run(map[bool]string{false: "history", true: "compacted"}[compacted], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cli := etcdtest.Start(t).Client(t)
			store := configstore.NewStore(cli, "/ds")
			revA, err := store.Apply(ctx, weightsConfig(t, 1, 1), 0)
			if err != nil {
				t.Fatal(err)
			}
			revB, err := store.Apply(ctx, weightsConfig(t, 3, 1), revA)
			if err != nil {
				t.Fatal(err)
			}
			if compacted {
				put, err := cli.Put(ctx, "/elsewhere", "x")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
					t.Fatal(err)
				}
			}
			rs := redistest.Start(t)
			rdb := rs.Client()
			seedConfirmedUnderStaticLease(ctx, t, rdb, revA)

			logs := &logtest.Buffer{}
			logger := slog.New(slog.NewTextHandler(logs, nil))
			w := watchUntil(ctx, t, configstore.NewStore(cli, "/ds"), store, revB, logger)
			d, err := regional.StartDaemon(ctx, regional.DaemonOptions{
				Region: "eu", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RedisAddr: rs.Addr(),
				Config: w, ColdStart: regional.ColdStartFull, Logger: logger,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Stop()

			// The view reads the stored lease a first time at once.
			for !strings.Contains(scrape(t, d), "sluice_regional_on_floor 0") {
				if ctx.Err() != nil {
					t.Fatalf("the daemon never read its static lease:\n%s", logs)
				}
				time.Sleep(20 * time.Millisecond) // polling the first reading with a deadline
			}
			_, c, _, err := d.Server.CommonFor(w.Current(), restartKey)
			if err != nil {
				t.Fatal(err)
			}
			want, wantCount, wantLog := 50.0, "0", "started under the configs not yet confirmed past too"
			if compacted {
				want, wantCount, wantLog = 75, "1", "confirmed_revision="+strconv.FormatInt(revA, 10)
			}
			if !near(c.StaticRate, want) {
				t.Errorf("eu's static rate %v, want %v", c.StaticRate, want)
			}
			// A compacted history is not read again: the process runs
			// unconfirmed until its region confirms B.
			for _, m := range []string{"sluice_regional_chain_started_unconfirmed_total " + wantCount, "sluice_regional_chain_unconfirmed " + wantCount} {
				if !strings.Contains(scrape(t, d), m) {
					t.Errorf("/metrics lacks %q", m)
				}
			}
			if !strings.Contains(logs.String(), wantLog) {
				t.Errorf("the log lacks %q:\n%s", wantLog, logs)
			}
		})
	}
}

// seedConfirmedUnderStaticLease stores in a region's Redis what its leader
// would have: rev as the revision last confirmed to the region, and a
// static lease an hour ahead on Redis's clock.
func seedConfirmedUnderStaticLease(ctx context.Context, t *testing.T, rdb *redis.Client, rev int64) {
	t.Helper()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, luascripts.DefaultPrefix+"confirmed", rev, 0).Err(); err != nil {
		t.Fatal(err)
	}
	lease := strconv.FormatInt(now.Add(time.Hour).UnixMicro(), 10)
	if err := rdb.Set(ctx, luascripts.DefaultPrefix+"{static}:lease", lease, 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// watchUntil runs a config watcher on watched until the test ends and
// waits until it holds revision want of store.
func watchUntil(ctx context.Context, t *testing.T, watched, store *configstore.Store, want int64, logger *slog.Logger) *configstore.Watcher {
	t.Helper()
	w := configstore.NewWatcher(watched, nil, logger, nil)
	wctx, stopWatch := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(wctx) }()
	t.Cleanup(func() { stopWatch(); <-done })
	if rev, err := configstore.AwaitEtcdConfig(ctx, store, nil, w, logger); err != nil || rev != want {
		t.Fatalf("awaiting etcd's config: revision %d, %v; want %d", rev, err, want)
	}
	return w
}
