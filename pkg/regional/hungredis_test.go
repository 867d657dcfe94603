package regional_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestHungRedisIsCountedByTheReadinessPing: a Redis that stops answering
// (SIGSTOP of the real redis-server) is a Redis error of script "ping"
// within a few readiness intervals, with no caller at all: callers that
// give up before Redis answers are not counted, so without it a hung Redis
// raised neither SluiceRedisErrors nor SluiceRegionalRedisDown. The
// replica turns not ready, logs the outage once, and logs and turns ready
// again when Redis answers. The daemon's RedisTimeout is also the server's
// bound on a batch (the server's own default was longer, so instances gave
// up first).
func TestHungRedisIsCountedByTheReadinessPing(t *testing.T) {
	// A redis-server and daemon of its own, and mostly waiting on
	// readiness intervals: it runs beside the package's other parallel tests.
	t.Parallel()
	rs := redistest.Start(t)
	reg := prometheus.NewRegistry()
	var logs logtest.Buffer
	// Neither the daemon's default (500 ms) nor the server's (1 s), so the
	// check below sees which one bounds a batch. Not shorter: a ping to a
	// Redis that answers took over 100 ms on a busy machine and counted as
	// failed (a make test beside a simulator loop).
	const redisTimeout = 800 * time.Millisecond
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RedisAddr: rs.Addr(),
		Config: regional.StaticConfig{C: regiontest.MustConfig(t, oneRegion)}, ColdStart: regional.ColdStartFull,
		Unleased: true, Registry: reg, RedisTimeout: redisTimeout,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	if got := regional.RedisTimeoutForTest(d.Server); got != redisTimeout {
		t.Errorf("the server bounds a batch by %v, want the daemon's RedisTimeout %v", got, redisTimeout)
	}
	pings := func() float64 {
		return metrictest.Series(t, reg, "sluice_regional_redis_errors_total", map[string]string{"script": "ping"})
	}
	// Many readiness intervals: a starved machine pings late.
	r := readiness{t: t, d: d, wait: 60 * (regional.ReadinessInterval + redisTimeout)}
	serving, waitFor := r.serving, r.waitFor
	waitFor("ready", serving)
	if n := pings(); n != 0 {
		t.Fatalf("%v failed pings counted against a Redis that answers", n)
	}

	rs.Pause()
	waitFor("two failed pings counted", func() bool { return pings() >= 2 })
	waitFor("not ready", func() bool { return !serving() })
	const down, up = "redis does not answer its readiness ping", "redis answers its readiness ping again"
	if n := logs.Count(down); n != 1 {
		t.Errorf("the outage logged %q %d times over two failed pings, want once", down, n)
	}
	rs.Resume()
	waitFor("ready again", serving)
	waitFor("recovery logged", func() bool { return logs.Count(up) == 1 })
	if n := logs.Count(down); n != 1 {
		t.Errorf("one outage logged %q %d times, want once", down, n)
	}
}

// TestReplicaOwnRedisFailuresAreCounted: the Redis calls a replica makes
// on its own count as Redis errors of their script when they fail: the
// restart sentinel check of every replica's Run ("sentinel") and the
// region leader's read of Redis TIME and the static lease ("time"). They
// were logged only, so a hung Redis seen by the leader alone raised no
// Redis alert.
func TestReplicaOwnRedisFailuresAreCounted(t *testing.T) {
	// Each case has a paused redis-server of its own and waits on its
	// timeouts: they run side by side, and beside the package's other
	// parallel tests.
	t.Parallel()
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		reg := prometheus.NewRegistry()
		g := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartFull, slog.New(slog.DiscardHandler))
		r := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local", func(o *regional.Options) {
			o.Guard = g
			o.Registerer = reg
			o.Logger = slog.New(slog.DiscardHandler)
		})
		const interval = 20 * time.Millisecond
		r.Redis.Pause()
		defer r.Redis.Resume()
		done := make(chan error, 1)
		go func() { done <- r.Server.Run(ctx, interval) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}()
		// A check against a Redis that does not answer ends at the
		// client's read timeout (redistest: 3 s): polled with a deadline of
		// many of them.
		wait := 20 * 3 * time.Second
		for deadline := time.Now().Add(wait); metrictest.Series(t, reg, "sluice_regional_redis_errors_total", map[string]string{"script": "sentinel"}) == 0; {
			if time.Now().After(deadline) {
				t.Fatalf("no failed sentinel check counted within %v of Run against a paused Redis", wait)
			}
			time.Sleep(interval) // polling the counter with a deadline
		}
	})
	t.Run("time", func(t *testing.T) {
		t.Parallel()
		r := newLeaseRig(t)
		r.rs.Pause()
		defer r.rs.Resume()
		if err := r.leader.SyncOnce(context.Background(), nil); err == nil {
			t.Fatal("a sync against a paused Redis succeeded")
		}
		if n := metrictest.Series(t, r.reg, "sluice_regional_redis_errors_total", map[string]string{"script": "time"}); n != 1 {
			t.Errorf("a leader's sync that could not read Redis TIME counted %v Redis errors of script time, want 1", n)
		}
	})
}
