package regional_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestGlobalOutagesAreLoggedOnceWhenTheyStartAndEnd: a region leader whose
// syncs with the global tier fail every epoch (the tier cut off, then no
// global leader elected) logs each outage once when it starts and once
// when it ends, with how long it lasted and how often it was seen, as the
// other outages are; each repetition goes to DEBUG. The sync failure was a
// WARN every epoch, and the static lease extension by the etcd rule an
// INFO at every failed sync.
func TestGlobalOutagesAreLoggedOnceWhenTheyStartAndEnd(t *testing.T) {
	ctx := context.Background()
	cfg := leaseConfig(t)
	o := startOutageLeader(t, cfg, false)
	cli, d, logs, reg, tier := o.cli, o.d, o.logs, o.reg, o.tier

	// Every wait is for rounds the leader runs one an epoch: 200 epochs
	// leave room for a starved machine.
	patience := 200 * time.Duration(cfg.Epoch)
	syncs := func(result string) float64 {
		return metrictest.Series(t, reg, "sluice_regional_global_syncs_total", map[string]string{"result": result})
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(patience); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v\n%s", what, patience, logs.String())
			}
			time.Sleep(time.Duration(cfg.Epoch) / 5) // polling the leader's rounds with a deadline
		}
	}
	const (
		failed      = `msg="region sync with the global tier failed; running on current grants`
		failedAgain = `msg="region sync with the global tier failed again"`
		syncBack    = `msg="region sync with the global tier succeeds again"`
		extended    = `msg="no global leader elected: static lease extended (at each failed sync`
		extAgain    = `msg="no global leader elected: static lease extended again"`
		extOver     = `msg="static lease no longer extended by the etcd rule: a global leader is elected"`
	)
	// count is how many times msg was logged since mark (a length of the
	// log): a round that outlived its epoch on a starved machine may have
	// begun an outage of its own before the test's, and ended it.
	count := func(mark int, msg string) int { return strings.Count(logs.String()[mark:], msg) }
	waitFor("a first sync", func() bool { return syncs("ok") >= 1 })
	// rounds waits for n more rounds ending in result.
	rounds := func(result string, n float64) {
		t.Helper()
		from := syncs(result)
		waitFor(fmt.Sprintf("%v more rounds ending %s", n, result), func() bool { return syncs(result) >= from+n })
	}

	// The tier cut off: a failed sync every epoch, at most one WARN (none
	// when a starved round began the outage just before).
	mark := len(logs.String())
	tier.cut.Store(true)
	rounds("error", 4) // the last one may not have logged yet
	if n, again := count(mark, failed), count(mark, failedAgain); n > 1 || again < 2 {
		t.Errorf("4 failed rounds logged %d WARN and %d DEBUG lines, want at most 1 and the others at DEBUG\n%s", n, again, logs.String())
	}
	tier.cut.Store(false)
	waitFor("the end of the outage logged", func() bool { return count(mark, syncBack) >= 1 })

	// No global leader elected: every failed sync extends the static
	// lease, one INFO; a candidate's key in the election ends it.
	mark = len(logs.String())
	d.Stop() // resigns: the election is empty
	// The last round may not have read the election yet.
	rounds("error", 3)
	if n, again := count(mark, extended), count(mark, extAgain); n != 1 || again < 1 {
		t.Errorf("extensions at 3 failed rounds logged %d INFO and %d DEBUG lines, want 1 and the others at DEBUG\n%s", n, again, logs.String())
	}
	if n := count(mark, failed); n > 1 {
		t.Errorf("3 failed rounds logged %d WARN lines, want at most 1\n%s", n, logs.String())
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := concurrency.NewElection(sess, "/sl/election/global").Campaign(ctx, "unreachable"); err != nil {
		t.Fatal(err)
	}
	rounds("error", 2) // the first read the election after the campaign, and logged before the second
	if n, m := count(mark, extOver), count(mark, extended); n != 1 || m != 1 {
		t.Errorf("the extensions' end logged %d times and their start %d, want 1 and 1\n%s", n, m, logs.String())
	}
}

// TestAnOutageOpenWhenTheTermEndsIsClosedInTheLog: the WARN that starts a
// sync outage promises a line when a sync succeeds again; a leader whose
// term ends first (its etcd session gone) says the outage was still under
// way when it stopped leading, once, instead of leaving the promise open,
// and its next term logs an outage it finds afresh.
func TestAnOutageOpenWhenTheTermEndsIsClosedInTheLog(t *testing.T) {
	ctx := context.Background()
	cfg := leaseConfig(t)
	o := startOutageLeader(t, cfg, true)
	cli, logs := o.cli, o.logs

	patience := 200 * time.Duration(cfg.Epoch)
	const (
		failed  = `msg="region sync with the global tier failed; running on current grants`
		stopped = `msg="region sync with the global tier still failing when this replica stopped leading`
		elected = `msg="region leader elected"`
	)
	waitLog := func(msg string, n int) {
		t.Helper()
		for deadline := time.Now().Add(patience); strings.Count(logs.String(), msg) < n; {
			if time.Now().After(deadline) {
				t.Fatalf("%d lines %s: not within %v\n%s", n, msg, patience, logs.String())
			}
			time.Sleep(time.Duration(cfg.Epoch) / 5) // polling the leader's rounds with a deadline
		}
	}
	waitLog(failed, 1)
	// End the term: revoke the leader's session lease.
	resp, err := cli.Get(ctx, "/sl/election/region/eu", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the region's election: %v (%v), want one key", resp, err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	waitLog(stopped, 1)
	waitLog(elected, 2)
	waitLog(failed, 2) // the new term's outage, logged afresh
	if n := strings.Count(logs.String(), stopped); n != 1 {
		t.Errorf("the end of the first term logged %d times, want once\n%s", n, logs.String())
	}
}

// outageLeader is a region leader of region eu on real etcd and Redis,
// syncing with a leading allocator through a tier the test can cut, its
// log at debug: startOutageLeader's result.
type outageLeader struct {
	cli  *clientv3.Client
	d    *allocator.Daemon
	logs *logtest.Buffer
	reg  *prometheus.Registry
	tier *tierSwitch
	// redis is the region's Redis.
	redis *redistest.Server
}

// startOutageLeader starts an outageLeader under cfg, its tier cut from
// the start when cut; it stops with the test.
func startOutageLeader(t *testing.T, cfg *config.Config, cut bool) outageLeader {
	t.Helper()
	ctx := context.Background()
	cli := etcdtest.Start(t).Client(t)
	d := startLeadingAllocator(ctx, t, cli, "/sl", configtest.NewSource(cfg, 1))
	rs := redistest.Start(t)
	logs := &logtest.Buffer{}
	reg := prometheus.NewRegistry()
	srv, err := regional.New(regional.Options{Region: "eu", Redis: rs.Client(), Config: regional.StaticConfig{C: cfg}, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	tier := &tierSwitch{inner: serviceTier{d.Service}}
	tier.cut.Store(cut)
	l, err := regional.NewLeader(srv, regional.LeaderOptions{Etcd: cli, ElectionPrefix: "/sl/election/", Global: tier, Identity: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return outageLeader{cli: cli, d: d, logs: logs, reg: reg, tier: tier, redis: rs}
}

// TestASyncNotSentForTheRegionsRedisSaysSo: a round that fails on the
// region's own Redis (its clock, candidates and key states are read
// before a report leaves) is logged as such, not as the global tier
// failing (an empty Redis restart read as a global outage in the log of
// real processes), and its end as any sync outage's. The Redis is stopped
// (refused at once) and started again empty.
func TestASyncNotSentForTheRegionsRedisSaysSo(t *testing.T) {
	cfg := leaseConfig(t)
	o := startOutageLeader(t, cfg, false)
	patience := 200 * time.Duration(cfg.Epoch)
	const (
		notSent = `msg="region sync with the global tier not sent: this region's Redis fails`
		failed  = `msg="region sync with the global tier failed`
		back    = `msg="region sync with the global tier succeeds again"`
	)
	waitLog := func(msg string) {
		t.Helper()
		for deadline := time.Now().Add(patience); !strings.Contains(o.logs.String(), msg); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v\n%s", msg, patience, o.logs.String())
			}
			time.Sleep(time.Duration(cfg.Epoch) / 5) // polling the leader's rounds with a deadline
		}
	}
	syncs := func() float64 {
		return metrictest.Series(t, o.reg, "sluice_regional_global_syncs_total", map[string]string{"result": "ok"})
	}
	for deadline := time.Now().Add(patience); syncs() < 1; {
		if time.Now().After(deadline) {
			t.Fatalf("no sync within %v\n%s", patience, o.logs.String())
		}
		time.Sleep(time.Duration(cfg.Epoch) / 5)
	}
	o.redis.Stop()
	waitLog(notSent)
	o.redis.Restart()
	waitLog(back)
	if strings.Contains(o.logs.String(), failed) {
		t.Errorf("the region's Redis paused: logged as the global tier failing\n%s", o.logs.String())
	}
}
