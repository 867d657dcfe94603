package regional_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestDaemonReadsItsRegionsHistoryLate: a regional daemon started on
// revision B while the revision last confirmed to its region is A starts
// unconfirmed (B's 75/s for eu) when its Redis (paused by SIGSTOP) or
// etcd (a link that lets no byte pass) does not answer, counts and
// exports that, and reads the history again in the background: once the
// component answers, eu's static share is A's 50/s, as for a process
// that read it at start, the late read is counted and logged, and the
// process no longer exports itself unconfirmed.
func TestDaemonReadsItsRegionsHistoryLate(t *testing.T) {
	// Mostly waits for a paused Redis or a hung etcd of its own: it runs
	// beside the package's other parallel tests, and so do its two cases.
	t.Parallel()
	for _, down := range []string{"redis", "etcd"} {
		t.Run(down, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			etcd := etcdtest.Start(t)
			cli := etcd.Client(t)
			store := configstore.NewStore(cli, "/dl")
			revA, err := store.Apply(ctx, weightsConfig(t, 1, 1), 0)
			if err != nil {
				t.Fatal(err)
			}
			revB, err := store.Apply(ctx, weightsConfig(t, 3, 1), revA)
			if err != nil {
				t.Fatal(err)
			}
			rs := redistest.Start(t)
			rdb := rs.Client()
			seedConfirmedUnderStaticLease(ctx, t, rdb, revA)

			logs := &logtest.Buffer{}
			logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			// The watcher, and so the history read, reaches etcd through
			// a link of its own, which the etcd case hangs.
			link := etcd.Link(t)
			w := watchUntil(ctx, t, configstore.NewStore(link.Client(t), "/dl"), store, revB, logger)

			const redisTimeout = 200 * time.Millisecond
			startCtx := ctx
			switch down {
			case "redis":
				rs.Pause()
				defer rs.Resume() // a paused server would hold up its cleanup
			case "etcd":
				link.Hang()
				defer link.Mend()
				// The start's history read gives up when the start's
				// context ends (the watcher's own bound is longer).
				var stop context.CancelFunc
				startCtx, stop = context.WithTimeout(ctx, 2*time.Second)
				defer stop()
			}
			d, err := regional.StartDaemon(startCtx, regional.DaemonOptions{
				Region: "eu", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RedisAddr: rs.Addr(),
				RedisTimeout: redisTimeout, Config: w, ColdStart: regional.ColdStartFull, Logger: logger,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Stop()
			staticRate := func() float64 {
				t.Helper()
				_, c, _, err := d.Server.CommonFor(w.Current(), restartKey)
				if err != nil {
					t.Fatal(err)
				}
				return c.StaticRate
			}
			// poll waits for cond until deadline, then fails with why().
			poll := func(deadline time.Time, cond func() bool, why func() string) {
				t.Helper()
				for !cond() {
					if time.Now().After(deadline) {
						t.Fatal(why())
					}
					time.Sleep(20 * time.Millisecond) // polling with a deadline from the test's bounds
				}
			}
			onStatic := func() bool { return strings.Contains(scrape(t, d), "sluice_regional_on_floor 0") }

			m := scrape(t, d)
			for _, want := range []string{
				"sluice_regional_chain_started_unconfirmed_total 1",
				"sluice_regional_chain_unconfirmed 1",
				"sluice_regional_chain_resumed_late_total 0",
			} {
				if !strings.Contains(m, want) {
					t.Errorf("at start, /metrics lacks %q", want)
				}
			}
			if want := "read again in the background until it answers"; !strings.Contains(logs.String(), want) {
				t.Errorf("the log lacks %q:\n%s", want, logs)
			}
			switch down {
			case "redis":
				rs.Resume()
			case "etcd":
				// Redis answers: the daemon runs B's share, unconfirmed.
				deadline, _ := ctx.Deadline()
				poll(deadline, onStatic, func() string { return "the daemon never read its static lease:\n" + logs.String() })
				if r := staticRate(); !near(r, 75) {
					t.Errorf("eu's static rate before etcd answers %v, want B's 75", r)
				}
				link.Mend()
			}

			// The next read comes at most the longest wait after the
			// component answers, and takes at most one bounded etcd read.
			epoch := time.Duration(w.Current().Epoch)
			deadline := time.Now().Add(time.Duration(regional.ResumeRetryMaxEpochsForTest+1)*epoch + 10*time.Second)
			poll(deadline, func() bool { return onStatic() && near(staticRate(), 50) }, func() string {
				return fmt.Sprintf("eu's static rate %v once %s answered; want A's 50 once it reads its region's history:\n%s", staticRate(), down, logs)
			})
			m = scrape(t, d)
			for _, want := range []string{
				"sluice_regional_chain_started_unconfirmed_total 1",
				"sluice_regional_chain_unconfirmed 0",
				"sluice_regional_chain_resumed_late_total 1",
			} {
				if !strings.Contains(m, want) {
					t.Errorf("after the late read, /metrics lacks %q", want)
				}
			}
			if want := "read the region's history late"; !strings.Contains(logs.String(), want) {
				t.Errorf("the log lacks %q:\n%s", want, logs)
			}
		})
	}
}
